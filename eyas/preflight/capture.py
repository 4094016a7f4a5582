"""Check 4, capture: the recipe's extraction backend, with its settings, on the real target,
over a few merged samples through the whole capture path (`eyas.extract.run.extract`: the
backend's capture, the shard writer). Then the shard is read back: one row per token of each
sample, every value finite, the layer ids recorded as the recipe resolves them, and one
sample's auxiliary rows equal to the target's own hidden states at those layers (HF backend:
a plain transformers forward with ``output_hidden_states``). Each sample is a shard of its own:
the first pays for the engine's start (SGLang starts it at its first batch), the others give
the tokens/s, one sample at a time (a lower bound of the batched run's), and from it an ETA of
the whole extraction. The shards are what the training check trains on.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from eyas.extract.config import ExtractConfig
from eyas.extract.run import extract
from eyas.extract.shards import get_backend
from eyas.extract.store import iter_samples, read_shard_manifest
from eyas.extract.target import resolve_aux_layers
from eyas.layers import hf_hidden_states_index, to_sglang_ids
from eyas.preflight.result import CheckFailed, CheckResult

NAME = "capture"
TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2, "float16": 5e-3, "compact": 0.1}
"""Largest |stored - reference| / max |reference| a stored aux row may show (rounding to the
storage dtype; float8 for storage 'compact')."""


REFERENCE_MAX_BYTES = 20 * 10**9
"""Largest target whose reference forward (float32, on the CPU) the check runs."""


def check_target(model_dir: Path) -> None:
    """CheckFailed naming the fix when the target folder is missing or has no config.json."""
    if not Path(model_dir).is_dir():
        raise CheckFailed(f"target folder {model_dir} does not exist on this host",
                          fix="set target.model in the recipe to the target's folder on the "
                              "GPU host (download it there first)")
    if not (Path(model_dir) / "config.json").is_file():
        raise CheckFailed(f"target folder {model_dir} has no config.json",
                          fix="point target.model at the folder holding config.json and the "
                              "weights (a complete download)")


def sample_file(merged: Path, out: Path, n: int) -> list[dict[str, Any]]:
    """Write the first `n` records of `merged` to `out`; return them."""
    if not merged.is_file():
        raise CheckFailed(f"no merged data at {merged}",
                          fix="run `eyas prepare` (phases 1-3) for this workdir first")
    records = []
    with open(merged) as fh:
        for line in fh:
            if line.strip():
                records.append(json.loads(line))
            if len(records) == n:
                break
    if not records:
        raise CheckFailed(f"{merged} holds no records", fix="rerun `eyas prepare` (merge)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(out)
    return records


def reference_aux(model_dir: Path, ids: list[int], layers: list[int], *,
                  trust_remote_code: bool) -> torch.Tensor:
    """[T, 3H] float32: the target's own hidden states at `layers` (eyas numbering) for one
    sample, from a plain transformers forward (``output_hidden_states``) on the CPU."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32,
                                                 trust_remote_code=trust_remote_code).eval()
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    return torch.cat([out.hidden_states[hf_hidden_states_index(i)][0] for i in layers], dim=-1)


