"""Reading a run log from its end: lines in reverse, the newest segment's header, the
chain of segments. Standard library only (the writer uses it at attach time).

Every `interval` / `total` line carries `header_at`, the byte offset of its segment's
header, and every header carries `prev_header_at`, the previous segment's. So the newest
header is found by reading back to the newest per-unit line (at most one interval of step
lines), and older segments by following the chain: never by reading the whole file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import BinaryIO

CHUNK = 1 << 16
# The longest line read: far above any record zerodoc writes (a header with a hundred thousand
# units is a few MB); a longer line is not read into memory but yielded as OVERLONG, which
# no reader parses (each counts it as a bad line).
MAX_LINE = 64 << 20
OVERLONG = b"<zerodoc: overlong line skipped>"
_HEADER_AT = re.compile(rb'"header_at":(\d+)')


def reverse_lines(f: BinaryIO, end: int, start: int = 0, chunk: int = CHUNK,
                  max_line: int = MAX_LINE) -> Iterator[tuple[int, bytes]]:
    """(offset, line without its newline) from `end` back to `start`, newest first. A last
    line without a newline (torn: a writer killed mid-line) is yielded as it is; a line
    longer than `max_line` as OVERLONG. Linear in the bytes read, whatever the line
    lengths; holds at most one chunk and one line of at most `max_line` bytes."""
    pos = end
    parts: list[bytes] = []  # pieces of the line that continues before `pos`, newest first
    plen = 0
    over = False  # that line is already longer than max_line: its pieces are not kept
    while pos > start:
        n = min(chunk, pos - start)
        pos -= n
        f.seek(pos)
        buf = f.read(n)
        first_nl = buf.find(b"\n")
        if first_nl < 0:  # the whole chunk is inside one line
            plen += n
            if not over:
                parts.append(buf)
                if plen > max_line:
                    over, parts = True, []
            continue
        # lines that end in this chunk, newest first: buf[last newline + 1:] + parts first
        pieces = buf[first_nl + 1:].split(b"\n")
        offs = []
        off = pos + first_nl + 1
        for p in pieces:
            offs.append(off)
            off += len(p) + 1
        for i in range(len(pieces) - 1, -1, -1):
            line = pieces[i]
            if i == len(pieces) - 1 and (parts or over):
                if over or plen + len(line) > max_line:
                    line = OVERLONG
                else:
                    parts.append(line)
                    line = b"".join(reversed(parts))
            elif len(line) > max_line:
                line = OVERLONG
            if line:
                yield offs[i], line
        head = buf[:first_nl]  # continues in the chunk before
        parts, plen, over = [head], len(head), len(head) > max_line
        if over:
            parts = []
    if parts or over:
        line = OVERLONG if over else b"".join(reversed(parts))
        if line:
            yield start, line


def forward_lines(f: BinaryIO, pos: int, size: int,
                  max_bytes: int = MAX_LINE) -> tuple[list[bytes], int, int]:
    """The complete lines from `pos` (reading at most `max_bytes` of the `size` bytes):
    (lines, offset after the last of them, overlong lines skipped). A line longer than
    `max_bytes` is skipped whole once its newline is there, never held in memory."""
    f.seek(pos)
    chunk = f.read(min(size - pos, max_bytes))
    end = chunk.rfind(b"\n")
    if end >= 0:
        return chunk[:end].split(b"\n"), pos + end + 1, 0
    if len(chunk) < max_bytes:
        return [], pos, 0  # a line still being written: next time
    p = pos + len(chunk)
    while p < size:  # an overlong line: find its end without keeping it
        buf = f.read(min(CHUNK * 16, size - p))
        if not buf:
            break
        i = buf.find(b"\n")
        if i >= 0:
            return [], p + i + 1, 1
        p += len(buf)
    return [], pos, 0


def kind_of(line: bytes) -> str | None:
    """The record type of a line without parsing it all (the writer puts "type" first)."""
    if line.startswith(b'{"type":"'):
        end = line.find(b'"', 9)
        if end > 0:
            return line[9:end].decode("ascii", "replace")
    if line.startswith(b"{"):  # another writer's spacing: parse
        try:
            d = json.loads(line)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None
        return d.get("type") if isinstance(d, dict) else None
    return None


_UNITS: dict[bytes, list] = {}


def loads_header(line: bytes) -> dict:
    """json.loads of a header line; its `units` list (most of its bytes, the same on every
    rank of a run) is parsed once per distinct text and shared."""
    i = line.find(b'"units":[')
    j = line.find(b"}]", i) + 2 if i >= 0 and line[i + 9:i + 10] == b"{" else -1
    if j > 1:
        raw = line[i + 8:j]
        units = _UNITS.get(raw)
        try:
            d = json.loads(line[:i] + b'"units":[]' + line[j:])
            if units is None:
                units = json.loads(raw)
                if len(_UNITS) > 256:
                    _UNITS.clear()
                _UNITS[raw] = units
        except (ValueError, UnicodeDecodeError, RecursionError):
            return json.loads(line)
        if isinstance(d, dict) and isinstance(units, list):
            d["units"] = units
            return d
    return json.loads(line)


def header_at(f: BinaryIO, offset: int) -> dict | None:
    """The header dict at `offset`, or None when that is not a header line."""
    f.seek(offset)
    line = f.readline(MAX_LINE)
    if kind_of(line.rstrip(b"\n")) != "header":
        return None
    try:
        d = loads_header(line)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return d if isinstance(d, dict) else None


def newest_head(f: BinaryIO, end: int, start: int = 0) -> tuple[int, dict] | None:
    """(offset, header dict) of the newest segment that starts in [start, end)."""
    for off, line in reverse_lines(f, end, start):
        kind = kind_of(line)
        if kind == "header":
            h = header_at(f, off)
            if h is not None:
                return off, h
        elif kind in ("interval", "total"):
            m = _HEADER_AT.search(line, 0, 400)  # written near the start: no full parse
            at = int(m.group(1)) if m else None
            if at is not None and start <= at < end:
                h = header_at(f, at)
                if h is not None:
                    return at, h
    return None


def segment_heads(f: BinaryIO, end: int) -> list[tuple[int, dict]]:
    """Every segment's (header offset, header), oldest first."""
    out: list[tuple[int, dict]] = []
    head = newest_head(f, end)
    while head is not None:
        out.append(head)
        off, h = head
        prev = h.get("prev_header_at")
        if isinstance(prev, int) and 0 <= prev < off:
            h2 = header_at(f, prev)
            head = (prev, h2) if h2 is not None else newest_head(f, off)
        elif off > 0:
            head = newest_head(f, off)  # schema 1, or a chain that does not say
        else:
            head = None
    out.reverse()
    return out
