"""Text every machine has: the Python standard library's sources and docstrings.

The tiny target's tokenizer, training data and demo datasets are all made from this, offline
and deterministically (sorted listings, no imports of the modules: docstrings are read with
`ast`, so nothing is executed). The same Python version gives the same text; the fingerprint
records which text was used.
"""

from __future__ import annotations

import ast
import hashlib
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Folders that are machine-specific, generated tables, tests or duplicated code.
_SKIP_DIRS = {
    "site-packages",
    "dist-packages",
    "test",
    "tests",
    "idlelib",
    "turtledemo",
    "lib2to3",
    "distutils",
    "ensurepip",
    "encodings",
    "__pycache__",
    "pydoc_data",
    "lib-dynload",
}


def stdlib_root() -> Path:
    """The folder of the running interpreter's pure-Python standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files() -> list[Path]:
    """Sorted `.py` files of the standard library, without tests and generated files."""
    root = stdlib_root()
    out = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(part in _SKIP_DIRS or part.startswith("config-") for part in rel.parts[:-1]):
            continue
        if rel.name.startswith("_sysconfigdata"):
            continue
        out.append(path)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def module_name(path: Path) -> str:
    """Dotted module name of a stdlib file (``json/__init__.py`` -> ``json``)."""
    rel = path.relative_to(stdlib_root()).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def read_source(path: Path) -> str:
    """A source file's text; undecodable bytes are replaced, so every file reads."""
    return path.read_bytes().decode("utf-8", errors="replace")


def source_texts(*, per_file_chars: int = 4000, total_chars: int = 2_500_000) -> list[str]:
    """The first `per_file_chars` of each stdlib file, in sorted order, `total_chars` at most."""
    texts, used = [], 0
    for path in stdlib_files():
        text = read_source(path)[:per_file_chars]
        if used + len(text) > total_chars:
            break
        texts.append(text)
        used += len(text)
    return texts


def tokenizer_texts() -> list[str]:
    """What the tiny tokenizer is trained on: source openings, then every docstring."""
    return source_texts() + [item.doc for item in iter_docitems()]


@dataclass(frozen=True)
class DocItem:
    """One documented object: ``json.dumps`` (function), ``heapq`` (module), ..."""

    name: str
    """Dotted name, e.g. ``json.dumps`` or ``collections.OrderedDict.move_to_end``."""
    kind: str
    """One of ``module``, ``class``, ``function``, ``method``."""
    doc: str
    """The cleaned docstring (``inspect.cleandoc`` form)."""
    signature: str
    """``(a, b=1)`` for functions and methods, empty otherwise."""
    module: str
    """The dotted module that defines it (the name itself for a module)."""


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    try:
        return "(" + ast.unparse(node.args) + ")"
    except Exception:  # noqa: BLE001 - a signature is decoration only
        return "()"


def iter_docitems() -> Iterator[DocItem]:
    """Every public module, class, function and method with a docstring, in a stable order.

    Files that do not parse under the running interpreter are skipped.
    """
    for path in stdlib_files():
        modname = module_name(path)
        if any(part.startswith("_") for part in modname.split(".")):
            continue
        try:
            tree = ast.parse(read_source(path))
        except SyntaxError:
            continue
        doc = ast.get_docstring(tree)
        if doc:
            yield DocItem(modname, "module", doc, "", modname)
        for node in tree.body:
            yield from _node_items(node, modname, modname, in_class=False)


def _node_items(node: ast.AST, prefix: str, module: str, *, in_class: bool) -> Iterator[DocItem]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if node.name.startswith("_"):
            return
        doc = ast.get_docstring(node)
        if doc:
            kind = "method" if in_class else "function"
            yield DocItem(f"{prefix}.{node.name}", kind, doc, _signature(node), module)
    elif isinstance(node, ast.ClassDef):
        if node.name.startswith("_") or in_class:
            return
        name = f"{prefix}.{node.name}"
        doc = ast.get_docstring(node)
        if doc:
            yield DocItem(name, "class", doc, "", module)
        for child in node.body:
            yield from _node_items(child, name, module, in_class=True)


def corpus_fingerprint() -> str:
    """Hash of the Python version and the listed files' names and sizes (cheap, stable)."""
    h = hashlib.sha256(sys.version.split()[0].encode())
    root = stdlib_root()
    for path in stdlib_files():
        h.update(f"{path.relative_to(root).as_posix()}:{path.stat().st_size}\n".encode())
    return h.hexdigest()[:16]
