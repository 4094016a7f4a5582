"""Typed settings of the extraction phase (wired into PipelineConfig by the pipeline)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from eyas.config_model import ConfigModel
from eyas.sglang_args import engine_args_problems


class ExtractConfig(ConfigModel):
    """How hidden states are extracted and stored."""

    aux_layers: list[int] | None = None
    """Auxiliary layers, eyas numbering (output of decoder layer i, as SGLang/SpecForge
    configs: [1, 29, 57] for 61 layers); None = the EAGLE-3 default for the target's depth."""
    storage: Literal["final", "topk", "compact"] = "final"
    """What is stored per token: "final" = aux states + the final-norm hidden state [H] (logits
    recomputed with the target's head when training, as SpecForge; 8·H bytes in bf16);
    "topk" = aux states + the target's top-k next-token ids and log-probabilities (about 6·H);
    "compact" = as "topk" with the aux states in float8 and one scale per token and layer
    (about 3·H: under half of SpecForge's 8·H)."""
    topk: int = Field(32, ge=1, le=1024)
    """K for storage "topk" and "compact"."""
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    """Storage dtype of hidden states for "final" and "topk" ("compact" stores float8); the
    target computes in its own dtype (backend "sglang": `engine_args` ``dtype`` changes that)."""
    compute_dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    """Dtype the target computes in with backend "hf": "auto" = bfloat16 on a GPU, float32 on
    a CPU; "bfloat16" on a CPU with AMX / AVX512-BF16 runs SmolLM2-135M's forward ~2.7× faster
    (893 against 327 tokens/s at 1,024 tokens, 2 cores). Recorded in the shards' settings
    when set (states computed otherwise are other states)."""
    shard_size: int = Field(256, ge=1)
    """Samples per shard; a shard is the unit of resume and retry."""
    batch_tokens: int = Field(16384, ge=1)
    """Padded tokens per forward batch (samples are sorted by length and padded)."""
    device: str = "auto"
    """Torch device: "auto" (cuda when available, else cpu), "cpu", "cuda", "cuda:1", ..."""
    disk_margin: float = Field(0.10, ge=0.0, le=10.0)
    """Extra free space required beyond the estimate, as a fraction of it (0.10 = 10 %)."""
    quarantine_nonfinite: bool = True
    """Drop samples whose states contain NaN/inf into ``quarantine.jsonl`` instead of storing them."""
    backend: Literal["hf", "sglang"] = "hf"
    """What runs the target: "hf" = transformers (CPU or GPU); "sglang" = SGLang 0.5.23's
    offline engine with eyas's capture hook (GPU hosts, installed as ``eyas[sglang]`` in its
    own environment; aux layers up to L-2)."""
    tp_size: int = Field(1, ge=1)
    """Tensor-parallel GPUs per SGLang engine (backend "sglang" only; "hf" uses `device`)."""
    spool_dir: str | None = None
    """Backend "sglang": folder where the capture hook writes each batch's tensors before they
    are gathered into a shard (about two batches, `batch_tokens` x bytes/token each, at a time:
    one being read while the engine writes the next; a fast local disk or /dev/shm); None = ``.sglang-spool`` beside the split folders
    (``<workdir>/hidden/.sglang-spool``)."""
    engine_args: dict[str, Any] = Field(default_factory=dict)
    """Backend "sglang": more arguments for SGLang's engine, by their ``ServerArgs`` names
    (``mem_fraction_static``, ``context_length``, ``chunked_prefill_size``,
    ``max_running_requests``, ``attention_backend``, ...); checked against SGLang 0.5.23's
    names. They replace eyas's defaults (``mem_fraction_static`` 0.85, ``chunked_prefill_size``
    -1); the arguments eyas sets for the capture (``model_path``, ``tp_size``, the capture
    flags, ``forward_hooks``, ``speculative_*``, ...) are refused."""

    @field_validator("engine_args")
    @classmethod
    def _known_engine_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        problems = engine_args_problems(value)
        if problems:
            raise ValueError("; ".join(problems))
        return value
    engine_timeout_s: float = Field(1800.0, gt=0)
    """Backend "sglang": seconds one engine call (one batch of `batch_tokens`) may take before
    the engine job stops with an error naming this field (a rank stuck in a collective would
    otherwise hold every GPU forever); the first call includes no model loading."""
