"""Build hook: put the operations files into the wheel (metadata lives in pyproject.toml).

`dashboards/`, `rules/`, `exporters/` and `docs/runbooks.md` stay at the top of the source
tree; `build_py` copies them to `zerodoc/_ops/` in the build, which is where
`zerodoc.ops.resources` finds them once installed. An editable install reads them from the
source tree instead, so nothing is copied there.
"""

import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _resources():
    spec = importlib.util.spec_from_file_location("_zerodoc_resources",
                                                  HERE / "zerodoc" / "ops" / "resources.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class BuildPyWithOps(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        res = _resources()
        dest = Path(self.build_lib) / "zerodoc" / res.PACKAGED
        if dest.exists():
            shutil.rmtree(dest)
        for item in res.BUNDLE:
            src = HERE / item
            if not src.exists():
                raise SystemExit(f"zerodoc build: {item} is missing from the source tree")
            target = dest / item
            target.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, target, ignore=shutil.ignore_patterns(
                    "__pycache__", "*.pyc"))
            else:
                shutil.copy2(src, target)


setup(cmdclass={"build_py": BuildPyWithOps})
