"""TLS and basic-auth settings of the /metrics server, read from a file named by the environment.

The file follows the Prometheus exporter-toolkit's web configuration (`--web.config.file` of
node_exporter and friends), so the same file and secrets work for zerodoc:

    tls_server_config:
      cert_file: /etc/zerodoc/tls/tls.crt     # relative paths: from the file's folder
      key_file: /etc/zerodoc/tls/tls.key
      client_auth_type: RequireAndVerifyClientCert   # or VerifyClientCertIfGiven, NoClientCert
      client_ca_file: /etc/zerodoc/tls/ca.crt
      client_allowed_sans: [prometheus.monitoring.svc]   # optional
      min_version: TLS12                      # TLS10 .. TLS13
    http_server_config:
      headers: {X-Content-Type-Options: nosniff}
    basic_auth_users:
      prometheus: $2y$10$...                  # bcrypt (htpasswd -nB), or $pbkdf2-sha256$...

It is named by `$ZERODOC_WEB_CONFIG_FILE`, never passed from code. YAML needs PyYAML; without
it the file may be written as JSON. bcrypt hashes need the `bcrypt` package (`pip install
'zerodoc[web]'`); `$pbkdf2-sha256$` hashes (passlib's format) are checked with the standard
library. `python -m zerodoc.cli.webconfig hash-password` prints either.

Not supported, and refused with a clear error rather than served weaker than asked:
`cipher_suites`, `curve_preferences`, `prefer_server_cipher_suites`, and the client auth types
`RequestClientCert` / `RequireAnyClientCert` (Python's ssl verifies every client certificate
it accepts). `http2` is accepted and ignored (the server speaks HTTP/1.1).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import os
import ssl
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

ENV = "ZERODOC_WEB_CONFIG_FILE"

CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
UNSUPPORTED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "client_allowed_sans",
            "min_version", "max_version"}
TLS_UNSUPPORTED = {"cipher_suites", "curve_preferences", "prefer_server_cipher_suites"}
PBKDF2_PREFIX = "$pbkdf2-sha256$"
BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")
PBKDF2_ROUNDS = 600_000


class WebConfigError(ValueError):
    """The web configuration file is missing, unreadable or asks for something unsupported."""


@dataclass(frozen=True)
class WebConfig:
    path: Path
    cert_file: Path | None = None
    key_file: Path | None = None
    client_ca_file: Path | None = None
    client_auth_type: str = "NoClientCert"
    client_allowed_sans: tuple[str, ...] = ()
    min_version: str | None = None
    max_version: str | None = None
    users: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def tls(self) -> bool:
        return self.cert_file is not None

    @property
    def auth(self) -> bool:
        return bool(self.users)

    def ssl_context(self) -> ssl.SSLContext:
        """A server context from the files as they are now (called again when they change)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
            if self.client_ca_file is not None:
                ctx.load_verify_locations(cafile=str(self.client_ca_file))
        except (OSError, ssl.SSLError) as e:
            raise WebConfigError(f"{self.path}: cannot load the TLS files: {e}") from None
        ctx.verify_mode = CLIENT_AUTH[self.client_auth_type]
        if self.min_version:
            ctx.minimum_version = TLS_VERSIONS[self.min_version]
        if self.max_version:
            ctx.maximum_version = TLS_VERSIONS[self.max_version]
        return ctx

    def tls_files(self) -> list[Path]:
        return [p for p in (self.cert_file, self.key_file, self.client_ca_file) if p]


