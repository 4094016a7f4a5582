"""Write docs/configuration.md from the config types, so the docs cannot drift from the code.

    python -m eyas.docgen > docs/configuration.md
"""

from __future__ import annotations

import inspect
import typing

from pydantic import BaseModel

from eyas.config import PipelineConfig

HEADER = """# Configuration reference

Generated from `eyas/config.py` by `python -m eyas.docgen > docs/configuration.md`
(a test fails when this file is stale). A pipeline is one YAML file; relative paths in it are
resolved against the YAML's folder. `eyas check-config --config FILE` validates one.
Unknown keys are refused (a typo never silently falls back to a default).
"""


def _type_name(annotation: typing.Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation).replace("typing.", "")
    # A bare "|" would split the markdown table's cell, even inside a code span (GFM).
    return text.replace("NoneType", "None").replace("|", "\\|")


def _section(path: str, model: type[BaseModel], out: list[str]) -> None:
    out += [f"## `{path}`", "", inspect.cleandoc(model.__doc__ or ""), "", "| field | type | default | meaning |",
            "|---|---|---|---|"]
    nested = []
    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        ann = field.annotation
        if field.is_required():
            default = "required"
        elif field.default_factory is not None:
            default = "(see below)" if isinstance(ann, type) and issubclass(ann, BaseModel) else repr(field.default_factory())
        else:
            default = repr(field.default)
        args = typing.get_args(ann)
        sub = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
        if sub is None and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
            sub = args[0]
        desc = (field.description or (sub.__doc__ if sub else "") or "").strip().replace("\n", " ")
        out.append(f"| `{name}` | `{_type_name(ann)}` | `{default}` | {desc} |")
        if sub is not None:
            nested.append((f"{path}.{name}" if path != "(top level)" else name, sub))
    out.append("")
    for sub_path, sub in nested:
        _section(sub_path + ("[]" if sub.__name__ == "DatasetConfig" else ""), sub, out)


def render() -> str:
    """The whole reference as markdown."""
    out = [HEADER]
    _section("(top level)", PipelineConfig, out)
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
