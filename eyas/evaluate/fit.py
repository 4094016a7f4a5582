"""Does the target fit the device that would evaluate it offline? (`EvaluateConfig.offline`)

The offline evaluator loads the whole target with transformers on ONE device. For a target of
a trillion parameters (Kimi-K2.5: ~595 GB of weights) on a 96 GB GPU that load fails, so with
``offline: auto`` the flow skips it, says why, and goes on to the serving benchmark (SGLang
spreads the target over the host's GPUs).

    python -m eyas.evaluate.fit MODEL_DIR [--nvidia-smi]

prints `facts` as one JSON line (the flow runs it on a GPU host with the host's eyas python).

The estimate, in bytes the evaluator would hold:

- the target's weights: the sum of its ``*.safetensors`` (else ``*.bin``) files; else the
  ``metadata.total_size`` of its ``model.safetensors.index.json``; else a parameter count from
  ``config.json`` (`config_parameters`: embeddings, attention, dense and MoE MLPs) times the
  bytes of its ``torch_dtype``;
- scaled from the stored dtype (``torch_dtype``, bf16 when absent) to the evaluation dtype
  (`EvaluateConfig.dtype`; "auto" is bf16 on a GPU, fp32 on a CPU);
- times `HEADROOM` (activations, the KV cache of one prompt, the drafter, the CUDA context).

The device's memory: torch's ``total_memory`` of the GPU here; on a GPU host the smallest
``memory.total`` nvidia-smi reports (`eyas.remote.host_check.parse_nvidia_smi`); the machine's
RAM for a CPU (``evaluate.device: cpu``, or no GPU at all).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HEADROOM = 1.2
"""Weights x this must fit the device: activations, one prompt's KV cache, the drafter."""
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2,
               "float8_e4m3fn": 1, "int8": 1}
GIB = 1024**3


