"""Export a trained drafter as a folder SGLang serves with ``--speculative-algorithm EAGLE3``.

The folder holds ``config.json``, ``model.safetensors`` and ``manifest.json`` (written last; the
folder is assembled under a temporary name and renamed). The evaluation later adds the model
card ``README.md`` (`eyas.evaluate.model_card`), outside the manifest's verified set: it
describes these weights, and a new export starts without one. What SGLang's
``LlamaForCausalLMEagle3`` needs, from reading its loader:

- ``architectures: ["LlamaForCausalLMEagle3"]``, ``num_hidden_layers: 1`` and the Llama fields
  (``hidden_size``, ``intermediate_size``, heads, ``head_dim``, ``rms_norm_eps``,
  ``rope_theta``, ``hidden_act``); ``vocab_size`` is the *target's* (its embedding is shared);
  ``draft_vocab_size`` sizes ``lm_head``; ``target_hidden_size`` sizes ``fc`` (3× it).
- ``tie_word_embeddings: false``: with true, SGLang makes ``lm_head`` the embedding and our head
  is never loaded.
- ``eagle_config.eagle_aux_hidden_state_layer_ids`` in SGLang's numbering for the target's
  model family (``eyas.layers.to_sglang_ids``: a DeepSeek-family target whose first layer is
  not 1 gets every id + 1, or SGLang would feed the drafter one layer early) and
  ``use_aux_hidden_state: true``. The manifest records the target's architecture, which is
  how `load_exported` reads the ids back (``eyas.layers.from_sglang_ids``).
- weights ``fc.weight``, ``midlayer.*`` (q/k/v/o, gate/up/down, ``input_layernorm``,
  ``hidden_norm``, ``post_attention_layernorm``), ``norm.weight``, ``lm_head.weight``, ``d2t``
  (int64 offsets, SGLang adds ``arange``), ``t2d`` (bool, read but unused by SGLang). SGLang
  skips names it does not know *silently*, which is why the tests hold these names against a
  written specification. No embedding is saved.

The MLA kind (``train.drafter: mla``) is written as ``Eagle3DeepseekV2ForCausalLM`` reads it
(`_mla_config`; its decoder layer as ``layers.0.*``): docs/training.md "Export".
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from eyas.errors import DataError
from eyas.io import read_json, write_json
from eyas.layers import from_sglang_ids, to_sglang_ids
from eyas.manifest import MANIFEST_NAME, write_manifest
from eyas.train.model import MLA_SIZES, Drafter, DrafterConfig
from eyas.train.vocab import DraftVocab

WEIGHTS = "model.safetensors"
ARCHITECTURE = "LlamaForCausalLMEagle3"
MLA_ARCHITECTURE = "Eagle3DeepseekV2ForCausalLM"
MLA_LAYER = "layers.0."
"""The MLA kind's checkpoint prefix of the decoder layer (SGLang maps it onto ``midlayer.``)."""


def sglang_config(cfg: DrafterConfig, aux_layers: list[int], *, dtype: str = "bfloat16",
                  target_config: dict | None = None, architecture: str | None = None) -> dict:
    """The ``config.json`` dict of an exported drafter. Token ids are copied from the target;
    `aux_layers` (eyas numbering) become SGLang's ids for a target of `architecture` (HF
    ``architectures[0]``; None: the Llama rule). Raises ConfigError when SGLang cannot capture
    them on that family (``eyas.layers.to_sglang_ids``)."""
    target_config = target_config or {}
    if cfg.attention == "mla":
        out = _mla_config(cfg, aux_layers, dtype, architecture)
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            if key in target_config:
                out[key] = target_config[key]
        return out
    out = {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.dim_per_head,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": cfg.max_position_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "torch_dtype": dtype,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": to_sglang_ids(aux_layers, architecture),
            "use_aux_hidden_state": True,
        },
    }
    for key in ("fc_norm", "norm_output"):  # EAGLE-3.1's options: written when set
        if getattr(cfg, key):
            out[key] = True
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if key in target_config:
            out[key] = target_config[key]
    return out


def _mla_config(cfg: DrafterConfig, aux_layers: list[int], dtype: str,
                architecture: str | None) -> dict:
    """``config.json`` of the MLA kind, as ``Eagle3DeepseekV2ForCausalLM`` reads it: a
    DeepSeek-V3 config (``model_type`` "deepseek_v3": transformers' class, whose rope
    parameters SGLang reads) with the EAGLE-3 fields. SGLang's model config recognises the
    architecture as MLA and sizes the draft KV cache from ``kv_lora_rank`` +
    ``qk_rope_head_dim``; ``rope_scaling`` carries the target's YaRN (the attention applies
    it and its mscale); ``rope_interleave`` true keeps SGLang's interleaved rotary pairs."""
    return {
        "architectures": [MLA_ARCHITECTURE],
        "model_type": "deepseek_v3",
        "num_hidden_layers": 1,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "q_lora_rank": cfg.q_lora_rank,
        "kv_lora_rank": cfg.kv_lora_rank,
        "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "v_head_dim": cfg.v_head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": dict(cfg.rope_scaling) if cfg.rope_scaling else None,
        "rope_interleave": cfg.rope_interleave,
        "max_position_embeddings": cfg.max_position_embeddings,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "fc_norm": cfg.fc_norm,
        "norm_output": cfg.norm_output,
        "torch_dtype": dtype,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": to_sglang_ids(aux_layers, architecture),
            "use_aux_hidden_state": True,
        },
    }


def checkpoint_name(cfg: DrafterConfig, name: str) -> str:
    """The exported name of a drafter parameter (the MLA kind: ``midlayer.`` as ``layers.0.``)."""
    if cfg.attention == "mla" and name.startswith("midlayer."):
        return MLA_LAYER + name[len("midlayer."):]
    return name


