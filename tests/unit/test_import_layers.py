"""The import contract of the core package: `eyas/` in layers, each importing only from its own
layer and those below, and no module importing itself back through others (no import circle).

A phase's code may use the phases before it (extraction reads prepare's outputs, evaluation
trains nothing but reads training's model), never one after it; `eyas.config` assembles every
phase's section and `eyas.cli` drives them all, so they sit on top. The one exception is an
entry point: a function named ``main`` or ``*_main`` (``python -m eyas.preflight.run``,
``eyas status``) loads the pipeline config at the edge, as the CLI does. Imports under
``if TYPE_CHECKING:`` are annotations, not imports, and are not counted.

A new module or package of `eyas/` must be placed in `LAYERS` (the test says so).
"""

from __future__ import annotations

import ast
from pathlib import Path

from support.paths import REPO

EYAS = REPO / "eyas"

LAYERS: list[set[str]] = [
    # facts and mechanisms every phase uses
    {"errors", "io", "layout", "flags", "layers", "packaged", "disk", "diversity", "devices",
     "proc", "sglang_version", "sglang_args", "workdir_lock", "slots", "stopping", "config_model",
     "conversation", "hf", "verified", "manifest"},
    # targets: built, assembled, served
    {"hf_target", "gguf_target", "tiny", "serve"},
    {"prepare"},    # phases 1-3
    {"extract"},    # phase 4
    {"remote"},     # hosts: probing, shipping, running the phases there
    {"train"},      # phase 5
    {"evaluate"},   # phase 6
    {"preflight"},  # every phase, tried small
    {"config", "docgen", "cli"},  # the whole pipeline
]


def _unit(module: str) -> str:
    """``eyas.train.model`` -> ``train``; ``eyas.cli`` -> ``cli``."""
    return module.split(".")[1] if "." in module else ""


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(EYAS.rglob("*.py")):
        if "assets" in path.relative_to(EYAS).parts:
            continue
        name = ".".join(path.relative_to(EYAS.parent).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path, modules: dict[str, Path]) -> list[tuple[str, str]]:
    """``(imported eyas module, enclosing function or "")`` of every import in `path`, less
    those under ``if TYPE_CHECKING:``."""
    found: list[tuple[str, str]] = []

    def resolve(name: str) -> str | None:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in modules and name != "eyas" else None

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child, function)
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = function or node.name
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from eyas.train import fused_attention` imports the module eyas.train.fused_attention
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules
                     else node.module for a in node.names]
        for name in names:
            if name.startswith("eyas") and (target := resolve(name)):
                found.append((target, function))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


def _layer_of() -> dict[str, int]:
    return {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def _is_entry_point(function: str) -> bool:
    return function == "main" or function.endswith("_main")


def test_every_module_of_eyas_has_a_layer():
    units = {_unit(m) for m in _modules()} - {""}
    layer = _layer_of()
    assert sorted(units - set(layer)) == [], "place these in tests/unit/test_import_layers.py LAYERS"
    assert sorted(set(layer) - units) == []  # and nothing named there is gone


def test_no_module_imports_from_a_layer_above_it():
    modules, layer = _modules(), _layer_of()
    upward, at_the_edge = [], []
    for name, path in modules.items():
        if not _unit(name):
            continue
        for target, function in _imports(path, modules):
            if layer[_unit(target)] > layer[_unit(name)]:
                (at_the_edge if _is_entry_point(function) else upward).append(
                    f"{name} -> {target}" + (f" (in {function})" if function else ""))
    assert upward == []
    # At most two entry points a host runs without the ``eyas`` command, each loading the
    # pipeline config (eyas.config) where it starts; ``eyas status`` lives in eyas.cli.
    assert sorted(set(at_the_edge)) == [
        "eyas.preflight.run -> eyas.config (in main)",
        "eyas.prepare.phases -> eyas.config (in main)",
    ], at_the_edge


def test_no_import_circle():
    modules = _modules()
    graph = {name: {t for t, _ in _imports(path, modules) if t != name}
             for name, path in modules.items()}
    circles = _strongly_connected(graph)
    assert circles == []


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module (each an import circle), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sorted(found)


def test_the_contract_sees_upward_imports_circles_and_type_checking(tmp_path):
    """The checks themselves, on a package written here."""
    pkg = tmp_path / "eyas"
    (pkg / "train").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "train" / "__init__.py").write_text("")
    (pkg / "train" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from eyas.config import X\n"
        "def f():\n    from eyas.train.b import y\n")
    (pkg / "train" / "b.py").write_text("from eyas.train.a import f\nfrom eyas import cli\n")
    (pkg / "cli.py").write_text("def status_main():\n    from eyas.config import load\n")
    (pkg / "config.py").write_text("")
    modules = {".".join(p.relative_to(tmp_path).with_suffix("").parts).removesuffix(".__init__"): p
               for p in pkg.rglob("*.py")}
    assert _imports(pkg / "train" / "a.py", modules) == [("eyas.train.b", "f")]
    assert _imports(pkg / "train" / "b.py", modules) == [("eyas.train.a", ""), ("eyas.cli", "")]
    assert _imports(pkg / "cli.py", modules) == [("eyas.config", "status_main")]
    graph = {n: {t for t, _ in _imports(p, modules)} for n, p in modules.items()}
    assert _strongly_connected(graph) == [["eyas.train.a", "eyas.train.b"]]
    assert _is_entry_point("status_main") and not _is_entry_point("mainly")
