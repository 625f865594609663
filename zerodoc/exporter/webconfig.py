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


# Failed logins: a client address with FAIL_LIMIT failures within FAIL_WINDOW_S is answered
# 429 without a password check until its window ends; password checks of credentials not
# seen before run at most CHECKS_PER_S a second overall (burst CHECKS_BURST).
FAIL_LIMIT = 5
FAIL_WINDOW_S = 10.0
CHECKS_PER_S = 2.0
CHECKS_BURST = 4.0
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
    """(user, password) of an `Authorization: Basic ...` header; (None, "") for anything else."""
    if not header or not header.startswith("Basic "):
        return None, ""
    try:
        user, _, password = base64.b64decode(header[6:].strip()).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None, ""
    return user, password


class Authenticator:
    """Checks basic-auth credentials against the configured hashes, cheaply when repeated.

    A hash check is deliberately slow (bcrypt, PBKDF2: milliseconds of CPU in the training
    process). So:

    - a credential is checked once: the verdict is remembered, right and wrong ones apart
      (bounded, least recently used out), keyed by a SHA-256 of a per-process random salt,
      the user and the password (never the password itself); a Prometheus scraping every
      few seconds, or a flood repeating one wrong password, costs a hash lookup per request;
    - a client address with `FAIL_LIMIT` failed logins within `FAIL_WINDOW_S` is answered
      "rate_limited" (429) for new credentials without a check until its window ends, and
      new credentials are checked at most `CHECKS_PER_S` a second in all (a flood of
      distinct guesses from many addresses), one at a time;
    - a credential that was verified is accepted from any address, rate-limited or not; an
      address over its limit that has not logged in within the window is refused before
      its request is read (`refuse_early`: the server answers 429 from its accepting
      thread);
    - an unknown user costs as much as a known one (no user enumeration by timing).
    """

    def __init__(self, users: dict[str, str], clock=time.monotonic):
        self.users = dict(users)
        self.clock = clock
        self._salt = os.urandom(16)
        self._right: OrderedDict[bytes, None] = OrderedDict()
        self._wrong: OrderedDict[bytes, None] = OrderedDict()
        self._fails: OrderedDict[str, list] = OrderedDict()  # address -> [window start, n]
        self._passed: OrderedDict[str, float] = OrderedDict()  # address -> last success
        self._tokens, self._refilled = CHECKS_BURST, clock()
        self._lock = threading.Lock()  # the tables
        self._check_lock = threading.Lock()  # one hash check at a time
        self._dummy = next(iter(self.users.values()), "")
        self.hash_checks = 0  # password hashes verified (the expensive part)

    def check(self, user: str, password: str, client: str = "") -> bool:
        return self.verdict(user, password, client) == "ok"

    def header_verdict(self, header: str | None, client: str = "") -> str:
        """`verdict` of an `Authorization` header's basic credentials ("unauthorized" for a
        missing or malformed one): what the in-process server and the sidecar ask."""
        user, password = basic_credentials(header)
        if user is None:
            return "unauthorized"
        return self.verdict(user, password, client)

    def verdict(self, user: str, password: str, client: str = "") -> str:
        """"ok", "unauthorized" or "rate_limited" (refused without checking the password)."""
        key = hashlib.sha256(self._salt + f"{user}\0{password}".encode()).digest()
        with self._lock:
            if key in self._right:
                self._right.move_to_end(key)
                self._passed_now(client)
                return "ok"
            if key in self._wrong:
                self._wrong.move_to_end(key)
                self._failed(client)
                return "unauthorized"
            if self._limited(client) or not self._take_token():
                return "rate_limited"
        h = self.users.get(user)
        with self._check_lock:
            self.hash_checks += 1
            ok = verify_password(password, h if h is not None else self._dummy) and h is not None
        with self._lock:
            table, size = (self._right, CACHE_RIGHT) if ok else (self._wrong, CACHE_WRONG)
            table[key] = None
            if len(table) > size:
                table.popitem(last=False)
            if ok:
                self._passed_now(client)
            else:
                self._failed(client)
        return "ok" if ok else "unauthorized"

    def refuse_early(self, client: str) -> bool:
        """True for an address over its failure limit that has not logged in within the
        window: its next connections can be answered 429 before their request is read."""
        with self._lock:
            if not self._limited(client):
                return False
            t = self._passed.get(client)
            return t is None or self.clock() - t >= FAIL_WINDOW_S

    def _passed_now(self, client: str) -> None:
        self._passed[client] = self.clock()
        self._passed.move_to_end(client)
        if len(self._passed) > CLIENTS:
            self._passed.popitem(last=False)

    def _limited(self, client: str) -> bool:
        f = self._fails.get(client)
        return f is not None and self.clock() - f[0] < FAIL_WINDOW_S and f[1] >= FAIL_LIMIT

    def _failed(self, client: str) -> None:
        now = self.clock()
        f = self._fails.get(client)
        if f is None or now - f[0] >= FAIL_WINDOW_S:
            f = self._fails[client] = [now, 0]
        f[1] += 1
        self._fails.move_to_end(client)
        if len(self._fails) > CLIENTS:
            self._fails.popitem(last=False)

    def _take_token(self) -> bool:
        now = self.clock()
        self._tokens = min(CHECKS_BURST, self._tokens + (now - self._refilled) * CHECKS_PER_S)
        self._refilled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True
