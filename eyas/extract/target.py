"""The target model as extraction sees it: its shape, a fingerprint, and its head tensors.

Nothing here loads the whole model: the fingerprint hashes ``config.json`` plus the weight
files' names and sizes, and the embedding / LM-head loaders open only the one tensor they
need from the safetensors files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from eyas.errors import ConfigError, DataError
from eyas.hf_target import (  # noqa: F401 - target_fingerprint: re-exported for its callers
    architecture,
    target_fingerprint,
    tensor_files,
    text_config,
)
from eyas.io import read_json
from eyas.layers import default_aux_layers, validate_layers

EMBED_NAMES = ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight",
               "language_model.model.embed_tokens.weight", "transformer.wte.weight")
HEAD_NAMES = ("lm_head.weight", "language_model.lm_head.weight", "output.weight")
FINAL_NORM_NAMES = ("model.norm.weight", "model.language_model.norm.weight",
                    "language_model.model.norm.weight", "transformer.ln_f.weight")


@dataclass(frozen=True)
class TargetShape:
    """What extraction needs to know about a target: depth, width, vocabulary."""

    num_layers: int
    hidden_size: int
    vocab_size: int
    tie_word_embeddings: bool
    architecture: str | None = None
    """HF ``architectures[0]`` of the folder's config.json (the outer class for multimodal
    targets such as Kimi-K2.5); None when the config names none."""


def target_shape(model_dir: Path) -> TargetShape:
    """Depth, hidden size and vocabulary of the target in `model_dir` (from config.json).

    Raises DataError naming config.json and the missing field.
    """
    path = Path(model_dir) / "config.json"
    raw = read_json(path)
    config = text_config(raw)  # Kimi-K2.5: the wrapper's text_config
    for field in ("num_hidden_layers", "hidden_size", "vocab_size"):
        if not isinstance(config.get(field), int):
            raise DataError(f"missing or not an integer (got {config.get(field)!r})", path=path,
                            field=field)
    return TargetShape(
        num_layers=config["num_hidden_layers"],
        hidden_size=config["hidden_size"],
        vocab_size=config["vocab_size"],
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        architecture=architecture(raw),
    )


def resolve_aux_layers(model_dir: Path, aux_layers: Sequence[int] | None,
                       *, expected_hidden_size: int | None = None) -> tuple[list[int], TargetShape]:
    """The auxiliary layers to capture for this target, checked against its depth and width.

    `aux_layers` None means the EAGLE-3 default for the target's depth. Raises ConfigError
    (naming the layer and the depth) when a layer does not exist in the target, and when
    `expected_hidden_size` (for example from shards already written) differs from the
    target's hidden size -- refused before any forward pass.
    """
    shape = target_shape(model_dir)
    ids = (default_aux_layers(shape.num_layers) if aux_layers is None
           else validate_layers(list(aux_layers), shape.num_layers))
    if expected_hidden_size is not None and expected_hidden_size != shape.hidden_size:
        raise ConfigError(
            f"target {model_dir} has hidden size {shape.hidden_size}, but existing shards were "
            f"written with hidden size {expected_hidden_size} (different target?)",
            where="target.model",
        )
    return ids, shape


def _load_one(model_dir: Path, names: Sequence[str], suffix: str) -> torch.Tensor | None:
    files = tensor_files(model_dir)
    found = next((n for n in names if n in files), None)
    if found is None:
        found = next((n for n in sorted(files) if n.endswith(suffix)), None)
    if found is None:
        return None
    with safe_open(str(files[found]), framework="pt") as fh:
        return fh.get_tensor(found)


def load_target_embeddings(model_dir: Path) -> torch.Tensor:
    """The target's token embedding [V, H], read alone from its safetensors files.

    Raises DataError when no embedding tensor is found (names tried: ``EMBED_NAMES``, then
    any ``*embed_tokens.weight``).
    """
    model_dir = Path(model_dir)
    weight = _load_one(model_dir, EMBED_NAMES, "embed_tokens.weight")
    if weight is None:
        raise DataError(f"no token embedding tensor (tried {', '.join(EMBED_NAMES)})",
                        path=model_dir)
    return weight


def load_target_final_norm(model_dir: Path) -> torch.Tensor | None:
    """The weight [H] of the target's final norm (the one before its head), or None when no
    tensor has one of the names ``FINAL_NORM_NAMES`` (layer norms end in ``norm.weight``
    too, so no suffix is guessed)."""
    files = tensor_files(Path(model_dir))
    found = next((n for n in FINAL_NORM_NAMES if n in files), None)
    if found is None:
        return None
    with safe_open(str(files[found]), framework="pt") as fh:
        return fh.get_tensor(found)


def load_target_lm_head(model_dir: Path) -> torch.Tensor:
    """The target's LM head [V, H]; the embedding when the target ties them.

    Raises DataError when neither is found.
    """
    model_dir = Path(model_dir)
    if not target_shape(model_dir).tie_word_embeddings:
        weight = _load_one(model_dir, HEAD_NAMES, "lm_head.weight")
        if weight is not None:
            return weight
    return load_target_embeddings(model_dir)


MLA_ATTENTION_WEIGHTS = ("q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa",
                         "kv_a_layernorm", "kv_b_proj", "o_proj")
"""The attention weights of a DeepSeek-V3/Kimi-K2 decoder layer (``self_attn.<name>.weight``)."""


def load_target_attention(model_dir: Path, layer: int) -> dict[str, torch.Tensor]:
    """The MLA attention weights of the target's decoder layer `layer`, by short name
    (``q_a_proj`` ...), read alone from its safetensors files (any prefix: a wrapper's
    ``language_model.model.layers.N`` too).

    Raises DataError naming the missing tensor, or one stored in a dtype torch cannot widen
    exactly (a quantized checkpoint's attention)."""
    files = tensor_files(Path(model_dir))
    out = {}
    for short in MLA_ATTENTION_WEIGHTS:
        suffix = f"layers.{layer}.self_attn.{short}.weight"
        name = next((n for n in sorted(files) if n == suffix or n.endswith("." + suffix)), None)
        if name is None:
            raise DataError(f"no tensor *{suffix} (train.mla.init_attention: target needs the target's "
                            "MLA attention)", path=model_dir)
        with safe_open(str(files[name]), framework="pt") as fh:
            weight = fh.get_tensor(name)
        if weight.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise DataError(f"{name} is stored as {weight.dtype}; train.mla.init_attention: target reads "
                            "bf16/fp16/fp32 attention weights", path=files[name])
        out[short] = weight
    return out
