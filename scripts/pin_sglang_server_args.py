"""Write `eyas/sglang_args.py`'s table of SGLang server-argument names from an SGLang source tree.

    python scripts/pin_sglang_server_args.py /path/to/site-packages/sglang

SGLang 0.5.23 assembles ``ServerArgs`` from the namespace classes of
``srt/arg_groups/fields/*.py`` (each field an annotated class attribute). This script reads
those files as text (no import: SGLang needs its own torch) and writes the public field names,
one per line, sorted, into ``eyas/assets/sglang-<version>-server-args.txt``, the table
`eyas.sglang_args.SERVER_ARGS` reads. Run it when eyas moves its SGLang pin;
``tests/test_sglang_args.py`` holds the table against SGLang's own ``ServerArgs`` where a
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


if __name__ == "__main__":
    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo))
    from eyas.extract.sglang_version import SGLANG_VERSION

    # the path eyas.sglang_args.NAMES_FILE reads (that module needs the file to import)
    out = repo / "eyas" / "assets" / f"sglang-{SGLANG_VERSION}-server-args.txt"
    out.write_text("\n".join(field_names(Path(sys.argv[1]))) + "\n", encoding="utf-8")
    print(out)
