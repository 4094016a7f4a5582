"""Peak memory and speed of one drafter training step against the sequence length T, for the
memory-bounded path (``eyas.train.ttt``) and the dense T×T one (``eyas.train.dense``, the
previous implementation), in the same run.

    python benchmarks/train_memory.py --quick   # CPU, 2 heads: ~30 min on 2 busy shared cores
    python benchmarks/train_memory.py           # CPU, 4 heads: longer
    python benchmarks/train_memory.py --kimi    # the Kimi-K2.5-width drafter on a GPU, bf16
                                                # (scripts/gpu_check.sh memory runs this)
    python benchmarks/train_memory.py --tiny    # seconds: a smoke test of the same code

One step = the teacher from storage ``final`` + the TTT loss (k = 7) + backward + gradient
clipping + AdamW, micro-batch 1, every position supervised. The drafter has Kimi-K2.5's head
geometry (what ``DrafterConfig.from_target`` makes of Kimi's config: head width, query/KV head
ratio); on CPU it is narrower (fewer heads, a narrow hidden size, smaller vocabularies).

Tokens/s: T over the best step time; on CPU the process's CPU time (one thread), which other
jobs on a shared machine disturb far less than wall time; on a GPU the wall time.

Peak memory is what the step adds on top of the model, the optimizer state and the batch:
activations, gradients and temporaries (on CPU the process's peak resident memory during the
step minus its resident memory before it, glibc told to return freed memory; on a GPU
``torch.cuda.max_memory_allocated`` minus the allocation before it). Each measurement runs in
a fresh process. The dense path runs only where its estimate fits ``--naive-limit-gb``.
Chunks default to 256 MiB here (``--chunk-mb``; a small machine), training's to 1,024.
``projected_mb`` is the formula of docs/training.md, checked here against the measurement.

The goal: peak(8192) / peak(1024) ≤ 10 (linear is 8; the dense path is near 64) and tokens/s
not below the dense path's at T = 1,024. The last line is one JSON object: ``T``, ``peak_mb``,
``naive_peak_mb``, ``tok_s``, ``naive_tok_s`` (null where not run), the same for activation
checkpointing (``ckpt_*``), ``projected_mb``, the configuration and the verdict.
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

from eyas.train import dense  # noqa: E402
from eyas.train.model import Drafter, DrafterConfig  # noqa: E402
from eyas.train.ttt import TargetHead, ttt_loss  # noqa: E402
from eyas.train.vocab import DraftVocab  # noqa: E402

KIMI_K25_TEXT = {
    "model_type": "kimi_k2", "hidden_size": 7168, "intermediate_size": 18432,
    "num_hidden_layers": 61, "num_attention_heads": 64, "num_key_value_heads": 64,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "vocab_size": 163840, "rms_norm_eps": 1e-5, "rope_theta": 50000.0,
    "max_position_embeddings": 262144,
}
"""Kimi-K2.5's text model (``text_config`` of its public config.json): what the drafter is
sized from."""
KIMI_DRAFT_VOCAB = 32_000
TTT_STEPS = 7
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "B200": 2250.0, "RTX PRO 6000": 503.8,
                    "A100": 312.0}
"""Dense bf16 tensor-core peaks (no sparsity), for model FLOP utilisation."""


def kimi_drafter() -> DrafterConfig:
    """The drafter this project trains for Kimi-K2.5 by default."""
    return DrafterConfig.from_target(KIMI_K25_TEXT, KIMI_DRAFT_VOCAB)


def narrow(cfg: DrafterConfig, *, heads: int, hidden: int, vocab: int, draft_vocab: int
           ) -> DrafterConfig:
    """`cfg`'s head width and query/KV ratio with `heads` query heads, a `hidden`-wide
    residual stream (MLP 2×) and smaller vocabularies: a drafter that fits a small machine."""
    group = max(1, cfg.num_attention_heads // cfg.num_key_value_heads)
    kv = max(1, heads // group)
    return DrafterConfig(hidden_size=hidden, target_hidden_size=hidden,
                         intermediate_size=2 * hidden, num_attention_heads=kv * min(group, heads),
                         num_key_value_heads=kv, head_dim=cfg.dim_per_head, vocab_size=vocab,
                         draft_vocab_size=draft_vocab, rms_norm_eps=cfg.rms_norm_eps,
                         rope_theta=cfg.rope_theta)


# -- the formula of docs/training.md ------------------------------------------------------
def activation_bytes_per_token_step(cfg: DrafterConfig, bf16: bool) -> int:
    """Bytes one TTT step keeps for backward per token (no step checkpointing).

    Counted from what autograd (and the attention chunks' checkpoints) keep: float32 on CPU;
    under bf16 autocast the matmul outputs are bf16 while the norms keep float32 tensors.
    """
    H, M = cfg.hidden_size, cfg.intermediate_size
    q = cfg.num_attention_heads * cfg.dim_per_head
    kv = cfg.num_key_value_heads * cfg.dim_per_head
    rep = q if cfg.num_key_value_heads < cfg.num_attention_heads else 0  # GQA: repeated k, v
    # q: projection, rotation's two tensors, the context copy; k: three; v: one
    qkv = 4 * q + 4 * kv + 2 * rep
    if not bf16:
        # H: embedding rows, their norm, the hidden's norm, the 2H attention input, the
        # residual r, its norm, the output; MLP: gate, silu, up, product
        return 4 * (8 * H + qkv + 4 * M)
    f32 = 4 * H  # embedding rows, their norm, the hidden widened, r's norm
    # the hidden's norm, r, the attention input's bf16 copy (2H), the MLP input's two bf16
    # copies (gate, up), q/k/v, the MLP's four, the output
    b16 = H + H + 2 * H + 2 * H + qkv + 4 * M + H
    return 4 * f32 + 2 * b16


def projected_step_bytes(cfg: DrafterConfig, T: int, *, steps: int = TTT_STEPS,
                         checkpointing: bool = False, bf16: bool = False,
                         chunk_mb: float = 256) -> int:
    """Peak bytes a training step adds on top of model, optimizer state and batch (B = 1):
    the larger of its two phases.

    - teacher: the [T, Vd] float32 log-probabilities + the streamed full-vocabulary logits
      (at most a chunk);
    - loss: the log-probabilities and the probabilities made from them once per batch +
      activations (k steps of ``activation_bytes_per_token_step``; with checkpointing each
      step keeps only its output, keys and values and one step is recomputed at a time) + the
      gradient of each step's output that the fused head loss (``eyas.train.head_loss``)
      computes in its forward and keeps for backward (float32 [T, H] per step) + ``fc``'s
      input copy + float32 gradients (+ autocast's bf16 copy of the weights) + the working
      memory of one loss or attention chunk.
    """
    chunk = chunk_mb * 2**20
    H, Vd, V = cfg.hidden_size, cfg.draft_vocab_size, cfg.vocab_size
    h, kv = cfg.num_attention_heads, cfg.num_key_value_heads * cfg.dim_per_head
    width = 2 if bf16 else 4
    logp = 4 * T * Vd
    teacher = logp + min(chunk, 8 * T * V)
    act = activation_bytes_per_token_step(cfg, bf16)
    per_step = width * (H + 2 * kv) if checkpointing else act
    activations = T * (steps * per_step + (act if checkpointing else 0))
    activations += width * T * 3 * cfg.target_hidden_size
    working = max(min(chunk, 8 * T * Vd), min(chunk, 8 * h * T * T))
    activations += steps * 4 * T * H  # the head loss's output gradients
    weights = (4 + (2 if bf16 else 0)) * trainable_parameters(cfg)
    loss = 2 * logp + activations + weights + working
    return int(max(teacher, loss))


def projected_static_bytes(cfg: DrafterConfig, T: int) -> int:
    """What a GPU holds besides the step (B = 1): float32 weights and AdamW's two moments, the
    target's embedding and head in bf16, the head's draft rows in float32, the bf16 batch."""
    H, V, Vd = cfg.hidden_size, cfg.vocab_size, cfg.draft_vocab_size
    return (12 * trainable_parameters(cfg) + 2 * 2 * V * H + 4 * Vd * H
            + 2 * T * (3 * cfg.target_hidden_size + H))


def trainable_parameters(cfg: DrafterConfig) -> int:
    H, M, A = cfg.hidden_size, cfg.intermediate_size, 3 * cfg.target_hidden_size
    q = cfg.num_attention_heads * cfg.dim_per_head
    kv = cfg.num_key_value_heads * cfg.dim_per_head
    return A * H + 2 * H * (q + 2 * kv) + q * H + 3 * H * M + H * cfg.draft_vocab_size + 4 * H


def naive_estimate_bytes(cfg: DrafterConfig, T: int, steps: int = TTT_STEPS) -> int:
    """The dense path's need, an upper estimate: two float32 [h, T, T] tensors kept per step and
    three more while a step runs, four float32 [T, Vd] logit tensors per step, the [T, V]
    teacher logits (15-25% above the CPU measurements at T = 1,024 and 2,048)."""
    h, Vd = cfg.num_attention_heads, cfg.draft_vocab_size
    return 4 * h * T * T * (2 * steps + 3) + 16 * steps * T * Vd + 8 * T * cfg.vocab_size


def model_flops_per_token(cfg: DrafterConfig, T: int, steps: int = TTT_STEPS) -> float:
    """Model FLOPs of one trained token: 3 × the drafter's forward (matmuls, causal attention
    at the average context T/2, every position scored) + the teacher's forward (the target's
    head over the whole vocabulary). Recomputation is not counted (MFU convention)."""
    H, M, A = cfg.hidden_size, cfg.intermediate_size, 3 * cfg.target_hidden_size
    q = cfg.num_attention_heads * cfg.dim_per_head
    kv = cfg.num_key_value_heads * cfg.dim_per_head
    per_step = 2 * (2 * H * (q + 2 * kv) + q * H + 3 * H * M + H * cfg.draft_vocab_size)
    attention = 2 * 2 * q * (T / 2)
    drafter = 2 * A * H + steps * (per_step + attention)
    return 3 * drafter + 2 * H * cfg.vocab_size


# -- one measurement (a fresh process) ----------------------------------------------------
def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(path: str, cfg: DrafterConfig, T: int, *, device: str, reps: int,
            chunk_mb: float, threads: int) -> dict:
    """Peak MB and tokens/s of `reps` training steps at length T (best time of them)."""
    torch.set_num_threads(threads)
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    g = torch.Generator().manual_seed(0)
    V, Vd, H = cfg.vocab_size, cfg.draft_vocab_size, cfg.hidden_size
    with torch.device(dev):  # the target's frozen weights, stored in bf16 as real targets are
        embed = (torch.randn(V, H) * 0.02).bfloat16()
        lm_head = (torch.randn(V, H) * 0.02).bfloat16()
    torch.manual_seed(0)
    drafter = Drafter(cfg, embed).to(dev)
    del embed
    vocab = DraftVocab(torch.randperm(V, generator=g)[:Vd].sort().values, V)
    head = TargetHead(lm_head, vocab, chunk_mb=chunk_mb)
    opt = torch.optim.AdamW(drafter.parameters(), lr=1e-4)

    def batch(n: int):
        return (torch.randint(0, V, (1, n), generator=g).to(dev),
                torch.ones(1, n, dtype=torch.long, device=dev),
                torch.randn(1, n, 3 * H, generator=g).bfloat16().to(dev),
                torch.randn(1, n, H, generator=g).bfloat16().to(dev))

    def step(ids, mask, aux, final) -> None:
        if path == "naive":
            teacher = dense.teacher_from_final(final, lm_head, vocab)
        else:
            teacher = head.teacher(final)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            if path == "naive":
                r = dense.ttt_loss(drafter, ids, mask, aux, teacher, vocab, TTT_STEPS)
            else:
                r = ttt_loss(drafter, ids, mask, aux, teacher, vocab, TTT_STEPS,
                             chunk_mb=chunk_mb, checkpoint_steps=path == "ckpt")
        r.loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 0.5)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    step(*batch(64))  # optimizer state and one-time allocations: not part of the step
    data = batch(T)
    gc.collect()
    libc = ctypes.CDLL("libc.so.6") if not cuda else None
    # CPU: process time of the one-thread step, which other jobs on a shared machine disturb
    # far less than wall time; GPU: wall time after synchronising
    clock = time.perf_counter if cuda else time.process_time
    peak, best = 0, math.inf
    for _ in range(reps):
        gc.collect()
        if cuda:
            sync()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        else:
            libc.malloc_trim(0)
            base = _rss_kb("VmRSS") * 1024
            Path("/proc/self/clear_refs").write_text("5")  # the peak restarts from here
        t0 = clock()
        step(*data)
        sync()
        best = min(best, clock() - t0)
        top = torch.cuda.max_memory_allocated() if cuda else _rss_kb("VmHWM") * 1024
        peak = max(peak, top - base)
    out = {"peak_mb": round(peak / 2**20, 1), "tok_s": round(T / best, 1),
           "step_s": round(best, 3)}
    if cuda:  # everything: model, optimizer state, frozen weights, batch and the step
        out["static_mb"] = round(base / 2**20, 1)
        out["total_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


def run_child(path: str, cfg: DrafterConfig, T: int, args) -> dict | None:
    """`measure` in a fresh process; None when it fails (out of memory)."""
    spec = {"path": path, "cfg": cfg.model_dump(), "T": T, "device": args.device,
            "reps": args.reps if T <= 2048 else 1, "chunk_mb": args.chunk_mb,
            "threads": args.threads}
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"  {path} T={T}: failed ({proc.stderr.strip().splitlines()[-1:]})", flush=True)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="2 heads, smaller vocabularies")
    p.add_argument("--kimi", action="store_true", help="the real Kimi-K2.5 width (a GPU)")
    p.add_argument("--tiny", action="store_true",
                   help="a tiny drafter on the CPU at T 128 and 256 (smoke test; wins over --kimi)")
    p.add_argument("--T", type=int, nargs="+", default=None,
                   help="sequence lengths (default 1024 2048 4096 8192)")
    p.add_argument("--device", default=None, help="default: cuda with --kimi, else cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    p.add_argument("--reps", type=int, default=2, help="steps per measurement at T <= 2048")
    p.add_argument("--chunk-mb", type=float, default=256,
                   help="working memory of one chunk (training's default: 1024)")
    p.add_argument("--naive-limit-gb", type=float, default=None,
                   help="run the dense path where its estimate fits (default 3 CPU, 120 GPU)")
    p.add_argument("--no-ckpt", action="store_true", help="skip activation checkpointing")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(measure(spec["path"], DrafterConfig(**spec["cfg"]), spec["T"],
                                 device=spec["device"], reps=spec["reps"],
                                 chunk_mb=spec["chunk_mb"], threads=spec["threads"])))
        return 0
    if args.tiny:
        args.kimi, args.device = False, "cpu"
        args.T = args.T or [128, 256]
    args.T = args.T or [1024, 2048, 4096, 8192]
    args.device = args.device or ("cuda" if args.kimi else "cpu")
    gpu = args.device.startswith("cuda")
    limit = (args.naive_limit_gb or (120.0 if gpu else 3.0)) * 2**30
    if args.tiny:
        cfg = narrow(kimi_drafter(), heads=2, hidden=64, vocab=1024, draft_vocab=256)
    elif args.kimi:
        cfg = kimi_drafter()
    elif args.quick:
        cfg = narrow(kimi_drafter(), heads=2, hidden=256, vocab=16_384, draft_vocab=4_096)
    else:
        cfg = narrow(kimi_drafter(), heads=4, hidden=512, vocab=32_768, draft_vocab=8_192)
    print(f"drafter: hidden {cfg.hidden_size}, {cfg.num_attention_heads} heads × "
          f"{cfg.dim_per_head} ({cfg.num_key_value_heads} KV heads), MLP {cfg.intermediate_size}, "
          f"draft vocabulary {cfg.draft_vocab_size:,} of {cfg.vocab_size:,}; "
          f"{trainable_parameters(cfg):,} trainable parameters; {args.device}, "
          f"{'bf16 autocast' if gpu else 'fp32'}", flush=True)
    keys = ["peak_mb", "tok_s", "naive_peak_mb", "naive_tok_s", "ckpt_peak_mb", "ckpt_tok_s",
            "projected_mb", "ckpt_projected_mb"]
    if gpu:  # the whole GPU's peak: what must fit
        keys += ["total_peak_mb", "ckpt_total_peak_mb", "projected_total_mb"]
    rows: dict[str, list] = {k: [] for k in keys}
    for T in args.T:
        runs = {"new": run_child("new", cfg, T, args)}
        runs["naive"] = (run_child("naive", cfg, T, args)
                         if naive_estimate_bytes(cfg, T) <= limit else None)
        runs["ckpt"] = None if args.no_ckpt else run_child("ckpt", cfg, T, args)
        for key, prefix in (("new", ""), ("naive", "naive_"), ("ckpt", "ckpt_")):
            r = runs[key] or {}
            rows[prefix + "peak_mb"].append(r.get("peak_mb"))
            rows[prefix + "tok_s"].append(r.get("tok_s"))
            if key != "naive" and gpu:
                rows[prefix + "total_peak_mb"].append(r.get("total_peak_mb"))
        step = projected_step_bytes(cfg, T, bf16=gpu, chunk_mb=args.chunk_mb)
        rows["projected_mb"].append(round(step / 2**20, 1))
        rows["ckpt_projected_mb"].append(round(projected_step_bytes(
            cfg, T, bf16=gpu, chunk_mb=args.chunk_mb, checkpointing=True) / 2**20, 1))
        if gpu:
            rows["projected_total_mb"].append(round((projected_static_bytes(cfg, T) + step)
                                                    / 2**20, 1))
        line = "  ".join(f"{k} {v[-1]}" for k, v in rows.items())
        print(f"T={T}: {line}", flush=True)
    result: dict = {"T": args.T, **rows}
    if 1024 in args.T and 8192 in args.T:
        i, j = args.T.index(1024), args.T.index(8192)
        if rows["peak_mb"][i] and rows["peak_mb"][j]:
            result["ratio_8192_1024"] = round(rows["peak_mb"][j] / rows["peak_mb"][i], 2)
        base, naive = rows["tok_s"][i], rows["naive_tok_s"][i]
        result["speed_vs_naive_1024"] = round(base / naive, 3) if base and naive else None
        result["goal_met"] = bool(result.get("ratio_8192_1024", 99) <= 10
                                  and (result["speed_vs_naive_1024"] or 0) >= 1.0)
    if gpu:
        name = torch.cuda.get_device_name(0)
        peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
        result["device"] = name
        result["mfu"] = [round(model_flops_per_token(cfg, T) * s / 1e12 / peak, 4)
                         if s and peak else None for T, s in zip(args.T, rows["tok_s"],
                                                                 strict=True)]
    result["config"] = {"drafter": cfg.model_dump(), "ttt_steps": TTT_STEPS, "micro_batch": 1,
                        "chunk_mb": args.chunk_mb, "threads": args.threads,
                        "device": args.device}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
