"""Check 4, capture: the recipe's extraction backend, with its settings, on the real target,
over a few merged samples through the whole capture path (`eyas.extract.run.extract`: the
backend's capture, the shard writer). Then the shard is read back: one row per token of each
sample, every value finite, the layer ids recorded as the recipe resolves them, and one
sample's auxiliary rows equal to the target's own hidden states at those layers (HF backend:
a plain transformers forward with ``output_hidden_states``; SGLang backend: the engine's own
``return_hidden_states`` for the shortest sample's first `ENGINE_MAX_TOKENS` tokens, asked for
before the capture, on an engine started with ``enable_return_hidden_states`` for preflight
only, and its memory figures from ``get_server_info``). Each sample is a shard of its own:
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
from eyas.extract.sglang_backend import NoHiddenStates
from eyas.extract.shards import close_backends, get_backend
from eyas.extract.store import iter_samples, read_shard_manifest
from eyas.extract.target import resolve_aux_layers
from eyas.layers import hf_hidden_states_index, to_sglang_ids
from eyas.layout import RunLayout
from eyas.preflight.result import CheckFailed, CheckResult

NAME = "capture"
TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2, "float16": 5e-3, "compact": 0.1}
"""Largest |stored - reference| / max |reference| a stored aux row may show (rounding to the
storage dtype; float8 for storage 'compact')."""


REFERENCE_MAX_BYTES = 20 * 10**9
"""Largest target whose reference forward (float32, on the CPU) the check runs."""

ENGINE_MAX_TOKENS = 512
"""Backend "sglang": the longest prompt prefix sent again with ``return_hidden_states`` (SGLang
returns its rows as Python floats: 512 x 3 x 7,168 for Kimi-K2.5, about 11 M)."""

MISMATCH_FIX = (
    "the hook's rows and SGLang's come from the same aux states of the logits processor, so "
    "the mismatch is in eyas's capture path; what usually causes it: aux layers shifted by "
    "one or in another order (the engine's return_aux_hidden_state_layer_ids against the "
    "layers the shards record: eyas.layers.to_sglang_ids for this architecture), rows of "
    "another request or chunk (forward-batch offsets), or the storage dtype (extract.dtype: "
    "float16 overflows large activations, use bfloat16; storage 'compact' rounds to "
    "float8); report it with this output")


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


def row_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest |got - ref| / max |ref| of any row (a row's own scale: large activations of a
    few tokens do not hide the other rows)."""
    diff = (got.float() - ref.float()).abs().amax(dim=-1)
    return float((diff / ref.float().abs().amax(dim=-1).clamp_min(1e-12)).max())


def compare_engine_rows(stored: torch.Tensor, engine: torch.Tensor, *, sent: int, sid: str,
                        layers: list[int], sglang_ids: list[int], tol: float) -> str:
    """The detail line when SGLang's own rows `engine` (for the first `sent` tokens of sample
    `sid`; with chunked prefill only the last chunk's) equal the hook's `stored` rows there,
    else CheckFailed naming what usually causes a mismatch."""
    n = engine.shape[0]
    if not 0 < n <= sent:
        raise CheckFailed(f"sample {sid}: SGLang returned {n} rows of hidden states for "
                          f"{sent} tokens", fix=MISMATCH_FIX)
    err = row_error(stored[sent - n:sent], engine)
    if err > tol:
        raise CheckFailed(f"sample {sid}: the capture hook's aux rows differ from SGLang's own "
                          f"return_hidden_states at layers {layers} (SGLang {sglang_ids}): "
                          f"relative error {err:.3g} > {tol:g}", fix=MISMATCH_FIX)
    rows = f"{n} rows" if n == sent else f"its last {n} of {sent} rows, chunked prefill"
    return (f"equal to SGLang's own return_hidden_states for sample {sid} ({rows}, relative "
            f"error {err:.2g})")


def engine_memory(memory: dict[str, Any] | None) -> str | None:
    """SGLang's memory figures (`SGLangBackend.memory_usage`) as a detail line, or None."""
    try:
        return (f"engine memory: weights {float(memory['weight']):,.1f} GB, KV cache "
                f"{float(memory['kvcache']):,.1f} GB ({int(memory['token_capacity']):,} "
                f"tokens), {float(memory['startup_available']):,.1f} GB free after both on TP "
                f"rank 0's GPU (the prefill's activations and the hook's teacher use it)")
    except (KeyError, TypeError, ValueError):
        return None


