"""The /metrics page of one rank, made cheap for the training process it runs in.

A scrape runs on the exporter's thread inside the training process and holds the GIL while it
builds the page, so its cost is taken from the training thread (and, on a busy host, stretched
by every time slice the scrape thread waits for while holding the GIL). prometheus_client's
encoders format every series from scratch on every scrape (~6 us a series: sorting and
escaping labels). Here:

- a family the collector hands back *unchanged* (the same object: the run's unit facts, the
  per-unit totals between two step ends) reuses its text from the previous page;
- a changed family formats only its values when its series are those of the last time (same
  names and labels, in the same order: the per-unit totals between step ends); the text of
  each series up to its value is made by prometheus_client's own encoder and kept (a family
  whose encoder output does not split that way is encoded whole, as before);
- the page's gzip is kept while the page is byte-identical, and made at level 1;
- with a `stamp` (the server's: the collector's step-fold count, close and stall state), a
  page is served as rendered for up to `max_age_s` while the stamp is unchanged: scrapes
  faster than that (a flood, many scrapers) cost a dictionary lookup, not a render, and the
  scrape rate does not reach the training job.

The bytes served are exactly those of `prometheus_client`'s encoders (text 0.0.4 or
OpenMetrics, chosen from the Accept header as its handler does; tests compare them).
`PageHandler` is a `prometheus_client.exposition.MetricsHandler` that serves from a `Page`.
"""

from __future__ import annotations

import gzip
import threading
import time
from urllib.parse import parse_qs

from prometheus_client.exposition import MetricsHandler, choose_encoder, gzip_accepted
from prometheus_client.utils import floatToGoString

from .fastpath import MAX_HEADERS

_EOF = b"# EOF\n"
# prometheus_client compresses at level 9: ~7x the CPU of level 1 on this text for a page
# 20 % smaller (65 units: 1.8 ms vs 0.25 ms, 9.5 vs 11.8 KiB). The content is the same.
GZIP_LEVEL = 1


class _One:
    """A registry-like holder of one family (what the encoders iterate)."""

    __slots__ = ("fams",)

    def __init__(self, fams):
        self.fams = fams

    def collect(self):
        return self.fams


class _Format:
    """One exposition format: its encoder and what it has learnt per family."""

    def __init__(self, encoder, content_type: str):
        self.encoder, self.content_type = encoder, content_type
        self.openmetrics = content_type.startswith("application/openmetrics-text")
        self.texts: dict[int, tuple[object, bytes]] = {}  # id(family) -> (family, text)
        # (name, type, help, unit) -> (header text, [(sample name, labels, prefix)])
        self.templates: dict[tuple, tuple[str, dict]] = {}
        self.page: bytes | None = None
        self.gzipped: bytes | None = None

    def encode_whole(self, fam) -> bytes:
        text = self.encoder(_One([fam]))
        return text[:-len(_EOF)] if self.openmetrics and text.endswith(_EOF) else text

    def learn(self, fam) -> tuple[str, list] | None:
        """Header and per-series prefixes of `fam`, from the encoder's own output; None
        when that output is not one line per sample ending in its value."""
        lines = self.encode_whole(fam).decode("utf-8").splitlines(keepends=True)
        k = 0
        while k < len(lines) and lines[k].startswith("#"):
            k += 1
        head, body = "".join(lines[:k]), lines[k:]
        if len(body) != len(fam.samples):
            return None
        series = []
        for ln, s in zip(body, fam.samples):
            if s.value is None or s.timestamp is not None or s.exemplar is not None or \
                    getattr(s, "native_histogram", None) is not None:
                return None
            tail = " " + floatToGoString(s.value) + "\n"
            if not ln.endswith(tail) or ln.startswith("#"):
                return None
            series.append((s.name, s.labels, ln[:-len(tail)] + " "))
        return head, series

    def family_text(self, fam) -> bytes:
        """`fam` encoded: from its template when every sample is, position by position, the
        series the template was learnt from (name and labels equal), else learnt anew."""
        key = (fam.name, fam.type, fam.documentation, getattr(fam, "unit", ""))
        tpl = self.templates.get(key)
        samples = fam.samples
        if tpl is not None and len(tpl[1]) == len(samples):
            out = [tpl[0]]
            go = floatToGoString
            for (name, labels, prefix), s in zip(tpl[1], samples):
                if s.name != name or s.labels != labels or s.value is None or \
                        s.timestamp is not None or s.exemplar is not None:
                    break
                out.append(prefix + go(s.value) + "\n")
            else:
                return "".join(out).encode("utf-8")
        learnt = self.learn(fam)
        if learnt is None:
            self.templates.pop(key, None)
        else:
            self.templates[key] = learnt
        return self.encode_whole(fam)


