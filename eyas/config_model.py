"""The base of every settings model (`PipelineConfig`'s sections, `HostSpec`): unknown keys
refused, field docstrings as descriptions, and numbers taken strictly -- a YAML ``true`` is
not the number 1 (``steps: true`` would train one step), ``.inf`` and ``.nan`` are not numbers
(``lr: .inf`` would train nothing but NaNs)."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _numbers_only(annotation: Any) -> bool:
    """Whether `annotation` admits numbers (int, float) and perhaps None, nothing else."""
    if annotation in (int, float):
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _numbers_only(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return bool(members) and all(_numbers_only(a) for a in members)
    return False


class ConfigModel(BaseModel):
    """A settings model: extra keys refused, docstrings kept, numbers strict (see the module)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_true_or_false_as_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _numbers_only(field.annotation):
            raise ValueError(f"expected a number, got {str(value).lower()}")
        return value
