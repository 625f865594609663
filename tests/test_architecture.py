"""docs/architecture.md and docs/index.md against the tree: what they name exists, and nothing
the tree has at the top (or as a package folder) is left out."""

from __future__ import annotations

import re

from tests.support.helpers import ROOT

ARCH = ROOT / "docs" / "architecture.md"
PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w.-]*|[\w-]+\.(?:py|md|yml|toml|json))(?![\w/])")


def layout_block() -> str:
    blocks = re.findall(r"```text\n(.*?)```", ARCH.read_text(), flags=re.S)
    assert len(blocks) == 1, "docs/architecture.md has one ```text layout block"
    return blocks[0]


def named_paths(block: str) -> set[str]:
    return {m.rstrip(".,;:") for m in PATH.findall(block)}


def test_path_pattern_finds_what_a_line_names():
    names = named_paths("zerodoc/shim/          hooks, see zerodoc/x.py and bench/a.py, ...\n"
                        "tests/conftest.py (the slow mark)\n")
    assert names == {"zerodoc/shim/", "zerodoc/x.py", "bench/a.py", "tests/conftest.py"}


def test_every_path_the_layout_names_exists():
    missing = sorted(p for p in named_paths(layout_block()) if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def tracked_top_level_dirs() -> set[str]:
    skip = {"zerodoc-runs", "dist", "build", "shared"}  # ignored outputs, the device's share
    return {p.name + "/" for p in ROOT.iterdir()
            if p.is_dir() and not p.name.startswith(".") and p.name not in skip
            and not p.name.endswith(".egg-info") and any(p.iterdir())}


def test_every_top_level_folder_and_package_folder_is_named():
    names = named_paths(layout_block())
    packages = {f"zerodoc/{p.name}/" for p in (ROOT / "zerodoc").iterdir()
                if (p / "__init__.py").exists()}
    assert packages, "no package folders found under zerodoc/"
    unnamed = sorted((tracked_top_level_dirs() | packages) - names)
    assert not unnamed, f"docs/architecture.md does not name: {unnamed}"


def test_docs_index_lists_every_doc():
    index = (ROOT / "docs" / "index.md").read_text()
    linked = set(re.findall(r"\]\(([\w-]+\.md)(?:#[\w-]*)?\)", index))
    docs = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert docs - linked == set(), f"docs/index.md does not list {sorted(docs - linked)}"
    assert linked - docs == set(), f"docs/index.md links missing docs {sorted(linked - docs)}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_is_a_manual_whose_links_resolve():
    """The README stays a manual (under 300 lines; the lab notebook lives in docs/), and every
    relative link of the README and of docs/ points at a file that exists (and, from the
    README, at a heading that exists)."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 300, len(readme.splitlines())
    assert "docs/index.md" in readme
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and page.name == "README.md" and dest.suffix == ".md":
                text = dest.read_text()
                heads = {slug(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}
                heads |= set(re.findall(r'<a id="([^"]+)"></a>', text))
                if anchor not in heads:
                    broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken


def test_package_top_level_holds_at_most_14_modules():
    """One package per role: the top of `zerodoc/` keeps the vocabulary, the plain-Python
    engines and the entry points; commands live in cli/, operations in ops/ (issue 21)."""
    top = sorted(p.name for p in (ROOT / "zerodoc").glob("*.py"))
    assert len(top) <= 14, top


PRIVATE_FSDP = re.compile(
    r"^\s*(?:from|import)\s+torch\.distributed\.(?:fsdp\._|_composable)"  # from/import x._y
    r"|^\s*from\s+torch\.distributed(?:\.fsdp)?\s+import\s+[^#\n]*\b(?:_fully_shard|_composable)"
    r"|import_module\(\s*[\"']torch\.distributed\.(?:fsdp\._|_composable)", re.M)


def test_fsdp2_internals_are_imported_only_by_hookpoints():
    """FSDP's private modules are named in one place (zerodoc/shim/hookpoints.py, with the
    versions checked, beside the other hook points); everything else, the demo and the GPU
    check's set-up included, goes through its functions."""
    for line in ("    from torch.distributed.fsdp._fully_shard._fsdp_api import X",
                 "from torch.distributed.fsdp import _fully_shard",
                 "from torch.distributed import _composable as c",
                 "m = importlib.import_module('torch.distributed.fsdp._fully_shard')"):
        assert PRIVATE_FSDP.search(line), line
    for line in ("from torch.distributed.fsdp import FSDPModule, fully_shard",
                 "import torch.distributed.fsdp"):
        assert not PRIVATE_FSDP.search(line), line
    found = sorted(str(p.relative_to(ROOT)) for d in ("zerodoc", "bench")
                   for p in (ROOT / d).rglob("*.py")
                   if p.name != "hookpoints.py" and PRIVATE_FSDP.search(p.read_text()))
    assert not found, f"import FSDP's private modules outside hookpoints.py: {found}"
