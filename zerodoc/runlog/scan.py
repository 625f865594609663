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
_HEADER_AT = re.compile(rb'"header_at":(\d+)')


def reverse_lines(f: BinaryIO, end: int, start: int = 0,
                  chunk: int = CHUNK) -> Iterator[tuple[int, bytes]]:
    """(offset, line without its newline) from `end` back to `start`, newest first. A last
    line without a newline (torn: a writer killed mid-line) is yielded as it is."""
    pos = end
    tail = b""
    while pos > start:
        n = min(chunk, pos - start)
        pos -= n
        f.seek(pos)
        buf = f.read(n) + tail
        lines = buf.split(b"\n")
        tail = lines[0]  # may continue in the previous chunk
        off = pos + len(tail) + 1
        rest = []
        for line in lines[1:]:
            rest.append((off, line))
            off += len(line) + 1
        for off_, line in reversed(rest):
            if line:
                yield off_, line
    if tail:
        yield start, tail


def kind_of(line: bytes) -> str | None:
    """The record type of a line without parsing it all (the writer puts "type" first)."""
    if line.startswith(b'{"type":"'):
        end = line.find(b'"', 9)
        if end > 0:
            return line[9:end].decode("ascii", "replace")
    if line.startswith(b"{"):  # another writer's spacing: parse
        try:
            d = json.loads(line)
        except (ValueError, UnicodeDecodeError):
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
        except (ValueError, UnicodeDecodeError):
            return json.loads(line)
        if isinstance(d, dict) and isinstance(units, list):
            d["units"] = units
            return d
    return json.loads(line)


def header_at(f: BinaryIO, offset: int) -> dict | None:
    """The header dict at `offset`, or None when that is not a header line."""
    f.seek(offset)
    line = f.readline()
    if kind_of(line.rstrip(b"\n")) != "header":
        return None
    try:
        d = loads_header(line)
    except (ValueError, UnicodeDecodeError):
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