def check_capture(*, merged: Path, work: Path, model_dir: Path, cfg: ExtractConfig,
                  samples: int, total_tokens: int, trust_remote_code: bool = False,
                  architecture: str | None = None) -> CheckResult:
    """Check 4: extract `samples` records of `merged` into ``work/hidden/train`` with `cfg`;
    `total_tokens` (every split) turns the measured tokens/s into the extraction's ETA."""
    check_target(model_dir)
    subset = work / "merged" / "train.jsonl"
    records = sample_file(merged, subset, samples)
    out = work / "hidden" / "train"
    shutil.rmtree(out, ignore_errors=True)
    layers, shape = resolve_aux_layers(model_dir, cfg.aux_layers)
    # One sample per shard: the first shard pays for starting the engine (SGLang starts it at
    # its first batch), the speed is measured on the others.
    cfg = cfg.model_copy(update={"shard_size": 1})
    t0 = time.monotonic()
    get_backend(model_dir, layers, cfg, trust_remote_code=trust_remote_code, out_root=out)
    load_s = time.monotonic() - t0
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    summary = extract(subset, out, model_dir=model_dir, cfg=cfg,
                      trust_remote_code=trust_remote_code)
    rows = summary["shards"]
    width = 3 * shape.hidden_size
    problems = []
    first_aux = None
    for rec, row in zip(records, rows, strict=True):
        shard = out / row["shard"]
        if row.get("quarantined"):
            raise CheckFailed(f"sample {rec['id']} gave non-finite states (see "
                              f"{shard / 'quarantine.jsonl'})",
                              fix="the target computes NaN/inf at these settings: check "
                                  "extract.engine_args dtype and the target's weights")
        manifest = read_shard_manifest(shard)
        if list(manifest["aux_layers"]) != layers:
            raise CheckFailed(f"{shard} records layers {manifest['aux_layers']}, the recipe "
                              f"resolves {layers}", fix="a bug in the capture path: report it")
        (got,) = list(iter_samples(shard))
        t = len(rec["input_ids"])
        aux = got["aux_hidden"]
        if tuple(aux.shape) != (t, width):
            problems.append(f"sample {rec['id']}: aux rows {tuple(aux.shape)}, expected ({t}, {width})")
        if got["input_ids"].tolist() != list(rec["input_ids"]):
            problems.append(f"sample {rec['id']}: input_ids do not line up with the merged record")
        for name, x in got.items():
            if x.is_floating_point() and not bool(torch.isfinite(x.float()).all()):
                problems.append(f"sample {rec['id']}: non-finite values in {name}")
        first_aux = aux if first_aux is None else first_aux
    if problems:
        raise CheckFailed("; ".join(problems[:5]), fix="a bug in the capture path for these "
                          "settings: report it with this output")
    timed = rows[1:] or rows  # without the first shard (the engine's start), when there are more
    tokens = sum(r["tokens"] for r in rows)
    tok_s = sum(r["tokens"] for r in timed) / max(sum(r["seconds"] for r in timed), 1e-9)
    detail = (f"{cfg.backend} backend, {len(records)} samples, {tokens:,} tokens: rows "
              f"line up, values finite; layers {layers} (eyas) = SGLang "
              f"{to_sglang_ids(layers, architecture)}; load {load_s + rows[0]['seconds']:,.1f}s "
              f"(with the first sample), then {tok_s:,.0f} tokens/s one sample at a time")
    partial = []
    weights = sum(f.stat().st_size for f in Path(model_dir).iterdir()
                  if f.suffix in (".safetensors", ".bin"))
    if cfg.backend == "hf" and weights > REFERENCE_MAX_BYTES:
        partial.append(f"the target's weights ({weights / 1e9:,.0f} GB) are too large for the "
                       "reference forward on the CPU: aux rows not compared with transformers'")
    elif cfg.backend == "hf":
        ref = reference_aux(model_dir, list(records[0]["input_ids"]), layers,
                            trust_remote_code=trust_remote_code)
        tol = TOLERANCE["compact" if cfg.storage == "compact" else cfg.dtype]
        err = float((first_aux.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-12))
        if err > tol:
            raise CheckFailed(f"sample {records[0]['id']}: the captured aux rows differ from "
                              f"the target's own hidden states at layers {layers} (relative "
                              f"error {err:.3g} > {tol:g})", fix="a layer-numbering or capture "
                              "bug: report it with this output")
        detail += f"; equal to transformers' own hidden states (relative error {err:.2g})"
    else:
        partial.append("the comparison with SGLang's own return_hidden_states is not run by "
                       "this version of preflight")
    data: dict[str, Any] = {"tok_s": tok_s, "shards": str(out), "samples": len(records)}
    if torch.cuda.is_available() and cfg.backend == "hf":
        peak, total = torch.cuda.max_memory_allocated(), torch.cuda.get_device_properties(0).total_memory
        detail += f"; engine peak memory {peak / 2**30:,.1f} of {total / 2**30:,.1f} GiB"
        data["peak_bytes"] = peak
    elif cfg.backend == "sglang":
        partial.append("engine memory headroom: read SGLang's log (mem_fraction_static)")
    else:
        partial.append("no GPU here: engine memory headroom not measured")
    eta = total_tokens / tok_s if tok_s > 0 else None
    data["extract_s"] = eta
    return CheckResult(NAME, True, detail, figure=f"{tok_s:,.0f} tokens/s",
                       partial="; ".join(partial), data=data)
