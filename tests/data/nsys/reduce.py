"""Make the small copies of nsys-ai's test exports kept here (see README.md in this folder).

    python tests/data/nsys/reduce.py SOURCE.sqlite OUT.sqlite

Every table is kept with its schema (the reader's schema check sees the export as nsys wrote
it); rows are kept of what zerodoc reads (kernels, memory copies and sets, CUDA runtime calls,
NVTX ranges, StringIds) and of the export's metadata, and dropped from the rest (enum tables,
capture metadata, thread and process names, synchronization and overhead records). NVTX ranges
of single ATen operators (`aten::...`, autograd-nvtx) are dropped too: zerodoc keeps none of
them on a GPU capture and they are most of the file. Nothing else is changed: the kept rows are
the export's, byte for byte.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

KEEP_ROWS = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
             "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS",
             "StringIds", "META_DATA_EXPORT", "TARGET_INFO_SESSION_START_TIME",
             "TARGET_INFO_GPU", "TARGET_INFO_CUDA_DEVICE")
WHERE = {"NVTX_EVENTS": "coalesce(text, '') NOT LIKE 'aten::%'"}


def reduce(src: Path, out: Path) -> None:
    if out.exists():
        out.unlink()
    con = sqlite3.connect(str(out))
    con.execute("ATTACH DATABASE ? AS src", (f"file:{src}?mode=ro",))
    for name, sql in con.execute("SELECT name, sql FROM src.sqlite_master WHERE type = 'table' "
                                 "AND name NOT LIKE 'sqlite_%'").fetchall():
        con.execute(sql)
        if name in KEEP_ROWS:
            where = f" WHERE {WHERE[name]}" if name in WHERE else ""
            con.execute(f'INSERT INTO main."{name}" SELECT * FROM src."{name}"{where}')
    con.commit()
    con.execute("DETACH DATABASE src")
    con.execute("VACUUM")
    con.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    reduce(Path(sys.argv[1]), Path(sys.argv[2]))
