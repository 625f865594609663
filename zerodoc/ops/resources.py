"""Where zerodoc's operations files are: one locator for a clone, an editable install and a wheel.

The operations files — Grafana dashboards and provisioning, Prometheus recording and alerting
rules and their promtool tests, the Prometheus / Alertmanager / Kubernetes configurations and
the runbooks — live at the top of the source tree (`dashboards/`, `rules/`, `exporters/`,
`docs/runbooks.md`). The wheel build copies them into the package as `zerodoc/_ops/` (see
`setup.py`), so an installed zerodoc finds the same tree there. Every command and generator
asks this module, never a path of its own.

Standard library only, no package-relative imports: `setup.py` loads this file by path to
read `BUNDLE`.
"""

from __future__ import annotations

from pathlib import Path

PACKAGED = "_ops"
"""Folder name of the copy inside the installed package."""

BUNDLE: tuple[str, ...] = ("dashboards", "rules", "exporters", "docs/runbooks.md")
"""What travels with the package, relative to the source tree's root."""

_PKG = Path(__file__).resolve().parents[1]
"""The `zerodoc` package folder (this module lives in `zerodoc/ops/`)."""


class ResourcesMissing(Exception):
    """The operations files are not where an installation keeps them."""


def candidates() -> list[Path]:
    """The places looked at, in order: the packaged copy, then the source tree."""
    return [_PKG / PACKAGED, _PKG.parent]


def _complete(root: Path) -> bool:
    return all((root / item).exists() for item in BUNDLE)


def root() -> Path:
    """The folder that holds `dashboards/`, `rules/`, `exporters/` and `docs/runbooks.md`."""
    for where in candidates():
        if _complete(where):
            return where
    looked = " and ".join(str(p) for p in candidates())
    raise ResourcesMissing(
        f"zerodoc's operations files ({', '.join(BUNDLE)}) are not in {looked}; this "
        "installation is incomplete: reinstall zerodoc from its wheel, or run from a clone")


def path(*parts: str) -> Path:
    """A file or folder of the bundle, e.g. ``path("exporters", "alertmanager.yml")``."""
    return root().joinpath(*parts)


def kind() -> str:
    """'package' when the copy inside the installed package is used, else 'source'."""
    return "package" if root() == candidates()[0] else "source"


def files() -> list[tuple[str, Path]]:
    """(relative path with '/', absolute path) of every file of the bundle, sorted."""
    base = root()
    out: list[tuple[str, Path]] = []
    for item in BUNDLE:
        p = base / item
        found = [p] if p.is_file() else sorted(q for q in p.rglob("*") if q.is_file())
        for q in found:
            if "__pycache__" in q.parts or q.suffix == ".pyc":
                continue
            out.append((q.relative_to(base).as_posix(), q))
    return sorted(out)


# Named places every command uses.
def dashboards_dir() -> Path:
    return path("dashboards")


def rules_dir() -> Path:
    return path("rules")


def kubernetes_dir() -> Path:
    return path("exporters", "kubernetes")


def alertmanager_config() -> Path:
    return path("exporters", "alertmanager.yml")


def runbooks() -> Path:
    return path("docs", "runbooks.md")
