"""A rank that serves /metrics from a sidecar process (zerodoc/exporter/sidecar.py).

    python tests/support/jobs/sidecar_rank.py WEB_CONFIG

Prints `PORT SIDECAR_PID`, then waits to be killed. Used by tests/test_exporter_sidecar.py:
the sidecar must exit with its rank and free the port.
"""

from __future__ import annotations

import sys
import threading


def main() -> None:
    from prometheus_client import CollectorRegistry, Gauge

    from zerodoc.exporter import sidecar, webconfig
    from zerodoc.exporter.page import Page

    reg = CollectorRegistry()
    Gauge("zerodoc_test_value", "A test gauge.", registry=reg).set(1)
    srv = sidecar.SidecarServer("127.0.0.1", 0, Page(reg), 2, webconfig.load(sys.argv[1]))
    srv.start()
    print(srv.server_address[1], srv.proc.pid, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