def _parse(text: str, path: Path) -> dict:
    try:
        import yaml
    except ImportError:
        try:
            data = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError:
            raise WebConfigError(f"{path} is not JSON, and PyYAML is not installed to read "
                                 "YAML (pip install pyyaml, or write the file as JSON)") from None
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise WebConfigError(f"{path} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise WebConfigError(f"{path}: expected a mapping at the top level")
    return data


def _mapping(data: dict, key: str, path: Path) -> dict:
    v = data.get(key) or {}
    if not isinstance(v, dict):
        raise WebConfigError(f"{path}: {key} must be a mapping")
    return v


def load(path: str | Path) -> WebConfig:
    """Read and check a web configuration file (every referenced file must be readable)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise WebConfigError(f"cannot read the web configuration {path}: "
                             f"{e.strerror or e}") from None
    data = _parse(text, path)
    unknown = set(data) - {"tls_server_config", "http_server_config", "basic_auth_users"}
    if unknown:
        raise WebConfigError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}")
    tls = _mapping(data, "tls_server_config", path)
    bad = set(tls) & TLS_UNSUPPORTED
    if bad:
        raise WebConfigError(f"{path}: tls_server_config.{sorted(bad)[0]} is not supported by "
                             "zerodoc's exporter (remove it; OpenSSL's defaults apply)")
    unknown = set(tls) - TLS_KEYS - TLS_UNSUPPORTED
    if unknown:
        raise WebConfigError(f"{path}: unknown tls_server_config key(s) "
                             f"{', '.join(sorted(unknown))}")
    base = path.parent

    def file(key: str) -> Path | None:
        v = tls.get(key)
        if v in (None, ""):
            return None
        p = Path(str(v))
        p = p if p.is_absolute() else base / p
        if not os.access(p, os.R_OK):
            raise WebConfigError(f"{path}: tls_server_config.{key} {p} is not a readable file")
        return p

    cert, key, ca = file("cert_file"), file("key_file"), file("client_ca_file")
    if tls and (cert is None) != (key is None):
        raise WebConfigError(f"{path}: tls_server_config needs both cert_file and key_file")
    auth_type = str(tls.get("client_auth_type") or "NoClientCert")
    if auth_type in UNSUPPORTED_CLIENT_AUTH:
        raise WebConfigError(
            f"{path}: client_auth_type {auth_type} is not supported (Python's ssl verifies "
            "every client certificate it accepts): use VerifyClientCertIfGiven or "
            "RequireAndVerifyClientCert with client_ca_file")
    if auth_type not in CLIENT_AUTH:
        raise WebConfigError(f"{path}: client_auth_type {auth_type!r} is not one of "
                             f"{', '.join(CLIENT_AUTH)}")
    if auth_type != "NoClientCert" and ca is None:
        raise WebConfigError(f"{path}: client_auth_type {auth_type} needs client_ca_file")
    sans = tls.get("client_allowed_sans") or []
    if not isinstance(sans, list) or not all(isinstance(s, str) for s in sans):
        raise WebConfigError(f"{path}: client_allowed_sans must be a list of names")
    if sans and auth_type != "RequireAndVerifyClientCert":
        raise WebConfigError(f"{path}: client_allowed_sans needs client_auth_type "
                             "RequireAndVerifyClientCert")
    versions = {}
    for k in ("min_version", "max_version"):
        v = tls.get(k)
        if v not in (None, "") and v not in TLS_VERSIONS:
            raise WebConfigError(f"{path}: {k} {v!r} is not one of {', '.join(TLS_VERSIONS)}")
        versions[k] = v or None
    if tls and cert is None:
        raise WebConfigError(f"{path}: tls_server_config without cert_file and key_file")

    http = _mapping(data, "http_server_config", path)
    unknown = set(http) - {"headers", "http2"}
    if unknown:
        raise WebConfigError(f"{path}: unknown http_server_config key(s) "
                             f"{', '.join(sorted(unknown))}")
    headers = http.get("headers") or {}
    if not isinstance(headers, dict):
        raise WebConfigError(f"{path}: http_server_config.headers must be a mapping")
    users = _mapping(data, "basic_auth_users", path)
    for user, h in users.items():
        check_hash_usable(str(h), f"{path}: basic_auth_users.{user}")
    cfg = WebConfig(path=path, cert_file=cert, key_file=key, client_ca_file=ca,
                    client_auth_type=auth_type, client_allowed_sans=tuple(sans),
                    users={str(u): str(h) for u, h in users.items()},
                    headers={str(k): str(v) for k, v in headers.items()}, **versions)
    if cfg.tls:
        cfg.ssl_context()  # the certificate and key load and match, now rather than per scrape
    return cfg


def from_env() -> WebConfig | None:
    """The configuration named by $ZERODOC_WEB_CONFIG_FILE, or None when it is not set."""
    raw = os.environ.get(ENV, "").strip()
    return load(raw) if raw else None


# --- passwords --------------------------------------------------------------------------
def _ab64(data: bytes) -> str:
    return base64.b64encode(data).decode().rstrip("=").replace("+", ".")


def _ab64_decode(s: str) -> bytes:
    s = s.replace(".", "+")
    return base64.b64decode(s + "=" * (-len(s) % 4))


def _pbkdf2_parts(h: str) -> tuple[int, bytes, bytes]:
    try:
        rounds, salt, digest = h[len(PBKDF2_PREFIX):].split("$")
        return int(rounds), _ab64_decode(salt), _ab64_decode(digest)
    except (ValueError, TypeError):
        raise ValueError("malformed $pbkdf2-sha256$ hash") from None


def check_hash_usable(h: str, where: str) -> None:
    if h.startswith(BCRYPT_PREFIXES):
        try:
            import bcrypt  # noqa: F401
        except ImportError:
            raise WebConfigError(f"{where} is a bcrypt hash but the bcrypt package is not "
                                 "installed (pip install 'zerodoc[web]', or use a "
                                 "$pbkdf2-sha256$ hash)") from None
        return
    if h.startswith(PBKDF2_PREFIX):
        try:
            _pbkdf2_parts(h)
        except ValueError as e:
            raise WebConfigError(f"{where}: {e}") from None
        return
    raise WebConfigError(f"{where} is not a bcrypt ($2y$...) or $pbkdf2-sha256$ hash "
                         "(plain-text passwords are not accepted)")


def hash_password(password: str, scheme: str = "bcrypt", rounds: int | None = None) -> str:
    if scheme == "bcrypt":
        import bcrypt

        return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=rounds or 10)).decode()
    salt = os.urandom(16)
    n = rounds or PBKDF2_ROUNDS
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, n)
    return f"{PBKDF2_PREFIX}{n}${_ab64(salt)}${_ab64(digest)}"


def verify_password(password: str, h: str) -> bool:
    if h.startswith(BCRYPT_PREFIXES):
        import bcrypt

        try:
            return bcrypt.checkpw(password.encode(), h.encode())
        except ValueError:
            return False
    rounds, salt, digest = _pbkdf2_parts(h)
    got = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, rounds, dklen=len(digest))
    return hmac.compare_digest(got, digest)


# Failed logins and password checks (`Authenticator`; docs/reliability.md's table):
# - an address whose FAIL_LIMIT *new* credentials failed within FAIL_WINDOW_S (guesses; a
#   wrong password repeated is no guess) has its next new credentials answered 429 without a
#   check until the window ends; remembered credentials are answered as before;
# - over TLS only (the handshake is what it spares), an address with FLOOD_LIMIT failures of
#   any kind within the window, failing for QUIET_S without a login, is answered 429 before
#   its handshake;
# - new credentials are checked at most CHECKS_PER_S a second in all (burst CHECKS_BURST),
#   one at a time; one that finds no check free waits up to CHECK_WAIT_S for its turn, the
#   address that was given the fewest checks lately, then asked for the fewest, going first
#   (counts decaying over LOAD_TAU_S).
FAIL_LIMIT = 5
FAIL_WINDOW_S = 10.0
FLOOD_LIMIT = 20
QUIET_S = 600.0
CHECKS_PER_S = 2.0
CHECKS_BURST = 4.0
CHECK_WAIT_S = 5.0
# credentials waiting at once: more could not be checked within their wait anyway, and each
# holds a connection (of the cap's 64); a quieter newcomer takes the busiest one's place
MAX_WAITING = int(CHECKS_PER_S * CHECK_WAIT_S)
LOAD_TAU_S = 60.0
CACHE_RIGHT = 64  # verified credentials remembered
CACHE_WRONG = 1024  # refused credentials remembered
CLIENTS = 4096  # client addresses whose failures are tracked


class TLSContext:
    """The server's SSL context, rebuilt when a certificate, key or CA file changes."""

    def __init__(self, cfg: "WebConfig", on_error):
        self.cfg, self.on_error = cfg, on_error
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self._ctx = cfg.ssl_context()

    def _stat(self):
        out = []
        for p in self.cfg.tls_files():
            try:
                st = os.stat(p)
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                out.append(None)
        return tuple(out)

    def context(self) -> ssl.SSLContext:
        stamp = self._stat()
        if stamp != self._stamp:
            with self._lock:
                if stamp != self._stamp:
                    try:
                        self._ctx = self.cfg.ssl_context()
                        self._stamp = stamp
                    except WebConfigError as e:  # half-written rotation: keep the old one
                        self.on_error(e)
        return self._ctx


def san_allowed(conn: ssl.SSLSocket, cfg: "WebConfig") -> bool:
    """The client certificate names one of `client_allowed_sans`."""
    cert = conn.getpeercert() or {}
    names = {v for _k, v in cert.get("subjectAltName", ())}
    return bool(names & set(cfg.client_allowed_sans))


def basic_credentials(header: str | None) -> tuple[str | None, str]:
    """(user, password) of an `Authorization: Basic ...` header; (None, "") for anything else:
    not base64, not UTF-8, or not ASCII at all (`Basic éé`: b64decode's ValueError)."""
    if not header or not header.startswith("Basic "):
        return None, ""
    try:
        user, _, password = base64.b64decode(header[6:].strip()).decode().partition(":")
    except ValueError:  # binascii.Error and UnicodeDecodeError are ValueErrors too
        return None, ""
    return user, password


class Authenticator:
    """Checks basic-auth credentials against the configured hashes, cheaply when repeated,
    in an order that a flood cannot turn against the scraper it is meant to protect.

    A hash check is deliberately slow (bcrypt, PBKDF2: milliseconds of CPU in the process
    that serves /metrics). So:

    - a credential is checked once: the verdict is remembered, right and wrong ones apart
      (bounded, least recently used out), keyed by a SHA-256 of a per-process random salt,
      the user and the password (never the password itself); a Prometheus scraping every
      few seconds, or a flood repeating one wrong password, costs a hash lookup per request.
      A verified credential is accepted from any address, whatever that address did;
    - an address whose `FAIL_LIMIT` new credentials failed within `FAIL_WINDOW_S` (guesses)
      has its next new ones refused ("rate_limited") without a check until the window ends;
      a wrong password repeated guesses nothing and does not count there (a neighbour behind
      the same NAT with a stale password cannot keep Prometheus' first login out);
    - new credentials are checked at most `CHECKS_PER_S` a second in all, one at a time. One
      that finds no check free waits for its turn (`attempt` says "wait"; `verdict` blocks,
      up to `wait_s`), and at each turn the waiting address that was given the fewest
      checks lately goes first, then the one that asked for the fewest new credentials
      (counts decaying over `LOAD_TAU_S`; one waiter per address, `MAX_WAITING` in all, a
      quieter newcomer taking the busiest one's place): addresses guessing, however slowly or
      fast, are served after a Prometheus whose first login has had no check yet, so it is
      checked at the next turn (~0.5 s) however many addresses guess, once their own first
      guesses, as new as its own, have been (`MAX_WAITING / CHECKS_PER_S`). Nothing in this order depends on the user name, and an
      unknown user is checked against a configured hash all the same: its answer and its
      cost are those of a known user with a wrong password (no user enumeration);
    - `refuse_early`: over TLS the server may answer 429 before the handshake, but only for an
      address flooding (`FLOOD_LIMIT` failures within the window) that has failed for
      `QUIET_S` (minutes) without a login: a scraper that logs in from it is not refused
      so for as long as it scrapes at an interval under that.
    """

    def __init__(self, users: dict[str, str], clock=time.monotonic):
        self.users = dict(users)
        self.clock = clock
        self._salt = os.urandom(16)
        self._right: OrderedDict[bytes, None] = OrderedDict()
        self._wrong: OrderedDict[bytes, None] = OrderedDict()
        self._fails: OrderedDict[str, list] = OrderedDict()  # address -> [window start, n]
        self._guesses: OrderedDict[str, list] = OrderedDict()  # the same, new credentials only
        self._failing: OrderedDict[str, float] = OrderedDict()  # address -> failing since
        # address -> [checks given, new credentials asked for, at]: decaying counts
        self._load: OrderedDict[str, list] = OrderedDict()
        self._waiting: dict = {}  # ticket -> (address, arrival number, since): awaiting a check
        self._evicted: OrderedDict = OrderedDict()  # tickets whose place a quieter one took
        self._arrivals = 0
        self._tokens, self._refilled = CHECKS_BURST, clock()
        self._cond = threading.Condition()  # the tables; waiters wait on it for their turn
        self._check_lock = threading.Lock()  # one hash check at a time
        self._dummy = next(iter(self.users.values()), "")
        self.hash_checks = 0  # password hashes verified (the expensive part)

    def check(self, user: str, password: str, client: str = "") -> bool:
        return self.verdict(user, password, client) == "ok"

    def header_verdict(self, header: str | None, client: str = "", wait_s: float = 0.0,
                       ticket=None) -> str:
        """`verdict` of an `Authorization` header's basic credentials ("unauthorized" for a
        missing or malformed one): what the in-process server's workers ask."""
        user, password = basic_credentials(header)
        if user is None:
            if ticket is not None:
                self.leave(ticket)
            return "unauthorized"
        return self.verdict(user, password, client, wait_s, ticket)

    def header_attempt(self, header: str | None, client: str, ticket) -> str:
        """`attempt` of an `Authorization` header: what a server that cannot block asks."""
        user, password = basic_credentials(header)
        if user is None:
            return "unauthorized"
        return self.attempt(user, password, client, ticket)

    def verdict(self, user: str, password: str, client: str = "", wait_s: float = 0.0,
                ticket=None) -> str:
        """"ok", "unauthorized" or "rate_limited" (refused without checking the password). A
        new credential that finds no check free waits up to `wait_s` (real seconds, blocking
        the caller) for its turn; `ticket`: the place `attempt` gave it, if any."""
        ticket = object() if ticket is None else ticket
        end = time.monotonic() + wait_s
        try:
            while True:
                got = self.attempt(user, password, client, ticket)
                left = end - time.monotonic()
                if got != "wait":
                    return got
                if left <= 0:
                    return "rate_limited"
                with self._cond:
                    self._cond.wait(min(left, max(0.01, self.turn_in())))
        finally:
            self.leave(ticket)

    def attempt(self, user: str, password: str, client: str, ticket) -> str:
        """`verdict` without blocking: "wait" when a new credential is queued for a check
        under `ticket` (any hashable the caller keeps: its connection). Ask again with the
        same ticket (at `turn_in()` from now, or sooner); `leave(ticket)` when giving up."""
        key = hashlib.sha256(self._salt + f"{user}\0{password}".encode()).digest()
        with self._cond:
            if key in self._right or key in self._wrong:
                self.leave(ticket)
                if key in self._right:
                    self._right.move_to_end(key)
                    self._passed_now(client)
                    return "ok"
                self._wrong.move_to_end(key)
                self._failed(client, guess=False)
                return "unauthorized"
            if ticket not in self._waiting:
                if self._evicted.pop(ticket, False):
                    return "rate_limited"
                self._asked(client)
                if self._guessing(client) or \
                        any(w[0] == client for w in self._waiting.values()) or \
                        not self._room_for(client):
                    return "rate_limited"
                self._arrivals += 1
                self._waiting[ticket] = (client, self._arrivals, self.clock())
            if not self._first(ticket) or not self._take_token():
                return "wait"
            self.leave(ticket)
            self._asked(client, checked=1.0)
        h = self.users.get(user)
        with self._check_lock:
            self.hash_checks += 1
            ok = verify_password(password, h if h is not None else self._dummy) and h is not None
        with self._cond:
            table, size = (self._right, CACHE_RIGHT) if ok else (self._wrong, CACHE_WRONG)
            table[key] = None
            if len(table) > size:
                table.popitem(last=False)
            if ok:
                self._passed_now(client)
            else:
                self._failed(client, guess=True)
        return "ok" if ok else "unauthorized"

    def leave(self, ticket) -> None:
        """`ticket` no longer waits (checked, answered, or its connection gone)."""
        with self._cond:
            self._evicted.pop(ticket, None)
            if self._waiting.pop(ticket, None) is not None:
                self._cond.notify_all()  # the next one may be first now

    def turn_in(self) -> float:
        """Seconds until the next check can run (0: now)."""
        with self._cond:
            tokens = min(CHECKS_BURST,
                         self._tokens + (self.clock() - self._refilled) * CHECKS_PER_S)
            return max(0.0, (1.0 - tokens) / CHECKS_PER_S)

    def refuse_early(self, client: str) -> bool:
        """True for an address flooding (`FLOOD_LIMIT` failures within the window) that has
        failed for `QUIET_S` without a login: a TLS server may answer it 429 before its
        handshake. A scraper behind it (NAT) that logs in within `QUIET_S` of the flood's
        start, and then scrapes at any interval under it, is never refused so."""
        with self._cond:
            now = self.clock()
            f = self._fails.get(client)
            if f is None or now - f[0] >= FAIL_WINDOW_S or f[1] < FLOOD_LIMIT:
                return False
            return now - self._failing.get(client, now) >= QUIET_S

    def _room_for(self, client: str) -> bool:
        """A place among the waiting for `client`: a free one, or the place of the waiting
        address that asked most lately, if it asked more than `client` (told at its next
        attempt: "rate_limited")."""
        if len(self._waiting) < MAX_WAITING:
            return True
        now = self.clock()
        worst = max(self._waiting.items(),
                    key=lambda kv: (self._load_of(kv[1][0], now), kv[1][1]))
        if self._load_of(worst[1][0], now) <= self._load_of(client, now):
            return False
        del self._waiting[worst[0]]
        self._evicted[worst[0]] = True
        if len(self._evicted) > CLIENTS:
            self._evicted.popitem(last=False)
        return True

    def _first(self, ticket) -> bool:
        """`ticket` is the waiter to check next: its address asked least lately (then: the
        longest waiting)."""
        now = self.clock()
        for t in [t for t, w in self._waiting.items() if now - w[2] > 2 * CHECK_WAIT_S]:
            del self._waiting[t]  # a caller that never came back (nor left): not first forever
        if ticket not in self._waiting:
            return False
        best = min(self._waiting.items(),
                   key=lambda kv: (self._load_of(kv[1][0], now), kv[1][1]))
        return best[0] is ticket

    def _load_of(self, client: str, now: float) -> tuple[float, float]:
        """(checks given, new credentials asked for) of `client` lately: lower goes first."""
        got = self._load.get(client)
        if got is None:
            return 0.0, 0.0
        f = math.exp(-(now - got[2]) / LOAD_TAU_S)
        return got[0] * f, got[1] * f

    def _asked(self, client: str, checked: float = 0.0) -> None:
        """`client` asked for a new credential's check (or, `checked`, was given one)."""
        now = self.clock()
        checks, asked = self._load_of(client, now)
        self._load[client] = [checks + checked, asked + (1.0 - checked), now]
        _bound(self._load, client)

    def _passed_now(self, client: str) -> None:
        self._failing.pop(client, None)  # it logged in: not failing since then

    def _guessing(self, client: str) -> bool:
        f = self._guesses.get(client)
        return f is not None and self.clock() - f[0] < FAIL_WINDOW_S and f[1] >= FAIL_LIMIT

    def _failed(self, client: str, guess: bool) -> None:
        now = self.clock()
        if client not in self._failing:
            self._failing[client] = now
            _bound(self._failing, client)
        for table in (self._fails, self._guesses) if guess else (self._fails,):
            f = table.get(client)
            if f is None or now - f[0] >= FAIL_WINDOW_S:
                f = table[client] = [now, 0]
            f[1] += 1
            _bound(table, client)

    def _take_token(self) -> bool:
        now = self.clock()
        self._tokens = min(CHECKS_BURST, self._tokens + (now - self._refilled) * CHECKS_PER_S)
        self._refilled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


def _bound(table: OrderedDict, client: str) -> None:
    """`client` is the newest entry of `table`, which keeps the newest `CLIENTS`."""
    table.move_to_end(client)
    if len(table) > CLIENTS:
        table.popitem(last=False)
