"""The /metrics HTTP server of one rank: port choice, TLS, client certificates, basic auth.

`serve(monitor, base_port, host)` starts it on a daemon thread. Each rank serves its own port
(base + LOCAL_RANK); a port in use falls back to the next free one (stepping by the local
world size so ranks don't collide), then to any free port, and only then to none, with a
warning, never an exception.

Off loopback (Kubernetes, multi-node jobs bind `0.0.0.0`) the scrape should be protected the
way Prometheus exporters protect it: `$ZERODOC_WEB_CONFIG_FILE` names an exporter-toolkit web
configuration (`webconfig.py`) with TLS (optionally requiring client certificates from a CA)
and/or basic-auth users with bcrypt or PBKDF2 hashes. Settings come from that file only, never
from code. A broken file means no /metrics server (never an unprotected one) and a warning;
a rank bound off loopback with neither TLS nor auth gets a warning. The TLS files are reloaded
when they change on disk (certificate rotation), and the TLS handshake runs on the request's
own thread (in the sidecar: a step per wake-up), so a slow or hostile client cannot stall
the others.

Whatever the configuration, what clients can take from the training process is bounded
(`limits.py`, docs/reliability.md): at most `Limits.max_connections` connections at once (one
more is answered 503 from the accepting thread, its request unread), a plain-HTTP request that
arrived whole answered on the accepting thread itself (`fastpath.py`: an epoll loop, prebuilt
answers, no thread switch), the rest on a pool of worker threads under a whole-request
deadline, the page rendered at most once per `PAGE_MAX_AGE_S` unless the
collector's stamp changed (`page.py`), password verdicts remembered and failed logins
rate-limited (`webconfig.Authenticator`); how it answered and what it cost are served on
`OWN_PATH`. With basic auth or TLS the connections are served by a sidecar process per
rank instead (`sidecar.py`; `$ZERODOC_EXPORTER_SIDECAR` forces it on or off).
"""

from __future__ import annotations

import errno
import io
import ipaddress
import os
import socket
import ssl
import sys
import threading
import warnings
import weakref
from http.server import HTTPServer

from .prometheus import (  # first: it configures prometheus_client  # isort: skip
    ServerCollector, ZerodocCollector,
)
from prometheus_client import CollectorRegistry  # noqa: E402

from . import sidecar, webconfig  # noqa: E402
from .fastpath import (  # noqa: E402
    NOT_HTTP, READ_MAX, SEND_FLAGS, Handoff, Loop, canned, defer_accept, looks_like_http,
    parse_head, response_head,
)
from .limits import (  # noqa: E402
    LIMITED_RESPONSE, Deadlines, Limits, Stats, Workers, error_outcome, name_thread, refuse,
)
from .page import Page, PageHandler  # noqa: E402
from .webconfig import Authenticator, WebConfig, WebConfigError  # noqa: E402

PORT_TRIES = 8
HANDSHAKE_TIMEOUT_S = 10.0
PAGE_MAX_AGE_S = 1.0  # a page is rendered at most once a second (sooner at a step end)
OWN_PATH = "/metrics/exporter"  # the server's own counters (outside the series budget)


class _Handler(PageHandler):
    timeout = HANDSHAKE_TIMEOUT_S  # per receive; a whole request has Limits.request_deadline_s
    server: "MetricsServer"

    def do_GET(self) -> None:  # noqa: N802
        verdict = self.server.authorize(self.headers.get("Authorization"),
                                        self.client_address[0], self.request.fileno())
        if verdict == "unauthorized":
            self._refuse(401, "401 Unauthorized\n", ("WWW-Authenticate", 'Basic realm="zerodoc"'))
        elif verdict == "rate_limited":  # answered without a password check
            self._refuse(429, "429 Too Many Requests: too many failed logins\n",
                         ("Retry-After", str(int(webconfig.FAIL_WINDOW_S))))
        elif self.path.partition("?")[0] == OWN_PATH and self.server.own_page is not None:
            self.serve_page(self.server.own_page)  # the server's own counters
        else:
            super().do_GET()
            seen = getattr(self.server, "on_scraped", None)
            if seen is not None:  # the page is out: who scraped (exporter/closing.py)
                seen((self.client_address[0], self.headers.get("User-Agent", "")))
        self.server.stats.count(verdict)

    def setup(self) -> None:
        super().setup()
        prefix = self.server.prefixes.pop(self.request.fileno(), None)
        if prefix is not None:  # the accepting loop read these bytes already (fastpath.py)
            self.rfile = io.BufferedReader(Handoff(prefix, self.connection))

    def send_error(self, code: int, message=None, explain=None) -> None:
        """The standard library's error answer (400, 414, 431, 501: a request not parsed),
        counted: every answer is (`zerodoc_exporter_requests_total`)."""
        super().send_error(code, message, explain)
        self.server.stats.count(error_outcome(code))

    def _refuse(self, code: int, text: str, header: tuple[str, str]) -> None:
        self.send_response(code)
        self.send_header(*header)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        body = text.encode()
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def end_headers(self) -> None:
        for k, v in self.server.extra_headers.items():
            self.send_header(k, v)
        super().end_headers()


