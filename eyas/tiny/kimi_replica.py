"""Build (once) and cache the Kimi replica target: Kimi-K2.5's shape at toy size.

``build_kimi_replica()`` returns ``<cache>/kimi-replica-v2``, a model folder that stands in
for Kimi-K2.5 wherever eyas must prove it handles Kimi's kind of target on CPU, in Kimi-K2.5's
outer layout (see `eyas.hf_target`):

- ``config.json`` as Kimi-K2.5's: ``architectures: ["KimiK25ForConditionalGeneration"]``,
  ``model_type: kimi_k25``, the DeepSeek-V3 text model under ``text_config`` (``model_type:
  kimi_k2``, ``architectures: ["DeepseekV3ForCausalLM"]``) and a (tiny) ``vision_config``;
- the text model's weights named as Kimi-K2.5's checkpoint names them
  (``language_model.model.layers.*``, ``language_model.model.embed_tokens.weight``,
  ``language_model.lm_head.weight``); no vision weights (no image ever reaches eyas);

- the tokenizer of `eyas.tiny.kimi_tokenizer`: a slow tiktoken tokenizer with Kimi's
  pre-tokenizer pattern, special tokens and chat template, whose class ships in the folder
  and loads only with ``trust_remote_code``;
- a seeded random DeepSeek-V3 text model (`eyas.tiny.random_models`, ``deepseek_v3``:
  multi-head latent attention, mixture of experts, 7 layers, transformers' own classes), which
  eyas loads from the wrapper with `eyas.hf_target.load_causal_lm`;
- ``generation_config.json`` stopping at ``<|im_end|>`` (and ``[EOS]``), as Kimi's does;
- ``eyas_build.json`` (written last: a folder without it is partial) and ``manifest.json``.

Weights are random: answers are noise, but every shape, config field and file the pipeline
reads is Kimi's kind. Building takes well under a minute; later calls, from any process,
return the cached folder. Concurrent callers wait on a file lock; the folder appears complete
or not at all; a build of other code (any of the modules it is made from changed) is rebuilt.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from eyas.errors import EyasError
from eyas.io import read_json, write_json
from eyas.manifest import config_fingerprint, write_manifest

REPLICA_NAME = "kimi-replica-v2"  # v2: Kimi-K2.5's wrapper layout
BUILD_INFO = "eyas_build.json"
SEED = 0
_SOURCES = (  # the modules whose code decides the folder's bytes
    "eyas.tiny.kimi_replica",
    "eyas.tiny.kimi_tokenizer",
    "eyas.tiny.kimi_template",
    "eyas.tiny.tokenization_kimi_like",
    "eyas.tiny.random_models",
)
WRAPPER_ARCHITECTURE = "KimiK25ForConditionalGeneration"
WRAPPER_MODEL_TYPE = "kimi_k25"
TEXT_MODEL_TYPE = "kimi_k2"  # what Kimi-K2.5's text_config names its (DeepSeek-V3) model
VISION_CONFIG = {  # MoonViT's fields at toy size; SGLang builds the tower from them
    "patch_size": 14, "init_pos_emb_height": 8, "init_pos_emb_width": 8,
    "init_pos_emb_time": 4, "pos_emb_type": "divided_fixed", "num_attention_heads": 2,
    "num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64,
    "merge_kernel_size": [2, 2], "video_attn_type": "spatial_temporal",
    "merge_type": "sd2_tpool", "mm_projector_type": "patchmerger", "mm_hidden_size": 32,
    "projector_hidden_act": "gelu", "projector_ln_eps": 1e-5,
}


def recipe_fingerprint() -> str:
    """What a build depends on: the code of the modules above and the training text."""
    import importlib

    from eyas.tiny.corpus import corpus_fingerprint

    code = {}
    for name in _SOURCES:
        path = Path(importlib.import_module(name).__file__)
        code[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return config_fingerprint({"code": code, "corpus": corpus_fingerprint(), "seed": SEED})


def is_complete(folder: Path) -> bool:
    """True when `folder` is a finished build of the current code."""
    info = folder / BUILD_INFO
    if not (info.is_file() and (folder / "model.safetensors").is_file()):
        return False
    try:
        return read_json(info).get("recipe") == recipe_fingerprint()
    except EyasError:
        return False


def build_kimi_replica(*, force: bool = False) -> Path:
    """The cached Kimi replica folder, built first if missing, stale or `force` is set.

    The cache root is ``$EYAS_CACHE_DIR`` or ``~/.cache/eyas``.
    """
    from eyas.tiny.build import build_cached

    return build_cached(REPLICA_NAME, _build_into, is_complete, force=force)


def _build_into(folder: Path) -> None:
    """Tokenizer, model and records, all into `folder` (which must not exist)."""
    import json
    import tempfile

    import transformers
    from transformers import AutoTokenizer

    from eyas.tiny.kimi_template import END_OF_TURN
    from eyas.tiny.kimi_tokenizer import build_kimi_tokenizer
    from eyas.tiny.random_models import build_random_model

    folder.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix=".tmp-kimi-tok-", dir=folder.parent) as tok_dir:
        build_kimi_tokenizer(Path(tok_dir))
        build_random_model("deepseek_v3", folder, tokenizer_dir=Path(tok_dir), seed=SEED)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    gen_path = folder / "generation_config.json"
    gen = json.loads(gen_path.read_text(encoding="utf-8"))
    gen["eos_token_id"] = [tokenizer.convert_tokens_to_ids(END_OF_TURN), tokenizer.eos_token_id]
    write_json(gen_path, gen)
    config = wrap_as_kimi_k25(folder)
    outputs = sorted(p.name for p in folder.iterdir() if p.is_file())
    write_manifest(
        folder,
        phase="kimi-replica",
        outputs=outputs,
        config={"arch": "deepseek_v3", "seed": SEED},
        counts={"vocab_size": len(tokenizer),
                "num_hidden_layers": config["text_config"]["num_hidden_layers"]},
    )
    info = {
        "name": REPLICA_NAME,
        "recipe": recipe_fingerprint(),
        "vocab_size": len(tokenizer),
        "transformers": transformers.__version__,
    }
    write_json(folder / BUILD_INFO, info)  # last: marks the folder complete


def wrap_as_kimi_k25(folder: Path) -> dict:
    """Turn the flat DeepSeek-V3 model folder `folder` into Kimi-K2.5's outer layout, in place:
    the config nested under ``text_config`` of a ``KimiK25ForConditionalGeneration`` config,
    every weight renamed ``language_model.<name>``. Returns the new config."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    from eyas.hf_target import WEIGHT_PREFIX

    flat = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    text = {**flat, "model_type": TEXT_MODEL_TYPE, "architectures": ["DeepseekV3ForCausalLM"]}
    vision = {**VISION_CONFIG, "text_hidden_size": flat["hidden_size"]}
    outer = {
        "architectures": [WRAPPER_ARCHITECTURE],
        "model_type": WRAPPER_MODEL_TYPE,
        "bos_token_id": flat.get("bos_token_id"),
        "eos_token_id": flat.get("eos_token_id"),
        "pad_token_id": flat.get("pad_token_id"),
        "tie_word_embeddings": flat.get("tie_word_embeddings", False),
        "dtype": flat.get("dtype") or flat.get("torch_dtype"),
        "text_config": text,
        "vision_config": vision,
    }
    weights = folder / "model.safetensors"
    with safe_open(str(weights), framework="pt") as fh:
        tensors = {WEIGHT_PREFIX + name: fh.get_tensor(name) for name in fh.keys()}
    save_file(tensors, str(weights), metadata={"format": "pt"})
    write_json(folder / "config.json", outer)
    return outer
