"""The target's Hugging Face folder, flat or a multimodal wrapper: its text config, its text
model, and a flat view of it for servers that cannot read the wrapper.

Kimi-K2.5's folder is a vision-language wrapper: ``config.json`` names
``KimiK25ForConditionalGeneration`` (``model_type: kimi_k25``) and keeps the DeepSeek-V3 text
model's config under ``text_config`` (there ``model_type: kimi_k2``); the text model's weights
are named ``language_model.model.layers...``, ``language_model.lm_head.weight``, beside
``vision_tower.*`` and ``mm_projector.*``. SGLang serves that folder as it is; transformers
has no class for the wrapper (and eyas never runs Moonshot's own code). Everything eyas reads
of a target goes through this module:

- `text_config`: the language model's config dict (``text_config`` of a wrapper, else the
  config itself) — depth, width, vocabulary;
- `load_causal_lm`: the language model as a transformers causal LM. A flat folder loads with
  ``AutoModelForCausalLM``; a wrapper's text model is built from ``text_config`` with
  transformers' own class (``kimi_k2`` is DeepSeek-V3: `TEXT_MODEL_TYPES`) and gets the
  ``language_model.``-prefixed weights with the prefix taken off (the vision weights are not
  read);
- `serving_folder`: the folder a ``transformers serve`` of the target must load: the target
  itself, or for a wrapper a flat copy (text config, prefix-free weights, tokenizer files) made
  once in eyas's cache — only small targets (the Kimi replica) are ever served that way.

Errors name ``config.json`` and the field that is missing or unknown (DataError/ConfigError).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from eyas.errors import ConfigError, DataError
from eyas.io import read_json

WRAPPER_KEYS = ("text_config", "language_config", "llm_config")
"""Where a multimodal wrapper's config keeps its language model's config."""
WEIGHT_PREFIX = "language_model."
"""What a wrapper's text-model weight names start with (Kimi-K2.5, SGLang's loader strips it)."""
TEXT_MODEL_TYPES = {"kimi_k2": "deepseek_v3"}
"""Text ``model_type``s transformers does not know, and the transformers type of their layout."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
"""Files that hold a target's weights (their names and sizes are part of its fingerprint)."""
VIEW_ROOT = "text-views"
VIEW_SKIPS = ("config.json", "model.safetensors.index.json", "eyas_build.json", "manifest.json")
"""Files of a wrapper folder its flat view does not copy (rewritten, or the wrapper's own)."""


def read_config(model_dir: Path) -> dict[str, Any]:
    """``config.json`` of `model_dir` (DataError when missing or not JSON)."""
    return read_json(Path(model_dir) / "config.json")


def wrapper_key(config: dict[str, Any]) -> str | None:
    """The key holding a wrapper's language-model config, None for a flat config."""
    for key in WRAPPER_KEYS:
        if isinstance(config.get(key), dict) and "num_hidden_layers" in config[key]:
            return key
    return None


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config of a ``config.json`` dict: a wrapper's ``text_config``
    (its ``tie_word_embeddings`` taken from the outer config when set there), else `config`."""
    key = wrapper_key(config)
    if key is None:
        return config
    inner = config[key]
    return {**inner, "tie_word_embeddings": config.get(
        "tie_word_embeddings", inner.get("tie_word_embeddings", False))}


def architecture(config: dict[str, Any]) -> str | None:
    """The HF class the folder names (the outer one for a wrapper), None when none is named."""
    names = config.get("architectures") or text_config(config).get("architectures") or [None]
    return names[0] if isinstance(names, list) and names else None


def is_wrapper(model_dir: Path) -> bool:
    """True when `model_dir`'s config keeps its language model under a sub-key."""
    return wrapper_key(read_config(model_dir)) is not None


def _text_classes(model_dir: Path, text: dict[str, Any]) -> tuple[type, type]:
    """(config class, causal-LM class) of transformers for a wrapper's text model."""
    import transformers

    from eyas.hf import transformers_names

    config_mapping, causal_lm_mapping = transformers_names("CONFIG_MAPPING",
                                                           "MODEL_FOR_CAUSAL_LM_MAPPING")
    model_type = TEXT_MODEL_TYPES.get(text.get("model_type", ""), text.get("model_type", ""))
    if model_type not in config_mapping:
        raise ConfigError(f"text_config.model_type {text.get('model_type')!r} is not a "
                          f"transformers model type (known aliases: {TEXT_MODEL_TYPES})",
                          where=str(Path(model_dir) / "config.json"))
    config_cls = config_mapping[model_type]
    for name in text.get("architectures") or []:
        cls = getattr(transformers, name, None)
        if cls is not None and getattr(cls, "config_class", None) is config_cls:
            return config_cls, cls
    return config_cls, causal_lm_mapping[config_cls]


