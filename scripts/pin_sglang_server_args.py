"""Write `eyas/sglang_args.py`'s tables of SGLang facts from an SGLang source tree.

    python scripts/pin_sglang_server_args.py /path/to/site-packages/sglang

SGLang 0.5.23 assembles ``ServerArgs`` from the namespace classes of
``srt/arg_groups/fields/*.py`` (each field an annotated class attribute). This script reads
those files as text (no import: SGLang needs its own torch) and writes the public field names,
one per line, sorted, into ``eyas/assets/sglang-<version>-server-args.txt``, the table
`eyas.sglang_args.SERVER_ARGS` reads; and the architectures SGLang accepts
``--language-model-only`` for (``ServerArgs.LANGUAGE_MODEL_ONLY_ARCHITECTURES`` in
``srt/server_args.py``, checked by ``handle_language_model_only`` on every engine start) into
``eyas/assets/sglang-<version>-language-model-only.txt``
(`eyas.sglang_args.PINNED_LANGUAGE_MODEL_ONLY`). Run it when eyas moves its SGLang pin;
``tests/unit/test_sglang_args.py`` holds both tables against SGLang's own ``ServerArgs`` where a
python with SGLang is at hand.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def field_names(sglang_dir: Path) -> list[str]:
    """Public (not ``_``-prefixed) fields of the namespace classes under
    ``srt/arg_groups/fields`` (classes with a ``_NS_PATH``), sorted."""
    names: set[str] = set()
    for path in sorted((sglang_dir / "srt" / "arg_groups" / "fields").glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.ClassDef):
                continue
            body = node.body
            if not any(isinstance(s, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "_NS_PATH" for t in s.targets) for s in body):
                continue
            names.update(s.target.id for s in body
                         if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                         and not s.target.id.startswith("_"))
    return sorted(names)


def language_model_only_architectures(sglang_dir: Path) -> list[str]:
    """``ServerArgs.LANGUAGE_MODEL_ONLY_ARCHITECTURES`` of ``srt/server_args.py`` (a tuple of
    string literals), in SGLang's order; ValueError when the class has no such tuple."""
    path = sglang_dir / "srt" / "server_args.py"
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            for stmt in node.body:
                if (isinstance(stmt, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == "LANGUAGE_MODEL_ONLY_ARCHITECTURES"
                        for t in stmt.targets)):
                    return [ast.literal_eval(e) for e in stmt.value.elts]
    raise ValueError(f"{path}: no ServerArgs.LANGUAGE_MODEL_ONLY_ARCHITECTURES tuple")


if __name__ == "__main__":
    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo))
    from eyas.sglang_version import SGLANG_VERSION

    # the path eyas.sglang_args.NAMES_FILE reads (that module needs the file to import)
    # the paths eyas.sglang_args.NAMES_FILE and LANGUAGE_MODEL_ONLY_FILE read (that module
    # needs the files to import)
    assets = repo / "eyas" / "assets"
    tables = {f"sglang-{SGLANG_VERSION}-server-args.txt": field_names(Path(sys.argv[1])),
              f"sglang-{SGLANG_VERSION}-language-model-only.txt":
                  language_model_only_architectures(Path(sys.argv[1]))}
    for name, lines in tables.items():
        (assets / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(assets / name)
