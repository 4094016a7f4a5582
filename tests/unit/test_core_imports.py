"""The core package `eyas` runs on GPU hosts without the control plane: every `eyas.*` module
imports with Prefect and Fabric (and Fabric's invoke and paramiko) made unimportable; and
every base dependency is one eyas/ imports."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

import pytest
from support.paths import REPO

BLOCKED = ("prefect", "fabric", "invoke", "paramiko")

# Runs in a fresh interpreter: a finder placed first refuses the control plane's packages, then
# every module of the eyas package is imported (``__main__`` modules run their command: skipped).
SCRIPT = """
import importlib, importlib.abc, json, pkgutil, sys

BLOCKED = set(sys.argv[1].split(","))

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None

sys.meta_path.insert(0, Refuse())
import eyas

failed, seen = {}, []
for info in pkgutil.walk_packages(eyas.__path__, "eyas."):
    if info.name.rsplit(".", 1)[-1] == "__main__":
        continue
    seen.append(info.name)
    try:
        importlib.import_module(info.name)
    except Exception as exc:
        failed[info.name] = f"{type(exc).__name__}: {exc}"
loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print(json.dumps({"seen": seen, "failed": failed, "loaded": loaded}))
"""


def test_every_core_module_imports_without_prefect_or_fabric():
    res = subprocess.run([sys.executable, "-c", SCRIPT, ",".join(BLOCKED)], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert report["failed"] == {}
    assert report["loaded"] == []
    # The walk really covered the package (a broken walk would pass vacuously).
    assert {"eyas.cli", "eyas.prepare.phases", "eyas.remote.hosts", "eyas.extract.run",
            "eyas.train.run", "eyas.disk", "eyas.flags"} <= set(report["seen"])


def test_the_blocking_finder_really_blocks():
    """The same script reports a module that needs a blocked package as failed."""
    probe = SCRIPT.replace("import eyas\n", "import eyas\nimport importlib as _i\n") + (
        "\ntry:\n    import prefect\nexcept ModuleNotFoundError:\n    print('blocked')\n")
    res = subprocess.run([sys.executable, "-c", probe, ",".join(BLOCKED)], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert res.stdout.strip().splitlines()[-1] == "blocked", res.stderr[-2000:]


def _base_dependencies() -> list[str]:
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml")

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return [re.split(r"[\s<>=!~;\[]", d, maxsplit=1)[0] for d in deps]


def _imported_top_levels() -> set[str]:
    """Top-level names of every module that some file of eyas/ imports (absolute imports)."""
    names = set()
    for path in (REPO / "eyas").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


def _unused(dists: list[str]) -> list[str]:
    """The distributions of `dists` none of whose top-level modules eyas/ imports."""
    from importlib.metadata import packages_distributions

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    provides: dict[str, set[str]] = {}
    for module, owners in packages_distributions().items():
        for owner in owners:
            provides.setdefault(norm(owner), set()).add(module)
    imported = _imported_top_levels()
    return [d for d in dists if not provides.get(norm(d), {norm(d).replace("-", "_")}) & imported]


def test_every_base_dependency_is_imported_by_the_core():
    """GPU hosts install the base dependencies: one eyas/ never imports is only weight (polars
    was declared and imported nowhere: ~180 MB; docs/benchmarks.md, "polars for the tables")."""
    deps = _base_dependencies()
    assert {"torch", "msgspec", "pyyaml"} <= set(deps)  # the parse really read the list
    assert _unused(deps) == []


def test_an_unimported_dependency_is_reported():
    """The check above can fail: polars (installed with the dev extra, imported nowhere in
    eyas/) is reported, pyyaml (imported as ``yaml``) is not."""
    assert _unused(["polars", "pyyaml"]) == ["polars"]