class Page:
    """The /metrics page of a registry (or any object with `collect()`), per format."""

    def __init__(self, registry, stamp=None, max_age_s: float = 0.0, clock=time.monotonic):
        self.registry = registry
        self.stamp, self.max_age_s, self.clock = stamp, max_age_s, clock
        self._formats: dict[str, _Format] = {}
        self._lock = threading.Lock()  # one page at a time: scrapes do not pile up work
        # (content type, gzip) -> (rendered at, stamp, body, headers)
        self._served: dict[tuple, tuple] = {}
        self.renders = 0  # pages rendered (not served from `_served`)

    def render(self, accept_header: str | None) -> tuple[bytes, str, _Format]:
        encoder, content_type = choose_encoder(accept_header or "")
        with self._lock:
            fmt = self._formats.get(content_type)
            if fmt is None:
                fmt = self._formats[content_type] = _Format(encoder, content_type)
            parts, texts = [], {}
            for fam in self.registry.collect():
                hit = fmt.texts.get(id(fam))
                text = hit[1] if hit is not None and hit[0] is fam else fmt.family_text(fam)
                texts[id(fam)] = (fam, text)
                parts.append(text)
            if fmt.openmetrics:
                parts.append(_EOF)
            fmt.texts = texts  # only this page's families are kept
            page = b"".join(parts)
            if page != fmt.page:
                fmt.page, fmt.gzipped = page, None
            return fmt.page, content_type, fmt

    def bake(self, accept_header: str | None,
             accept_encoding_header: str | None) -> tuple[bytes, list[tuple[str, str]]]:
        """Body and headers of a 200 response, as prometheus_client's handler makes them."""
        if self.max_age_s <= 0:
            return self._bake(accept_header, accept_encoding_header)
        _enc, content_type = choose_encoder(accept_header or "")
        key = (content_type, gzip_accepted(accept_encoding_header or ""))
        stamp = self.stamp() if self.stamp is not None else None
        hit = self._served.get(key)
        if hit is not None and hit[1] == stamp and self.clock() - hit[0] < self.max_age_s:
            return hit[2], hit[3]
        t = self.clock()
        body, headers = self._bake(accept_header, accept_encoding_header)
        self._served[key] = (t, stamp, body, headers)
        return body, headers

    def _bake(self, accept_header, accept_encoding_header):
        self.renders += 1
        page, content_type, fmt = self.render(accept_header)
        headers = [("Content-Type", content_type)]
        if gzip_accepted(accept_encoding_header or ""):
            with self._lock:
                if fmt.page is page and fmt.gzipped is not None:
                    page = fmt.gzipped
                else:
                    zipped = gzip.compress(page, compresslevel=GZIP_LEVEL)
                    if fmt.page is page:
                        fmt.gzipped = zipped
                    page = zipped
            headers.append(("Content-Encoding", "gzip"))
        return page, headers


class Headers(dict):
    """Request headers by lower-cased name (what the handlers read: `.get(name)`)."""

    def get(self, key, default=None):
        return dict.get(self, key.lower(), default)

    def __getitem__(self, key):
        return dict.get(self, key.lower())

    def __contains__(self, key):
        return dict.__contains__(self, key.lower())


MAX_LINE = 65536


class PageHandler(MetricsHandler):
    """prometheus_client's handler, serving from the class's `page` (a `Page`); requests it
    does not cover (`name[]` filters) and handlers without a page take the library's path.

    A request is read by a small parser (`parse_request`: the request line and `Name: value`
    headers, bounded as http.client bounds them) instead of the standard library's e-mail
    parser, and a response goes out in one send: a scrape costs the training process a few
    hundred microseconds of CPU, not a millisecond."""

    page: Page | None = None
    _pending: bytes | None = None

    def parse_request(self) -> bool:
        self.command = None
        # errors are answered as HTTP/1.0, with a status line: under the library's default
        # (HTTP/0.9) a request line it cannot read (the HTTP/2 preface, `PRI * HTTP/2.0`)
        # was answered a bare HTML page
        self.request_version = version = "HTTP/1.0"
        self.close_connection = True  # HTTP/1.0: one request per connection
        requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        self.requestline = requestline
        words = requestline.split()
        if len(words) != 3 or not words[2].startswith("HTTP/1."):
            self.send_error(400, f"Bad request {requestline[:100]!r}")
            return False
        self.command, self.path, version = words
        self.request_version = version
        headers = Headers()
        for _ in range(MAX_HEADERS + 1):
            line = self.rfile.readline(MAX_LINE + 1)
            if len(line) > MAX_LINE:
                self.send_error(431, "Line too long")
                return False
            if line in (b"\r\n", b"\n", b""):
                break
            name, sep, value = str(line, "iso-8859-1").partition(":")
            if not sep or not name.strip():
                self.send_error(400, "Bad header line")
                return False
            headers[name.strip().lower()] = value.strip()
        else:
            self.send_error(431, "Too many headers")
            return False
        self.headers = headers
        return True

    def flush_headers(self) -> None:
        """The headers, and the body when there is one waiting, in one write."""
        if self._pending is not None and hasattr(self, "_headers_buffer"):
            self._headers_buffer.append(self._pending)
            self._pending = None
        super().flush_headers()

    def do_GET(self) -> None:  # noqa: N802
        page = self.page
        query = self.path.partition("?")[2]
        if page is None or (query and "name[]" in parse_qs(query)):
            return super().do_GET()
        self.serve_page(page)

    def serve_page(self, page: Page) -> None:
        body, headers = page.bake(self.headers.get("Accept"),
                                  self.headers.get("Accept-Encoding"))
        self.send_response(200)
        for header in headers:
            self.send_header(*header)
        self._pending = body
        self.end_headers()
