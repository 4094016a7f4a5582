"""One drafter training step against the sequence length: the fused attention against the
chunked reference, in the same run (CPU).

    python benchmarks/train_step.py           # T 1,024, 4,096 and 8,192, the trained 7 TTT
                                              # steps (~25 min on 2 busy shared cores)
    python benchmarks/train_step.py --quick   # the same with 3 TTT steps
    python benchmarks/train_step.py --tiny    # seconds: a smoke test of the same code

One step = the teacher from storage ``final`` + the TTT loss + backward + gradient clipping +
AdamW, micro-batch 1, every position supervised, float32 (the CPU default), one torch thread,
at the tiny demo target's width (hidden 256, 4 heads of 64, MLP 688; 4,096-token vocabulary,
all of it drafted). ``--quick`` unrolls 3 TTT steps instead of 7: attention's share of the step
(what changed) is then a little smaller than at k = 7.

- fused: ``attend_causal(kernel="fused")`` (``eyas.train.fused_attention``: torch's CPU flash
  kernel for the causal keys, the diagonal keys merged through its log-sum-exp, its own
  backward);
- reference: ``attend_causal(kernel="chunked")`` (``CausalAttention``, a chunk of queries at a
  time, FlashAttention's backward written in PyTorch operations).

Chunks: 64 MiB of scores here (``--chunk-mb``), which at 4 heads gives 64 chunks at T =
8,192 -- what training's default 1,024 MiB gives at the Kimi-K2.5 drafter's 64 heads. The
fused kernel ignores it.

Time: the step's process CPU time (one thread; other jobs on a shared machine disturb it far
less than wall time), the best of ``--reps`` steps at T ≤ 2,048 and one step above. Peak memory
as ``benchmarks/train_memory.py`` measures it: each measurement in a fresh process, the peak
resident memory during the step minus the resident memory before it (glibc told to return
freed memory). Both paths' losses must agree (relative 1e-5) or the run fails.

The last line is one JSON object: ``T``, ``step_s`` and ``peak_mb`` (fused),
``reference_step_s`` and ``reference_peak_mb`` (chunked), ``speedup`` (reference/fused step
time per T), ``peak_ratio`` (fused/reference), the configuration and ``load_average``
(1-minute, before and after: the machine is shared).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from eyas.train.model import Drafter, DrafterConfig  # noqa: E402
from eyas.train.ttt import TargetHead, ttt_loss  # noqa: E402
from eyas.train.vocab import DraftVocab  # noqa: E402

TINY_WIDTH = {"hidden_size": 256, "target_hidden_size": 256, "intermediate_size": 688,
              "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 4096,
              "draft_vocab_size": 4096}
"""The tiny demo target's drafter (``eyas.tiny``: hidden 256, 4 heads, MLP 688)."""


# -- one measurement (a fresh process) ------------------------------------------------------
def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


PATHS = {"fused": "fused", "reference": "chunked"}
"""Each measured path and the attention kernel it runs."""


def measure(path: str, cfg: DrafterConfig, T: int, *, steps: int, reps: int, chunk_mb: float,
            threads: int) -> dict:
    """Peak MB and the best CPU seconds of `reps` training steps at length T on `path`'s
    attention kernel (``PATHS``)."""
    torch.set_num_threads(threads)
    kernel = PATHS[path]
    g = torch.Generator().manual_seed(0)
    V, Vd, H = cfg.vocab_size, cfg.draft_vocab_size, cfg.hidden_size
    embed = (torch.randn(V, H, generator=g) * 0.02).bfloat16()
    lm_head = (torch.randn(V, H, generator=g) * 0.02).bfloat16()
    torch.manual_seed(0)
    drafter = Drafter(cfg, embed)
    vocab = DraftVocab(torch.randperm(V, generator=g)[:Vd].sort().values, V)
    head = TargetHead(lm_head, vocab, chunk_mb=chunk_mb)
    opt = torch.optim.AdamW(drafter.parameters(), lr=1e-4)

    def batch(n: int):
        return (torch.randint(0, V, (1, n), generator=g), torch.ones(1, n, dtype=torch.long),
                torch.randn(1, n, 3 * H, generator=g).bfloat16(),
                torch.randn(1, n, H, generator=g).bfloat16())

    def step(ids, mask, aux, final) -> float:
        r = ttt_loss(drafter, ids, mask, aux, head.teacher(final), vocab, steps,
                     chunk_mb=chunk_mb, kernel=kernel)
        r.loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 0.5)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(r.loss.detach())

    step(*batch(64))  # optimizer state and one-time allocations: not part of the step
    data = batch(T)
    libc = ctypes.CDLL("libc.so.6")
    peak, best, loss = 0, math.inf, None
    for _ in range(reps):
        gc.collect()
        libc.malloc_trim(0)
        base = _rss_kb("VmRSS") * 1024
        Path("/proc/self/clear_refs").write_text("5")  # the peak restarts from here
        t0 = time.process_time()
        loss = step(*data)
        best = min(best, time.process_time() - t0)
        peak = max(peak, _rss_kb("VmHWM") * 1024 - base)
    return {"step_s": round(best, 4), "peak_mb": round(peak / 2**20, 1), "loss": loss}


