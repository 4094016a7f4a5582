"""Command-line flags derived from a typed config: a flag's name, type, choices and help are its
field's, so an entry point cannot restate a default that drifts from the config.

    parser = argparse.ArgumentParser()
    add_config_flags(parser, ExtractConfig)              # --storage, --topk, --shard-size, ...
    cfg = config_from_flags(ExtractConfig, parser.parse_args(argv), base={"storage": "topk"})

Every flag defaults to None ("not given"): the value comes from `base` (a YAML or JSON the
caller read), else from the config type's own default. Scalars (int, float, str, a Literal's
choices), booleans (``--x`` / ``--no-x``) and lists of ints (``--x 1,29,57``) become flags;
a nested section's fields become flags under its name (``mla.kv_lora_rank``: ``--mla-kv-lora-rank``);
other fields (tuples, dicts) are settable through `base` only.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from eyas.errors import ConfigError


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _flag_kind(annotation: Any) -> dict[str, Any] | None:
    """argparse keywords for a field's type, or None when it has no flag."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _flag_kind(inner[0]) if len(inner) == 1 else None
    if typing.get_origin(annotation) is Literal:
        return {"choices": list(args), "type": type(args[0])}
    if typing.get_origin(annotation) is list and args == (int,):
        return {"type": _int_list, "metavar": "I,J,..."}
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    if annotation in (int, float, str):
        return {"type": annotation}
    return None


def _section(annotation: Any) -> type[BaseModel] | None:
    """The model type of a nested section field, else None."""
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def add_config_flags(parser: argparse.ArgumentParser, model: type[BaseModel], *,
                     skip: tuple[str, ...] = (), _prefix: str = "") -> None:
    """Add one ``--field-name`` flag per settable field of `model` (except `skip`), and
    ``--section-field-name`` for the fields of a nested section."""
    group = parser.add_argument_group(f"{model.__name__} fields (default: the config's value)")
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        section = _section(field.annotation)
        if section is not None:
            add_config_flags(parser, section, _prefix=f"{_prefix}{name}__")
            continue
        kind = _flag_kind(field.annotation)
        if kind is None:
            continue
        default = field.get_default(call_default_factory=True)
        about = " ".join((field.description or "").split()).rstrip(".")
        help_text = f"{about} (default: {default})"
        dest = _prefix + name
        group.add_argument("--" + dest.replace("__", "-").replace("_", "-"), dest=dest,
                           default=None, help=help_text.replace("%", "%%"), **kind)  # argparse formats help


def config_from_flags(model: type[BaseModel], args: argparse.Namespace,
                      base: Mapping[str, Any] | None = None) -> Any:
    """`model` from `base` with the flags that were given on top; ConfigError when invalid."""
    fields = _given(model, args, base)
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg']}"
                             for e in exc.errors())
        raise ConfigError(f"invalid {model.__name__}: {problems}", where="flags") from None


def _given(model: type[BaseModel], args: argparse.Namespace, base: Mapping[str, Any] | None,
           prefix: str = "") -> dict[str, Any]:
    """`base` with the flags given for `model`'s fields (and its sections') on top."""
    fields = dict(base or {})
    for name, field in model.model_fields.items():
        section = _section(field.annotation)
        if section is not None:
            inner = fields.get(name)
            if inner is None or isinstance(inner, Mapping):
                given = _given(section, args, inner, f"{prefix}{name}__")
                if given:
                    fields[name] = given
            continue
        value = getattr(args, prefix + name, None)
        if value is not None:
            fields[name] = value
    return fields
