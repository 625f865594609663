"""Run a rank under a parent that does not reap its orphans, as a container's PID 1:

    python tests/support/jobs/subreaper.py CMD [ARG ...]

Becomes a child subreaper (PR_SET_CHILD_SUBREAPER: orphans of its descendants come to it, and
it never waits for them), runs CMD, reads the pid printed first on CMD's stdout (the rank's
sidecar, `tests/support/jobs/sidecar_faults.py exit`) and prints that process's state within
10 s of CMD's exit: `gone` (reaped by zerodoc) or `Z` (a zombie: `zd-sidecar <defunct>`).
Used by tests/test_sidecar_faults.py."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def main(cmd: list[str]) -> int:
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    rank = subprocess.run(cmd, capture_output=True, text=True)
    pid = int(rank.stdout.split()[0])
    deadline = time.monotonic() + 10
    state = "?"
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            state = "gone"
            break
        if state == "Z":
            break
        time.sleep(0.02)  # polling a process's state: no event to wait on
    print(state)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