def run_child(path: str, cfg: DrafterConfig, T: int, args) -> dict:
    """`measure` in a fresh process."""
    spec = {"path": path, "cfg": cfg.model_dump(), "T": T, "steps": args.ttt_steps,
            "reps": args.reps if T <= 2048 else 1, "chunk_mb": args.chunk_mb,
            "threads": args.threads}
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{path} T={T} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="3 TTT steps (default: 7)")
    p.add_argument("--tiny", action="store_true", help="a narrow drafter at T 128 and 256")
    p.add_argument("--T", type=int, nargs="+", default=None,
                   help="default: 1024 4096 8192")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--reps", type=int, default=2, help="steps per measurement at T <= 2048")
    p.add_argument("--chunk-mb", type=float, default=64,
                   help="attention chunk working memory (64: Kimi's chunk count at 4 heads)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(measure(spec["path"], DrafterConfig(**spec["cfg"]), spec["T"],
                                 steps=spec["steps"], reps=spec["reps"],
                                 chunk_mb=spec["chunk_mb"], threads=spec["threads"])))
        return 0
    if args.tiny:
        cfg = DrafterConfig(**{**TINY_WIDTH, "hidden_size": 64, "target_hidden_size": 64,
                               "intermediate_size": 128, "vocab_size": 512,
                               "draft_vocab_size": 512})
        args.T, args.chunk_mb = args.T or [128, 256], min(args.chunk_mb, 0.25)
    else:
        cfg = DrafterConfig(**TINY_WIDTH)
    args.T = args.T or [1024, 4096, 8192]
    args.ttt_steps = 3 if args.quick or args.tiny else 7
    load_before = os.getloadavg()[0]
    print(f"drafter: hidden {cfg.hidden_size}, {cfg.num_attention_heads} heads × "
          f"{cfg.dim_per_head}, MLP {cfg.intermediate_size}, vocabulary {cfg.vocab_size:,}; "
          f"{args.ttt_steps} TTT steps, chunks of {args.chunk_mb} MiB, {args.threads} thread(s);"
          f" load average {load_before:.1f}", flush=True)
    rows: dict[str, list] = {k: [] for k in ("step_s", "reference_step_s", "peak_mb",
                                             "reference_peak_mb", "speedup", "peak_ratio")}
    for T in args.T:
        new, ref = run_child("fused", cfg, T, args), run_child("reference", cfg, T, args)
        if not math.isclose(new["loss"], ref["loss"], rel_tol=1e-5):
            raise RuntimeError(f"T={T}: the two paths disagree: loss {new['loss']} (fused) "
                               f"and {ref['loss']} (reference)")
        rows["step_s"].append(new["step_s"])
        rows["reference_step_s"].append(ref["step_s"])
        rows["peak_mb"].append(new["peak_mb"])
        rows["reference_peak_mb"].append(ref["peak_mb"])
        rows["speedup"].append(round(ref["step_s"] / new["step_s"], 2))
        rows["peak_ratio"].append(round(new["peak_mb"] / ref["peak_mb"], 3))
        print(f"T={T}: step {new['step_s']} s (reference {ref['step_s']} s, "
              f"{rows['speedup'][-1]:.2f}x), peak {new['peak_mb']} MB "
              f"(reference {ref['peak_mb']} MB, {rows['peak_ratio'][-1]:.2f}x); "
              f"load average {os.getloadavg()[0]:.1f}", flush=True)
    print(json.dumps({"T": args.T, **rows,
                      "config": {"drafter": cfg.model_dump(), "ttt_steps": args.ttt_steps,
                                 "chunk_mb": args.chunk_mb, "threads": args.threads,
                                 "micro_batch": 1, "precision": "fp32", "device": "cpu"},
                      "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
