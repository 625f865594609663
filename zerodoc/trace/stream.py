"""Stream-parse one Chrome-trace JSON file (a PyTorch profiler / Kineto trace), gzipped or not.

`read_trace(path, on_event)` calls `on_event(event_dict)` for every element of `traceEvents`
and returns the other top-level keys (`distributedInfo`, `deviceProperties`, ...). Only one
event is a Python object at a time and the text buffer holds a few MiB, so a 2 GB trace is read
in bounded memory (what the caller keeps of the events is up to the caller). A file that is a
bare JSON array of events (also valid Chrome-trace JSON) works too.

Progress goes to `progress(done_bytes, total_bytes)` (bytes of the file on disk, compressed for
.gz) about once a second. Bad input raises `TraceError` with the file name and byte offset.
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import UserError

CHUNK_BYTES = 4 << 20  # read size
MAX_EVENT_CHARS = 64 << 20  # one event larger than this is taken as a malformed file
# A gzip file that expands more than this many times its size, past BOMB_AFTER bytes, is not
# a profiler trace (those compress 5-30x) but a decompression bomb: refused before it
# expands to gigabytes. MAX_UNPACKED bounds any trace file.
BOMB_RATIO = 200
BOMB_AFTER = 16 << 20
MAX_UNPACKED = 64 << 30
_SKIP = re.compile(r"[\s,]*")
_WS = re.compile(r"\s*")


class TraceError(UserError):
    """A trace file that cannot be read; the message says which file and why."""


class _Reader:
    """Text buffer over a (possibly gzipped) file, refilled in chunks."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.raw = open(path, "rb")
        except OSError as e:
            raise TraceError(f"cannot read trace {path}: {e.strerror or e}") from None
        self.total = os.fstat(self.raw.fileno()).st_size
        magic = self.raw.read(2)
        self.raw.seek(0)
        self.stream = gzip.GzipFile(fileobj=self.raw, mode="rb") if magic == b"\x1f\x8b" \
            else self.raw
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.consumed = 0  # characters dropped from the front of buf
        self.gzip = self.stream is not self.raw
        self.unpacked = 0  # bytes read from the (decompressed) stream
        self.fast = True  # batch() still worth trying

    def close(self) -> None:
        self.raw.close()

    def fill(self) -> bool:
        """Append one chunk; False at end of file."""
        if self.eof:
            return False
        try:
            data = self.stream.read(CHUNK_BYTES)
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            raise TraceError(f"{self.path}: cannot decompress ({e})") from None
        self.unpacked += len(data)
        if self.unpacked > MAX_UNPACKED or (
                self.gzip and self.unpacked > BOMB_AFTER
                and self.unpacked > BOMB_RATIO * max(1, self.bytes_read())):
            raise TraceError(
                f"{self.path}: expands to over {self.unpacked / 1e6:,.0f} MB from "
                f"{self.bytes_read() / 1e6:,.2f} MB" + (" compressed (over "
                f"{BOMB_RATIO}x: not a profiler trace, a decompression bomb?)"
                if self.gzip else "") + "; refused")
        if not data:
            self.eof = True
            self.buf += self.decoder.decode(b"", final=True)
            return False
        if self.pos > CHUNK_BYTES:  # drop what was parsed already
            self.consumed += self.pos
            self.buf = self.buf[self.pos:]
            self.pos = 0
        self.buf += self.decoder.decode(data)
        return True

    def bytes_read(self) -> int:
        try:
            return self.raw.tell()
        except (OSError, ValueError):
            return 0

    def skip(self, pattern=_WS) -> str:
        """Skip whitespace (and commas with `_SKIP`); the next character ('' at the end)."""
        while True:
            self.pos = pattern.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.fill():
                return ""

    def batch(self, loads=json.loads) -> list | None:
        """Fast path: the complete events from here to the last line that closes one at
        Kineto's indentation ("\\n  }"), decoded in one call; None where that does not
        apply (other writers' layouts fall back to one event at a time)."""
        if not self.fast:
            return None
        if len(self.buf) - self.pos < CHUNK_BYTES and not self.eof:
            self.fill()
        end = self.buf.rfind("\n  }", self.pos)
        if end < 0:
            self.fast = False  # not Kineto's layout (or one huge event): stop looking
            return None
        try:
            out = loads("[" + self.buf[self.pos:end + 4] + "]")
        except (json.JSONDecodeError, RecursionError):
            self.fast = False
            return None
        self.pos = end + 4
        return out

    def expect(self, ch: str) -> None:
        got = self.skip()
        if got != ch:
            self.fail(f"expected {ch!r}, found {got or 'end of file'!r}")
        self.pos += 1

    def value(self, decode=json.JSONDecoder().raw_decode):
        """Decode one JSON value at the current position, reading more as needed."""
        while True:
            try:
                obj, end = decode(self.buf, self.pos)
                if end < len(self.buf) or self.eof:
                    self.pos = end
                    return obj
                # a number could continue in the next chunk: read one more and decode again
            except json.JSONDecodeError as e:
                if self.eof or len(self.buf) - self.pos > MAX_EVENT_CHARS:
                    self.fail(f"not valid JSON ({e.msg})", self.pos)
            except RecursionError:
                self.fail("JSON nested too deeply", self.pos)
            self.fill()

    def fail(self, why: str, at: int | None = None):
        where = self.consumed + (self.pos if at is None else at)
        raise TraceError(f"{self.path}: {why} at character {where}; is it a PyTorch "
                         "profiler trace (Chrome-trace JSON)?")


def read_trace(path: str | os.PathLike, on_event: Callable[[dict], None], *,
               progress: Callable[[int, int], None] | None = None,
               progress_every_s: float = 1.0) -> dict:
    """Feed every event of `path` to `on_event`; return the top-level keys besides
    `traceEvents`. Raises TraceError on a file that is not Chrome-trace JSON."""
    r = _Reader(Path(path))
    header: dict = {}
    next_report = time.monotonic() + progress_every_s
    events = 0
    saw_events = False

    def stream_events() -> None:
        nonlocal next_report, events
        while True:
            ch = r.skip(_SKIP)
            if ch == "]":
                r.pos += 1
                return
            if ch != "{":
                r.fail(f"expected an event object, found {ch or 'end of file'!r}")
            batch = r.batch()
            if batch is None:
                batch = (r.value(),)
            for ev in batch:
                on_event(ev)
            events += len(batch)
            if progress is not None and time.monotonic() >= next_report:
                progress(r.bytes_read(), r.total)
                next_report = time.monotonic() + progress_every_s

    try:
        first = r.skip()
        if first == "[":
            r.pos += 1
            stream_events()
        elif first == "{":
            r.pos += 1
            while True:
                ch = r.skip(_SKIP)
                if ch == "}":
                    break
                if ch != '"':
                    r.fail(f"expected a key, found {ch or 'end of file'!r}")
                key = r.value()
                r.expect(":")
                if key == "traceEvents":
                    r.expect("[")
                    saw_events = True
                    stream_events()
                else:
                    r.skip()
                    header[key] = r.value()
            if not saw_events:
                raise TraceError(f"{path}: JSON without \"traceEvents\": not a PyTorch "
                                 "profiler trace")
        elif first == "":
            raise TraceError(f"{path}: empty file")
        else:
            r.fail("not JSON")
    finally:
        r.close()
    if progress is not None:
        progress(r.total, r.total)
    header["_events"] = events
    return header