def _text_model_config(model_dir: Path, raw: dict[str, Any]) -> tuple[Any, type]:
    text = text_config(raw)
    config_cls, model_cls = _text_classes(model_dir, text)
    fields = {k: v for k, v in text.items() if k not in ("model_type", "architectures")}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if fields.get(key) is None and raw.get(key) is not None:
            fields[key] = raw[key]
    config = config_cls.from_dict(fields)
    config.architectures = [model_cls.__name__]
    return config, model_cls


def load_causal_lm(model_dir: Path, *, dtype: Any = None, trust_remote_code: bool = False) -> Any:
    """The target's language model as a transformers causal LM (in `dtype`, on the CPU).

    A flat folder loads with ``AutoModelForCausalLM`` (`trust_remote_code` passed on); a
    wrapper's text model is built from its text config and loads the ``language_model.``
    weights (module docstring). Raises ConfigError for a text model type transformers does not
    know, DataError when the wrapper's folder holds no ``language_model.`` weights.
    """
    from eyas.hf import transformers_names

    model_dir = Path(model_dir)
    raw = read_config(model_dir)
    if wrapper_key(raw) is None:
        (auto,) = transformers_names("AutoModelForCausalLM")
        return auto.from_pretrained(model_dir, dtype=dtype, trust_remote_code=trust_remote_code)
    if not any(name.startswith(WEIGHT_PREFIX) for name in _weight_names(model_dir)):
        raise DataError(f"a multimodal wrapper's config.json, but no weight is named "
                        f"{WEIGHT_PREFIX}* (expected Kimi-K2.5's layout)", path=model_dir)
    config, model_cls = _text_model_config(model_dir, raw)
    return model_cls.from_pretrained(model_dir, config=config, dtype=dtype,
                                     key_mapping={"^" + WEIGHT_PREFIX.replace(".", r"\."): ""})


def _weight_names(model_dir: Path) -> list[str]:
    return sorted(tensor_files(Path(model_dir)))


def target_fingerprint(model_dir: Path) -> str:
    """A short hash identifying a target: config.json bytes plus weight file names and sizes.

    Cheap (no weight bytes are read) and stable across copies of the same folder.
    """
    model_dir = Path(model_dir)
    config = model_dir / "config.json"
    if not config.exists():
        raise DataError("no config.json (not a Hugging Face model folder?)", path=config)
    h = hashlib.sha256(config.read_bytes())
    weights = sorted(p for p in model_dir.iterdir() if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    h.update(json.dumps([[p.name, p.stat().st_size] for p in weights]).encode())
    return h.hexdigest()[:16]


def tensor_files(model_dir: Path) -> dict[str, Path]:
    """Map tensor name -> safetensors file holding it (index file if any, else headers)."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json(index).get("weight_map", {})
        return {name: model_dir / fname for name, fname in weight_map.items()}
    from safetensors import safe_open

    out: dict[str, Path] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as fh:
            for name in fh.keys():
                out[name] = path
    return out


# -- a flat view for `transformers serve` -------------------------------------------------------
def serving_folder(model_dir: Path) -> Path:
    """The folder a ``transformers serve`` of `model_dir` loads: `model_dir` itself when flat,
    else its flat view's path in the cache (made by `ensure_serving_folder`)."""
    model_dir = Path(model_dir).expanduser().resolve()
    if not is_wrapper(model_dir):
        return model_dir
    from eyas.layout import cache_dir

    return cache_dir() / VIEW_ROOT / f"{model_dir.name}-{target_fingerprint(model_dir)}"


def ensure_serving_folder(model_dir: Path) -> Path:
    """`serving_folder`, made first when it is a wrapper's view not yet in the cache: the text
    config as ``config.json``, the text weights without their prefix, every other file (the
    tokenizer, its code, the generation config) copied. Written under a temporary name and
    renamed: the view appears complete or not at all."""
    import tempfile

    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    model_dir = Path(model_dir).expanduser().resolve()
    view = serving_folder(model_dir)
    if view == model_dir or view.is_dir():
        return view
    raw = read_config(model_dir)
    config, _ = _text_model_config(model_dir, raw)
    view.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".tmp-{view.name}-", dir=view.parent) as tmp_str:
        tmp = Path(tmp_str) / "view"
        tmp.mkdir()
        tensors: dict[str, torch.Tensor] = {}
        for path in sorted(model_dir.iterdir()):
            if path.suffix == ".safetensors":
                with safe_open(str(path), framework="pt") as fh:
                    for name in fh.keys():
                        if name.startswith(WEIGHT_PREFIX):
                            tensors[name[len(WEIGHT_PREFIX):]] = fh.get_tensor(name)
            elif path.is_file() and path.name not in VIEW_SKIPS:
                shutil.copy2(path, tmp / path.name)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config.save_pretrained(tmp)
        origin = {"wrapper": str(model_dir),
                  "config_sha256": hashlib.sha256((model_dir / "config.json").read_bytes())
                  .hexdigest()}
        (tmp / "eyas_view.json").write_text(json.dumps(origin, indent=1), encoding="utf-8")
        try:
            os.rename(tmp, view)
        except OSError:
            if not view.is_dir():  # another process made it first otherwise
                raise
    return view