class MetricsServer(HTTPServer):
    """An HTTP(S) server for one registry, with the web configuration's protections and the
    limits of `limits.py` (connection cap answered 503, whole-request deadline, a pool of
    worker threads, its own requests and CPU counted), served by `fastpath.Loop`."""

    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, host: str, port: int, registry, cfg: WebConfig | None = None,
                 on_error=None, limits: Limits | None = None, stamp=None):
        self.cfg = cfg
        self.on_error = on_error or (lambda e: None)
        self.limits = limits or Limits()
        self.extra_headers = dict(cfg.headers) if cfg else {}
        self._auth = Authenticator(cfg.users) if cfg and cfg.auth else None
        self._tls = webconfig.TLSContext(cfg, self.on_error) if cfg and cfg.tls else None
        self.rejected = 0  # connections refused in the TLS handshake or by client_allowed_sans
        self.stats = Stats()
        self.own_page: Page | None = None  # serve() sets it: OWN_PATH
        self._active = 0
        self._active_lock = threading.Lock()
        self._workers = Workers(self._handle, self.stats, self.limits.worker_idle_s)
        self._deadlines = Deadlines(self.stats)
        self.prefixes: dict[int, bytes] = {}  # fd -> bytes read by the loop, for the handler
        self.tickets: dict[int, object] = {}  # fd -> its place among credentials to check
        self.address_family = _family(host, port)
        # The page is served from a `Page` (page.py: rendered at most once a second or per
        # step end, unchanged families and gzip reused).
        self.page = Page(registry, stamp=stamp, max_age_s=PAGE_MAX_AGE_S if stamp else 0.0)
        super().__init__((host, port),
                         type("ZerodocMetricsHandler", (_Handler,),
                              {"registry": registry, "page": self.page}))
        extra = list(self.extra_headers.items())
        self._answers = {  # fastpath: refusals prebuilt, 200 heads cached per page
            "unauthorized": canned("401 Unauthorized", extra + [
                ("WWW-Authenticate", 'Basic realm="zerodoc"')], "401 Unauthorized\n"),
            "rate_limited": canned("429 Too Many Requests", extra + [
                ("Retry-After", str(int(webconfig.FAIL_WINDOW_S)))],
                "429 Too Many Requests: too many failed logins\n")}
        self._heads: dict[tuple, bytes] = {}
        self.deferred = defer_accept(self.socket)  # one wake-up per request (fastpath.py)
        self._loop = Loop(self.socket)
        self._served = threading.Event()
        self._served.set()  # not serving: shutdown() returns at once

    @property
    def scheme(self) -> str:
        return "https" if self._tls else "http"

    @property
    def active(self) -> int:
        return self._active

    def authorize(self, header: str | None, client: str, fd: int) -> str:
        """"ok", "unauthorized" or "rate_limited" (webconfig.Authenticator), on a worker: a
        new credential waits up to `webconfig.CHECK_WAIT_S` for its turn to be checked (in
        the place the loop took for it, if it did: `tickets`)."""
        if self._auth is None:
            return "ok"
        return self._auth.header_verdict(header, client, webconfig.CHECK_WAIT_S,
                                         self.tickets.pop(fd, None))

    def _authorize_now(self, header: str | None, client: str, fd: int) -> str | None:
        """`authorize` on the accepting loop, which cannot wait: None when a new credential
        waits for its turn (its place kept under the connection's descriptor for a worker)."""
        if self._auth is None:
            return "ok"
        ticket = object()
        got = self._auth.header_attempt(header, client, ticket)
        if got != "wait":
            return got
        self.tickets[fd] = ticket
        return None

    # --- the accepting loop (fastpath.py) ------------------------------------------------
    def serve_forever(self, poll_interval: float = 0.5) -> None:  # noqa: ARG002
        self._served.clear()
        watched = self.stats.watch_thread()  # its CPU read from outside: nothing per request
        try:
            self._loop.serve(self.process_request, None if watched else self.stats.report_thread)
        finally:
            self.stats.thread_done()
            self._served.set()

    def shutdown(self) -> None:
        self._loop.stop()
        self._served.wait()

    # --- connections: capped, answered on the loop or handled by the worker pool --------
    def process_request(self, request, client_address) -> None:
        """On the accepting thread: over the cap, a canned 503 without reading the request;
        an address over its failure limit, a canned 429; a plain-HTTP request that has
        arrived whole, its answer (`_answer`); the rest, a worker thread."""
        with self._active_lock:
            over = self._active >= self.limits.max_connections
            if not over:
                self._active += 1
        if over:
            self.stats.count("over_capacity")
            refuse(request)
        elif self._tls is not None and self._auth is not None and \
                self._auth.refuse_early(client_address[0]):  # spares a flood the handshake
            self._release()
            self.stats.count("rate_limited")
            refuse(request, LIMITED_RESPONSE)
        elif self._tls is not None:
            self._workers.submit(request, client_address, None, None)
        else:
            try:
                self._answer(request, client_address)
            except Exception as e:  # noqa: BLE001 - never a traceback from a client's doing
                self._release()
                request.close()
                self.on_error(e)

    def _release(self) -> None:
        with self._active_lock:
            self._active -= 1

    def _answer(self, request, client_address, key: int | None = None) -> None:
        """Read what has arrived; answer a whole, simple GET here; hand the rest on. `key`:
        the connection's deadline, once it has one (it waited in the loop)."""
        try:
            data = request.recv(READ_MAX, socket.MSG_DONTWAIT)
        except BlockingIOError:  # nothing yet: wait for it in the loop, under the deadline
            if key is None:
                key = self._deadlines.add(request, self.limits.request_deadline_s)
            self._loop.watch(request, lambda: self._arrived(request, client_address, key))
            return
        except OSError:
            data = b""
        if key is not None and not data and not self._deadlines.done(key):
            self._release()  # cut off at its deadline (counted there)
            request.close()
            return
        if not data:  # closed or reset before its request
            self.stats.count("client_gone")
            self._release()
            request.close()
            return
        head = parse_head(data)
        path = head[1] if head else ""
        if head is None and not looks_like_http(data):  # no line end will come: answer now
            if key is not None:
                self._deadlines.done(key)
            self._reply(request, NOT_HTTP, "bad_request")
            return
        verdict = None if head is None or head[0] != "GET" or \
            ("?" in path and "name[]" in path) else \
            self._authorize_now(head[2].get("authorization"), client_address[0],
                                request.fileno())
        if verdict is None:  # the full parser's, or a credential waiting for its check
            self._workers.submit(request, client_address, data, key)
            return
        if key is not None:
            self._deadlines.done(key)
        headers = head[2]
        out = self._answers.get(verdict)
        page = None
        if out is None:
            own = path.partition("?")[0] == OWN_PATH and self.own_page is not None
            page = self.own_page if own else self.page
            body, hdrs = page.bake(headers.get("accept"), headers.get("accept-encoding"))
            key = (tuple(hdrs), len(body))
            head_bytes = self._heads.get(key)
            if head_bytes is None:
                if len(self._heads) > 32:
                    self._heads.clear()
                head_bytes = self._heads[key] = response_head(
                    "200 OK", hdrs + list(self.extra_headers.items()), len(body))
            out = head_bytes + body if len(body) < 4096 else None
            parts = [head_bytes, body]
        try:
            sent = request.send(out, SEND_FLAGS) if out is not None else \
                request.sendmsg(parts, (), SEND_FLAGS)
        except OSError:
            self.stats.count("client_gone")
            self._release()
            request.close()
            return
        total = len(out) if out is not None else len(parts[0]) + len(parts[1])
        if sent < total:  # the socket took part of it: a worker sends the rest
            rest = (out if out is not None else b"".join(parts))[sent:]
            self._workers.submit(request, client_address, memoryview(rest), None)
        else:
            self._release()
            request.close()  # the answer and the end of the connection in one segment
        self.stats.count(verdict)
        seen = getattr(self, "on_scraped", None)
        if seen is not None and page is self.page:  # the page is out: who scraped (closing.py)
            try:
                seen((client_address[0], headers.get("user-agent", "")))
            except Exception as e:  # noqa: BLE001 - the connection is done: report, go on
                self.on_error(e)

    def _reply(self, request, answer: bytes, outcome: str) -> None:
        """On the loop: a small canned answer, the connection's end, counted."""
        try:
            request.send(answer, SEND_FLAGS)
        except OSError:
            outcome = "client_gone"
        self._release()
        request.close()
        self.stats.count(outcome)

    def _arrived(self, request, client_address, key: int) -> None:
        """On the loop: a connection that waited for its request is readable."""
        try:
            self._answer(request, client_address, key)
        except Exception as e:  # noqa: BLE001 - never a traceback from a client's doing
            self._deadlines.done(key)
            self._release()
            request.close()
            self.on_error(e)

    def _handle(self, request, client_address, pending, key: int | None = None) -> None:
        """On a worker: TLS connections (`pending` None), requests the loop did not answer
        (`pending`: the bytes it read; `key`: their deadline when it is already running),
        answers it could not send whole (the rest)."""
        if key is None:
            key = self._deadlines.add(request, self.limits.request_deadline_s)
        try:
            if isinstance(pending, memoryview):
                request.settimeout(HANDSHAKE_TIMEOUT_S)
                request.sendall(pending)
            elif self._tls is None:
                if pending:
                    self.prefixes[request.fileno()] = pending
                self.finish_request(request, client_address)
            else:
                self._finish_tls(request, client_address, key)
        except Exception as e:  # noqa: BLE001 - never a traceback from a client's doing
            if self._deadlines.done(key):  # not cut off by the deadline (counted there)
                if isinstance(e, OSError):
                    self.stats.count("client_gone")
                else:
                    self.on_error(e)
        finally:
            self._deadlines.done(key)
            self.prefixes.pop(request.fileno(), None)
            ticket = self.tickets.pop(request.fileno(), None)
            if ticket is not None:  # not a GET after all, or gone: its place goes
                self._auth.leave(ticket)
            self.shutdown_request(request)
            self._release()

    def _finish_tls(self, request, client_address, key: int) -> None:
        request.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            conn = self._tls.context().wrap_socket(request, server_side=True,
                                                   do_handshake_on_connect=False)
            self._deadlines.swap(key, conn)
            conn.do_handshake()
        except (ssl.SSLError, OSError):
            self.rejected += 1
            return
        try:
            if self.cfg.client_allowed_sans and not webconfig.san_allowed(conn, self.cfg):
                self.rejected += 1
                return
            self.finish_request(conn, client_address)
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def server_close(self) -> None:
        super().server_close()
        loop = getattr(self, "_loop", None)  # None: the bind failed (HTTPServer closes then)
        if loop is not None:
            loop.close()
        self._workers.stop()
        self._deadlines.stop()

    def handle_error(self, request, client_address) -> None:
        """Never print (socketserver prints a traceback): count it."""
        e = sys.exc_info()[1]
        if isinstance(e, OSError):
            self.stats.count("client_gone")
        elif e is not None:
            self.on_error(e)


