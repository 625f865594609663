"""Run CMD as this process's child and write the child's own peak RSS (KiB) to FILE:

    python tests/support/jobs/own_rss.py FILE CMD [ARG ...]

A command exec'd straight from pytest would report pytest's peak instead: the kernel carries
the forking process's high-water RSS into the child's ru_maxrss at exec (vfork shares the
memory map). Late in a full run that made every report measure 508.7 MB, pytest's own size.
This process is small, so its child's figure is the child's. Exits with CMD's status. Used
by tests/test_hostile_files.py."""

from __future__ import annotations

import os
import subprocess
import sys


def main() -> int:
    p = subprocess.Popen(sys.argv[2:])
    _, status, usage = os.wait4(p.pid, 0)
    with open(sys.argv[1], "w") as f:
        f.write(str(usage.ru_maxrss))
    return os.waitstatus_to_exitcode(status) & 0xFF


if __name__ == "__main__":
    sys.exit(main())
