"""Throwaway certificates for TLS tests, made with the `openssl` command line (one day valid)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def need_openssl() -> None:
    if shutil.which("openssl") is None:
        if os.environ.get("CI"):  # as promserver.require_binary: CI has it, missing fails
            pytest.fail("openssl is not installed (make test installs it with apt-get)")
        pytest.skip("openssl not installed; run `make prometheus`")


def make_ca(d: Path, name: str = "ca") -> tuple[Path, Path]:
    d.mkdir(parents=True, exist_ok=True)
    crt, key = d / f"{name}.crt", d / f"{name}.key"
    _openssl("req", "-x509", *EC, "-keyout", str(key), "-out", str(crt), "-days", "1",
             "-subj", f"/CN=zerodoc test {name}")
    return crt, key


def make_cert(d: Path, name: str, ca: tuple[Path, Path], san: str) -> tuple[Path, Path]:
    """A key and a certificate signed by `ca` with subjectAltName `san` (e.g. IP:127.0.0.1)."""
    crt, key, csr = d / f"{name}.crt", d / f"{name}.key", d / f"{name}.csr"
    _openssl("req", *EC, "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}",
             "-addext", f"subjectAltName={san}")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
             "-CAcreateserial", "-days", "1", "-out", str(crt), "-copy_extensions", "copy")
    return crt, key


def serial(crt: Path) -> str:
    out = subprocess.run(["openssl", "x509", "-noout", "-serial", "-in", str(crt)],
                         check=True, capture_output=True, text=True).stdout
    return out.strip().split("=", 1)[1].upper()