def _family(host: str, port: int) -> int:
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        return infos[0][0]
    except socket.gaierror:
        return socket.AF_INET


def is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _candidate_ports(base: int, local_rank: int, local_world: int):
    if base == 0:
        yield 0
        return
    step = max(1, local_world)
    for k in range(PORT_TRIES):
        p = base + local_rank + k * step
        if p <= 65535:
            yield p
    yield 0


_SERVING: "weakref.WeakSet[MetricsServer]" = weakref.WeakSet()  # this process's


def _in_forked_child() -> None:
    """A process forked from the rank (a DataLoader worker) does not hold the port: it is
    freed when the rank goes, not seconds later when its workers do."""
    for server in list(_SERVING):
        try:
            server.socket.close()
        except OSError:
            pass


os.register_at_fork(after_in_child=_in_forked_child)


def start(host: str, port: int, registry, cfg: WebConfig | None = None,
          on_error=None, limits: Limits | None = None, stamp=None) -> MetricsServer:
    """Bind and serve on a daemon thread (raises OSError when the port cannot be bound).
    `stamp`: a cheap callable whose value changes when the page must be rendered anew (then
    the page is rendered at most once per `PAGE_MAX_AGE_S` otherwise); None: every scrape."""
    server = MetricsServer(host, port, registry, cfg, on_error, limits, stamp)
    _SERVING.add(server)

    def accept() -> None:
        name_thread("zd-metrics")
        server.serve_forever()

    threading.Thread(target=accept, name="zerodoc-metrics", daemon=True).start()
    return server