def parameter_name(cfg: DrafterConfig, name: str) -> str:
    """`checkpoint_name`'s inverse."""
    if cfg.attention == "mla" and name.startswith(MLA_LAYER):
        return "midlayer." + name[len(MLA_LAYER):]
    return name


def export_tensors(drafter: Drafter, vocab: DraftVocab, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The exported tensors: the drafter's parameters in `dtype`, plus ``d2t`` and ``t2d``."""
    if vocab.size != drafter.cfg.draft_vocab_size or vocab.vocab_size != drafter.cfg.vocab_size:
        raise DataError(
            f"draft vocabulary ({vocab.size} of {vocab.vocab_size}) does not match the drafter "
            f"(draft_vocab_size {drafter.cfg.draft_vocab_size}, vocab_size {drafter.cfg.vocab_size})",
            field="draft_vocab_size",
        )
    tensors = {checkpoint_name(drafter.cfg, name): p.detach().to("cpu", dtype).contiguous()
               for name, p in drafter.state_dict().items()}
    tensors["d2t"] = vocab.d2t.contiguous()
    tensors["t2d"] = vocab.t2d.contiguous()
    return tensors


def export_drafter(
    out_dir: Path,
    drafter: Drafter,
    vocab: DraftVocab,
    aux_layers: list[int],
    *,
    dtype: str = "bfloat16",
    target_config: dict | None = None,
    architecture: str | None = None,
    metrics: dict | None = None,
    inputs: dict[str, str | Path] | None = None,
) -> Path:
    """Write the SGLang drafter folder `out_dir` atomically; return it.

    `architecture` is the target's (HF ``architectures[0]``): it decides the SGLang layer ids
    (see `sglang_config`). `metrics` (e.g. the best evaluation) and `inputs` go into the
    manifest. Raises ConfigError (before writing anything) for layers SGLang cannot capture.
    """
    config = sglang_config(drafter.cfg, aux_layers, dtype=dtype, target_config=target_config,
                           architecture=architecture)
    out_dir = Path(out_dir)
    torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16,
                   "float32": torch.float32}[dtype]
    tmp = out_dir.parent / f".tmp-{out_dir.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_file(export_tensors(drafter, vocab, torch_dtype), str(tmp / WEIGHTS),
                  metadata={"format": "pt"})
        write_json(tmp / "config.json", config)
        write_manifest(tmp, phase="train-export", inputs=inputs,
                       outputs=["config.json", WEIGHTS], config=drafter.cfg.model_dump(),
                       counts={"metrics": metrics or {}, "draft_vocab_size": vocab.size,
                               "aux_layers": list(aux_layers),
                               "target_architecture": architecture})
        if out_dir.exists():
            old = out_dir.parent / f".old-{out_dir.name}-{os.getpid()}"
            out_dir.rename(old)
            tmp.rename(out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def load_exported(folder: Path, embed_VH: torch.Tensor, *,
                  architecture: str | None = None) -> tuple[Drafter, DraftVocab, list[int]]:
    """Read an exported folder back (float32): the drafter, its vocabulary, its aux layers
    in eyas numbering.

    The layer ids of ``config.json`` are SGLang's for the target's family: `architecture`
    (the target's ``architectures[0]``), else the one the export's manifest records, else the
    Llama rule (both numberings agree there). Raises DataError naming the file when ``d2t`` or
    a weight is missing, ConfigError when the ids cannot be read back for that family.
    """
    folder = Path(folder)
    config = read_json(folder / "config.json")
    tensors = load_file(str(folder / WEIGHTS))
    if "d2t" not in tensors:
        raise DataError("no d2t tensor: SGLang would draft from the wrong token ids",
                        path=folder / WEIGHTS, field="d2t")
    common = dict(
        hidden_size=config["hidden_size"], target_hidden_size=config["target_hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_attention_heads=config["num_attention_heads"],
        num_key_value_heads=config["num_key_value_heads"],
        vocab_size=config["vocab_size"], draft_vocab_size=config["draft_vocab_size"],
        rms_norm_eps=config["rms_norm_eps"], rope_theta=config["rope_theta"],
        max_position_embeddings=config["max_position_embeddings"],
    )
    if MLA_ARCHITECTURE in (config.get("architectures") or []):
        cfg = DrafterConfig(
            **common, attention="mla", **{k: config[k] for k in MLA_SIZES},
            rope_scaling=config.get("rope_scaling"),
            rope_interleave=config.get("rope_interleave", True),
            fc_norm=bool(config.get("fc_norm")), norm_output=bool(config.get("norm_output")))
    else:
        cfg = DrafterConfig(**common, head_dim=config.get("head_dim"),
                            fc_norm=bool(config.get("fc_norm")),
                            norm_output=bool(config.get("norm_output")))
    drafter = Drafter(cfg, embed_VH.float())
    vocab = DraftVocab.from_d2t(tensors.pop("d2t"), cfg.vocab_size)
    tensors.pop("t2d", None)
    missing, unexpected = drafter.load_state_dict(
        {parameter_name(cfg, k): v.float() for k, v in tensors.items()}, strict=False)
    if missing or unexpected:
        raise DataError(f"weights missing {missing}, unexpected {unexpected}",
                        path=folder / WEIGHTS)
    if architecture is None and (folder / MANIFEST_NAME).is_file():
        architecture = read_json(folder / MANIFEST_NAME).get("counts", {}).get("target_architecture")
    ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    return drafter, vocab, from_sglang_ids(ids, architecture, where=str(folder / "config.json"))