def check_capture(*, merged: Path, work: Path, model_dir: Path, cfg: ExtractConfig,
                  samples: int, total_tokens: int, trust_remote_code: bool = False,
                  architecture: str | None = None) -> CheckResult:
    """Check 4: extract `samples` records of `merged` into ``work/hidden/train`` with `cfg`;
    `total_tokens` (every split) turns the measured tokens/s into the extraction's ETA."""
    check_target(model_dir)
    run = RunLayout(work)
    subset = run.train
    records = sample_file(merged, subset, samples)
    out = run.hidden_dir("train")
    shutil.rmtree(out, ignore_errors=True)
    layers, shape = resolve_aux_layers(model_dir, cfg.aux_layers)
    # One sample per shard: the first shard pays for starting the engine (SGLang starts it at
    # its first batch), the speed is measured on the others.
    update: dict[str, Any] = {"shard_size": 1}
    if cfg.backend == "sglang":
        # preflight's engine only: requests may ask for SGLang's own hidden states
        update["engine_args"] = {"enable_return_hidden_states": True, **cfg.engine_args}
    cfg = cfg.model_copy(update=update)
    t0 = time.monotonic()
    backend = get_backend(model_dir, layers, cfg, trust_remote_code=trust_remote_code,
                          out_root=out)
    # SGLang: the shortest sample's first tokens once more, with return_hidden_states (the
    # engine starts here; extract() reuses it, then shuts it down)
    compared = min(range(len(records)), key=lambda i: len(records[i]["input_ids"]))
    sent = min(len(records[compared]["input_ids"]), ENGINE_MAX_TOKENS)
    engine_rows = memory = raw_memory = None
    if cfg.backend == "sglang":
        try:
            engine_rows = backend.engine_aux_rows(records[compared]["input_ids"][:sent])
            raw_memory = backend.memory_usage()
        except Exception as exc:
            close_backends()  # extract() would have shut the engine down; it does not run now
            if isinstance(exc, NoHiddenStates):
                raise CheckFailed(f"sample {records[compared]['id']}: {exc}",
                                  fix="preflight starts SGLang with enable_return_hidden_states: "
                                      "remove return_hidden_states_mode or "
                                      "enable_return_hidden_states from extract.engine_args; "
                                      "else report it with this output") from exc
            raise
        memory = engine_memory(raw_memory)
    load_s = time.monotonic() - t0
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    summary = extract(subset, out, model_dir=model_dir, cfg=cfg,
                      trust_remote_code=trust_remote_code)
    rows = summary["shards"]
    width = 3 * shape.hidden_size
    problems = []
    stored = []
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
        stored.append(aux)
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
        err = float((stored[0].float() - ref).abs().max() / ref.abs().max().clamp_min(1e-12))
        if err > tol:
            raise CheckFailed(f"sample {records[0]['id']}: the captured aux rows differ from "
                              f"the target's own hidden states at layers {layers} (relative "
                              f"error {err:.3g} > {tol:g})", fix="a layer-numbering or capture "
                              "bug: report it with this output")
        detail += f"; equal to transformers' own hidden states (relative error {err:.2g})"
    else:
        # a second forward of a 16-bit engine (another prompt length too) may round otherwise:
        # never tighter than bfloat16's rounding
        tol = max(TOLERANCE["compact" if cfg.storage == "compact" else cfg.dtype],
                  TOLERANCE["bfloat16"])
        detail += "; " + compare_engine_rows(
            stored[compared], engine_rows, sent=sent, sid=str(records[compared]["id"]),
            layers=layers, sglang_ids=to_sglang_ids(layers, architecture), tol=tol)
    data: dict[str, Any] = {"tok_s": tok_s, "shards": str(out), "samples": len(records)}
    if torch.cuda.is_available() and cfg.backend == "hf":
        peak, total = torch.cuda.max_memory_allocated(), torch.cuda.get_device_properties(0).total_memory
        detail += f"; engine peak memory {peak / 2**30:,.1f} of {total / 2**30:,.1f} GiB"
        data["peak_bytes"] = peak
    elif cfg.backend == "sglang" and memory:
        detail += "; " + memory
        data["engine_memory"] = raw_memory
        partial.append("the engine's peak memory during the capture is not measured (SGLang "
                       "reports the free memory at its start)")
    elif cfg.backend == "sglang":
        partial.append("engine memory headroom not measured (SGLang's get_server_info gave no "
                       "memory_usage): read its log (available_gpu_mem)")
    else:
        partial.append("no GPU here: engine memory headroom not measured")
    eta = total_tokens / tok_s if tok_s > 0 else None
    data["extract_s"] = eta
    return CheckResult(NAME, True, detail, figure=f"{tok_s:,.0f} tokens/s",
                       partial="; ".join(partial), data=data)
