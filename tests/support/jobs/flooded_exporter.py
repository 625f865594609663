"""A /metrics server in a process of 64 file descriptors, opening files on request.

    python tests/support/jobs/flooded_exporter.py DIR

Prints its port, then for each line read on stdin opens (creates/appends) a file in DIR, as
the run log does for a segment, and prints `ok` or `error ERRNO`. Used by
tests/test_exporter_load.py: connections held open against the server must not take the
descriptors the rank needs for its files.
"""

from __future__ import annotations

import os
import resource
import sys


def main() -> None:
    directory = sys.argv[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    from prometheus_client import CollectorRegistry

    from zerodoc.exporter import limits, server

    srv = server.start("127.0.0.1", 0, CollectorRegistry(),
                       limits=limits.Limits(max_connections=16, request_deadline_s=60))
    print(srv.server_address[1], flush=True)
    for line in sys.stdin:  # each line: open a new file, as the run log does for a segment
        try:
            fd = os.open(os.path.join(directory, "segment-%d" % len(line)),
                         os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.write(fd, b"{}\n")
            os.close(fd)
            print("ok", flush=True)
        except OSError as e:
            print("error", e.errno, flush=True)


if __name__ == "__main__":
    main()