def config_parameters(config: dict[str, Any]) -> int | None:
    """An estimate of a decoder's parameters from its ``config.json`` (the ``text_config`` of
    a multimodal wrapper): embeddings (twice when untied), per layer the attention
    projections and the MLP -- dense, or routed + shared experts of ``moe_intermediate_size``
    after ``first_k_dense_replace`` dense layers (DeepSeek-V3 / Kimi-K2.5 names; Mixtral /
    Qwen-MoE's ``num_local_experts`` / ``num_experts`` too). None when the sizes are missing."""
    c = config.get("text_config") or config
    try:
        h, n_layers, vocab = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None
    inter = int(c.get("intermediate_size") or 4 * h)
    heads = int(c.get("num_attention_heads") or 1)
    head_dim = int(c.get("head_dim") or h // heads)
    kv = int(c.get("num_key_value_heads") or heads)
    attn = h * heads * head_dim * 2 + 2 * h * kv * head_dim
    experts = c.get("n_routed_experts") or c.get("num_local_experts") or c.get("num_experts")
    moe_inter = int(c.get("moe_intermediate_size") or inter)
    dense_layers = int(c.get("first_k_dense_replace") or 0) if experts else n_layers
    shared = int(c.get("n_shared_experts") or 0)
    moe = (int(experts or 0) + shared) * 3 * h * moe_inter
    mlp = dense_layers * 3 * h * inter + (n_layers - dense_layers) * moe
    embed = vocab * h * (1 if c.get("tie_word_embeddings") else 2)
    return embed + n_layers * attn + mlp


def facts(model_dir: str | Path, *, nvidia_smi: bool = False) -> dict[str, Any]:
    """What the estimate needs, read from `model_dir` and this machine (plain JSON data):
    weight file bytes, the index's total, the config, the RAM and, with `nvidia_smi`, the
    GPUs nvidia-smi lists (``[{"name", "memory_mib"}]``; [] without a driver)."""
    model_dir = Path(model_dir)
    out: dict[str, Any] = {"model": str(model_dir), "weights_bytes": None, "weight_files": 0,
                           "index_total": None, "config": None, "ram_bytes": _ram_bytes(),
                           "gpus": None}
    for pattern in ("*.safetensors", "*.bin"):
        files = sorted(model_dir.glob(pattern))
        if files:
            out["weights_bytes"] = sum(f.stat().st_size for f in files)
            out["weight_files"] = len(files)
            break
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        total = (json.loads(index.read_text()).get("metadata") or {}).get("total_size")
        out["index_total"] = int(total) if isinstance(total, (int, float)) else None
    if (model_dir / "config.json").is_file():
        out["config"] = json.loads((model_dir / "config.json").read_text())
    if nvidia_smi:
        out["gpus"] = _nvidia_smi_gpus()
    return out


def _ram_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _nvidia_smi_gpus() -> list[dict]:
    from eyas.remote.host_check import parse_nvidia_smi

    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_nvidia_smi(res.stdout)[1]


@dataclass
class OfflinePlan:
    """Whether the offline evaluator runs, and why (the report and the log say it)."""

    run: bool
    reason: str
    setting: str
    target_bytes: int | None = None
    device_bytes: int | None = None
    device: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def target_bytes(f: dict[str, Any], eval_dtype: str) -> tuple[int | None, str]:
    """``(bytes in memory, how they were estimated)`` of the target described by `facts`
    when evaluated in `eval_dtype` (a `DTYPE_BYTES` name)."""
    config = f.get("config") or {}
    stored = (config.get("text_config") or {}).get("torch_dtype") or config.get("torch_dtype")
    stored_b = DTYPE_BYTES.get(str(stored), 2)
    scale = DTYPE_BYTES.get(eval_dtype, 2) / stored_b
    if f.get("weights_bytes"):
        return int(f["weights_bytes"] * scale), (
            f"{f['weight_files']} weight file(s) of {f['weights_bytes'] / GIB:.1f} GiB")
    if f.get("index_total"):
        return int(f["index_total"] * scale), (
            f"model.safetensors.index.json's total_size {f['index_total'] / GIB:.1f} GiB")
    params = config_parameters(config) if config else None
    if params:
        return params * DTYPE_BYTES.get(eval_dtype, 2), (
            f"~{params / 1e9:.1f}B parameters from config.json")
    return None, "no weights, index or sizes in config.json"


def device_memory(f: dict[str, Any], device: str, *, torch_here: bool) -> tuple[int | None, str]:
    """``(bytes, name)`` of the device the evaluator would use: "auto" is the first GPU when
    there is one, else the CPU (RAM). `torch_here`: ask torch on this machine (local runs);
    else the GPUs of `facts` (nvidia-smi on the host)."""
    want_gpu = device != "cpu"
    if want_gpu and torch_here:
        import torch

        if torch.cuda.is_available():
            index = torch.device(device).index or 0 if device != "auto" else 0
            props = torch.cuda.get_device_properties(index)
            return int(props.total_memory), f"cuda:{index} ({props.name})"
    elif want_gpu and f.get("gpus"):
        sizes = [g["memory_mib"] for g in f["gpus"] if g.get("memory_mib")]
        if sizes:
            return min(sizes) * 1024**2, f"one GPU ({f['gpus'][0]['name']}, {min(sizes)} MiB)"
    if device.startswith("cuda"):
        return None, f"{device} (memory unknown)"
    return f.get("ram_bytes"), "the CPU (RAM)"


def plan_offline(setting: bool | str, f: dict[str, Any], *, device: str, dtype: str,
                 torch_here: bool) -> OfflinePlan:
    """The decision for ``evaluate.offline`` = `setting` (True, False or "auto") given the
    `facts` of the target and the evaluating machine."""
    if setting is True:
        return OfflinePlan(True, "evaluate.offline is true", "true")
    if setting is False:
        return OfflinePlan(False, "evaluate.offline is false", "false")
    dev_bytes, dev_name = device_memory(f, device, torch_here=torch_here)
    on_gpu = dev_name != "the CPU (RAM)"
    eval_dtype = dtype if dtype != "auto" else ("bfloat16" if on_gpu else "float32")
    need, how = target_bytes(f, eval_dtype)
    plan = OfflinePlan(True, "", "auto", need, dev_bytes, dev_name)
    if need is None or dev_bytes is None:
        plan.reason = (f"evaluate.offline auto: cannot tell whether the target fits ({how}; "
                       f"{dev_name}); evaluating")
        return plan
    text = (f"the target needs ~{need * HEADROOM / GIB:,.0f} GiB in {eval_dtype} ({how}, "
            f"x{HEADROOM} headroom) and {dev_name} has {dev_bytes / GIB:,.0f} GiB")
    if need * HEADROOM > dev_bytes:
        plan.run = False
        plan.reason = (f"evaluate.offline auto: skipped: {text}; the offline evaluator loads "
                       "the whole target on one device (the serving benchmark spreads it over "
                       "the host's GPUs)")
    else:
        plan.reason = f"evaluate.offline auto: {text}: it fits"
    return plan


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eyas.evaluate.fit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="target model folder")
    p.add_argument("--nvidia-smi", action="store_true", help="list the GPUs nvidia-smi reports")
    args = p.parse_args(argv)
    print(json.dumps(facts(args.model, nvidia_smi=args.nvidia_smi)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