def _start_sidecar(host: str, port: int, registry, cfg, on_error, monitor, stamp):
    """The sidecar server (sidecar.py) bound on `port` (raises OSError when it cannot be
    bound), or None with a warning when the sidecar process cannot start (or no folder for
    its pages can be written: /dev/shm and the temporary directory full or read-only).
    What happens to the sidecar later (its exits, each restarted; a connection that failed
    in it; its pages moved off a full folder) is counted under
    zerodoc_errors_total{hook="sidecar"} and said once."""
    def on_sidecar(e: Exception) -> None:
        monitor.registry.error("sidecar", e)

    page = Page(registry, stamp=stamp, max_age_s=PAGE_MAX_AGE_S)
    srv = sidecar.SidecarServer(host, port, page, _family(host, port), cfg, on_error=on_error,
                                on_sidecar=on_sidecar)
    srv.own_page = Page(ServerCollector(monitor, srv.stats))
    try:
        srv.start()
        return srv
    except Exception as e:  # noqa: BLE001 - serve in-process instead, and say why
        srv.shutdown()
        srv.server_close()
        warnings.warn(f"zerodoc: cannot start the /metrics sidecar ({e}); serving /metrics "
                      "from the training process instead", stacklevel=5)
        return None


def serve(monitor, base_port: int | bool | None, host: str):
    """Start the /metrics server for `monitor`. Returns (server or None, "host:port" or None)."""
    def on_error(e: Exception) -> None:
        monitor.registry.error("exporter_tls", e)

    try:
        cfg = webconfig.from_env()
    except WebConfigError as e:
        warnings.warn(f"zerodoc: {e}; not serving /metrics (it would be unprotected); the "
                      "run log is still written. Fix the file named by "
                      f"${webconfig.ENV} or unset it.", stacklevel=4)
        monitor.registry.error("exporter_config", e)
        return None, None
    if not is_loopback(host) and monitor.local_rank == 0:
        if cfg is None or not (cfg.tls or cfg.auth):
            warnings.warn(
                f"zerodoc: ranks on this node serve /metrics on {host or '0.0.0.0'} without TLS "
                "or authentication: anyone who can reach the node can read the run's metrics. "
                f"Set ${webconfig.ENV} to a web configuration with tls_server_config and/or "
                "basic_auth_users (see docs/operations.md, 'Scraping off loopback').",
                stacklevel=4)
        elif not cfg.tls:
            warnings.warn(f"zerodoc: /metrics on {host or '0.0.0.0'} uses basic auth without "
                          "TLS: the password crosses the network in clear text.", stacklevel=4)
    registry = CollectorRegistry(auto_describe=False)
    collector = ZerodocCollector(monitor)
    registry.register(collector)
    base = int(base_port or 0)
    wanted = base + monitor.local_rank if base else 0
    last_err = None
    use_sidecar = sidecar.wanted(cfg=cfg)
    for port in _candidate_ports(base, monitor.local_rank, monitor.local_world_size):
        try:
            server = None
            if use_sidecar:
                server = _start_sidecar(host, port, registry, cfg, on_error, monitor,
                                        collector.stamp)
            if server is None:
                server = start(host, port, registry, cfg, on_error, stamp=collector.stamp)
                server.own_page = Page(ServerCollector(monitor, server.stats))
        except OSError as e:
            last_err = e
            if e.errno not in (errno.EADDRINUSE, errno.EACCES):
                break
            continue
        signal = getattr(monitor, "close_signal", None)  # set by the collector
        if signal is not None:
            server.on_scraped = signal.scraped
            server.close_signal = signal
        actual = server.server_address[1]
        if base and actual != wanted:
            warnings.warn(f"zerodoc: port {wanted} is in use; rank {monitor.rank} serves "
                          f"/metrics on {host}:{actual} instead", stacklevel=4)
        return server, f"{host}:{actual}"
    warnings.warn(f"zerodoc: cannot serve /metrics on {host} ({last_err}); "
                  "continuing without the HTTP exporter (the run log is still written)",
                  stacklevel=4)
    monitor.registry.error("exporter", last_err or OSError("no port"))
    return None, None
