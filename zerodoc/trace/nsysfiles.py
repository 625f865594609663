"""Which files a SOURCE names as Nsight Systems SQLite exports (standard library only: the
command line asks this of every SOURCE before anything heavy is imported; the reader is
`nsys.py`)."""

from __future__ import annotations

import os
from pathlib import Path

NSYS_SUFFIXES = (".sqlite", ".sqlite3")


def is_nsys_file(path: Path) -> bool:
    return path.is_file() and path.name.endswith(NSYS_SUFFIXES)


def nsys_files(spec: str | os.PathLike | list) -> list[Path]:
    """The exports a SOURCE names: a file, a comma-separated list, or a folder's `*.sqlite`
    ([] when it names none)."""
    if isinstance(spec, (list, tuple)):
        parts = [Path(p) for p in spec]
    else:
        parts = [Path(p.strip()) for p in str(spec).split(",")]
    out: list[Path] = []
    for p in parts:
        if p.is_dir():
            out += sorted(q for q in p.iterdir() if is_nsys_file(q))
        elif p.name.endswith(NSYS_SUFFIXES):
            out.append(p)
    return out


def is_nsys_spec(spec: str) -> bool:
    """Whether a command-line SOURCE names Nsight Systems exports: `.sqlite` files, or a
    folder holding them and no zerodoc run logs."""
    parts = [p.strip() for p in spec.split(",")]
    if all(p.endswith(NSYS_SUFFIXES) for p in parts):
        return True
    d = Path(parts[0])
    try:
        return len(parts) == 1 and d.is_dir() and not any(d.glob("rank-*.jsonl")) and \
            any(is_nsys_file(q) for q in d.iterdir())
    except OSError:
        return False  # unreadable: the run-directory path says why
