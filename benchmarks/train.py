"""Drafter training benchmark (CPU): training throughput, and the tiny demo drafter's quality.

    python benchmarks/train.py --quick     # about 3 minutes on 2 (shared) CPU cores
    python benchmarks/train.py             # longer training of the tiny drafter (~15 min)

1. ``train_tok_s``: training tokens/s (forward + backward + AdamW, TTT unroll 7) of a fixed
   small drafter (H=256, 4 heads, MLP 688, 4,096-token vocabulary, all of it drafted, storage
   "final"; the tiny target's shape) on random 256-token samples, micro-batch 4, after one
   warm-up step, in float32 (the default on CPU). In the same process, with the same data and
   initialisation: ``precision: bf16`` (bf16 autocast), and the baseline -- the head and
   soft cross-entropy as autograd ops, each chunk recomputed in backward (how
   ``eyas.train.ttt`` computed them before ``eyas.train.head_loss`` fused them) -- each with
   its tokens per second of wall and of process CPU time and its ratio to the baseline.
2. ``simulated_acceptance_length``: the tiny demo target's drafter trained by
   ``eyas.train.run.train_drafter`` on shards written by ``eyas.extract`` (one entry per
   storage option), evaluated on held-out questions: τ = 1 + Σ_k Π_{i≤k} acc_i over the 7
   trained steps (``eyas.train.metrics``; ``acceptance_length_3``: the same for 3 steps).

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from eyas.train.config import TrainConfig  # noqa: E402
from eyas.train.data import Batches, MemorySource, OfflineSource  # noqa: E402
from eyas.train.model import Drafter, DrafterConfig  # noqa: E402
from eyas.train.trainer import Trainer  # noqa: E402
from eyas.train.vocab import DraftVocab  # noqa: E402


def autograd_head_soft_ce(drafter, outs_NH, idx, ahead, coeff, p_NVd, top_N, d2t, *,
                          chunk_mb, objective="kl"):
    """The baseline: ``eyas.train.head_loss.head_soft_ce`` as autograd ops, a chunk of rows at
    a time, each chunk checkpointed (its logits recomputed in backward); the soft-CE only."""
    if objective != "kl":
        raise ValueError(f"the autograd baseline computes train.loss kl only, not {objective!r}")
    from torch.utils.checkpoint import checkpoint

    from eyas.train.model import chunk_rows

    def chunk(out_NH, idx_C, a):
        logq = drafter.logits(out_NH.index_select(0, idx_C)).float().log_softmax(-1)
        t_p = p_NVd.index_select(0, idx_C + a)
        ce = -(t_p * logq.masked_fill(t_p == 0, 0.0)).sum()
        return ce, (d2t[logq.detach().argmax(-1)] == top_N.index_select(0, idx_C + a)).sum()

    loss, ces, hits = 0.0, [], []
    for out_NH, ix, a, c in zip(outs_NH, idx, ahead, coeff, strict=True):
        rows = chunk_rows(chunk_mb, 5 * p_NVd.shape[1] * 4, max(1, ix.numel()))
        ce, n = out_NH.new_zeros(()), torch.zeros((), dtype=torch.int64)
        for s in range(0, ix.numel(), rows):
            part, h = checkpoint(chunk, out_NH, ix[s : s + rows], a, use_reentrant=False)
            ce, n = ce + part, n + h
        loss = loss + c * ce
        ces.append(ce.detach().double())
        hits.append(n)
    return loss, torch.stack(ces), torch.stack(hits)


def throughput(steps: int, threads: int) -> dict:
    """Training tokens/s of the fixed small configuration: float32, bf16 autocast, and the
    baseline (float32, the head and loss as recomputed autograd ops)."""
    import eyas.train.ttt as ttt

    torch.set_num_threads(threads)
    V, H, T, B = 4096, 256, 256, 4
    cfg = DrafterConfig(hidden_size=H, target_hidden_size=H, intermediate_size=688,
                        num_attention_heads=4, num_key_value_heads=4, vocab_size=V,
                        draft_vocab_size=V)
    g = torch.Generator().manual_seed(0)
    samples = [{"input_ids": torch.randint(0, V, (T,), generator=g),
                "loss_mask": torch.ones(T, dtype=torch.long),
                "aux_hidden": torch.randn(T, 3 * H, generator=g).bfloat16(),
                "final_hidden": torch.randn(T, H, generator=g).bfloat16()}
               for _ in range(B * (steps + 1))]
    embed, head = torch.randn(V, H, generator=g), torch.randn(V, H, generator=g)
    vocab = DraftVocab(torch.arange(V), V)

    def run(precision: str) -> dict:
        torch.manual_seed(0)
        drafter = Drafter(cfg, embed)
        tcfg = TrainConfig(steps=steps + 1, micro_batch=B, ttt_steps=7, device="cpu",
                           warmup_steps=1, precision=precision)
        with tempfile.TemporaryDirectory() as tmp:
            trainer = Trainer(tcfg, drafter, vocab, Batches(MemorySource(samples), micro_batch=B,
                                                             seed=0), None, Path(tmp),
                              lm_head_VH=head)
            first = trainer.step()  # warm-up
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(steps):
                trainer.step()
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
        return {"tok_s": round(B * T * steps / dt, 1), "tok_cpu_s": round(B * T * steps / dc, 1),
                "first_loss": round(first["loss"], 4)}

    fused = ttt.head_soft_ce
    ttt.head_soft_ce = autograd_head_soft_ce
    try:
        baseline = run("fp32")
    finally:
        ttt.head_soft_ce = fused
    fp32, bf16 = run("fp32"), run("bf16")
    for r in (fp32, bf16):
        r["ratio_tok_s"] = round(r["tok_s"] / baseline["tok_s"], 2)
        r["ratio_tok_cpu_s"] = round(r["tok_cpu_s"] / baseline["tok_cpu_s"], 2)
    return {"train_tok_s": fp32["tok_s"], "config": "H256 I688 V4096 T256 B4 k7",
            "threads": threads, "steps": steps, "fp32": fp32, "bf16": bf16,
            "baseline_autograd_head_fp32": baseline}


QUICK = {"n_train": 96, "n_eval": 24, "steps": 60, "micro_batch": 2, "max_len": 192, "lr": 2e-3}
FULL = {"n_train": 600, "n_eval": 100, "steps": 400, "micro_batch": 4, "max_len": 256, "lr": 1e-3}


def tiny_drafter(storage: str, work: Path, n_train: int, n_eval: int, steps: int,
                 micro_batch: int, max_len: int, lr: float) -> dict:
    """Extract the tiny demo data with `storage`, train the drafter, return its evaluation."""
    from eyas.tiny import build_tiny_target
    from eyas.train.run import train_drafter
    from eyas.train.tiny_data import extract_shards, tiny_records, write_jsonl

    model = build_tiny_target()
    merged = work / "merged"
    if not (merged / "train.jsonl").exists():
        write_jsonl(merged / "train.jsonl", tiny_records(model, n_train))
        write_jsonl(merged / "eval.jsonl", tiny_records(model, n_eval, heldout=True))
    t0 = time.perf_counter()
    train_dir = extract_shards(model, merged / "train.jsonl", work / storage / "train",
                               storage=storage, shard_size=64)
    eval_dir = extract_shards(model, merged / "eval.jsonl", work / storage / "eval",
                              storage=storage, shard_size=64)
    extract_s = time.perf_counter() - t0
    src = OfflineSource(train_dir)
    cfg = TrainConfig(steps=steps, lr=lr, warmup_steps=max(1, steps // 20),
                      micro_batch=micro_batch, max_len=max_len, eval_every=max(1, steps // 2),
                      log_every=max(1, steps // 4),
                      device="cpu", draft_vocab_size=32_000)

    def log(rec: dict) -> None:
        if rec["kind"] == "eval":
            print(f"  [{storage}] eval @ {rec['step']}: simulated acceptance length τ "
                  f"{rec['simulated_acceptance_length']:.3f}, acc "
                  f"{[round(a, 2) for a in rec['acc']]}", flush=True)

    t1 = time.perf_counter()
    summary = train_drafter(src, OfflineSource(eval_dir), model, work / storage / "drafter", cfg,
                            aux_layers=src.aux_layers, on_log=log)
    return {"best": summary["best"], "extract_s": round(extract_s, 1),
            "train_s": round(time.perf_counter() - t1, 1), "samples": len(src),
            "export": summary["export"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (CPU, a few minutes)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1 is fastest on a shared small machine)")
    p.add_argument("--keep", type=Path, help="keep the work folder here")
    p.add_argument("--throughput-only", action="store_true",
                   help="measure training throughput only (no tiny drafter)")
    args = p.parse_args(argv)
    tp = throughput(steps=3 if args.quick else 10, threads=args.threads)
    print(f"training throughput ({tp['config']}, {tp['threads']} thread(s)):", flush=True)
    for name in ("baseline_autograd_head_fp32", "fp32", "bf16"):
        r = tp[name]
        ratio = (f"  {r['ratio_tok_s']:.2f}x / {r['ratio_tok_cpu_s']:.2f}x the baseline"
                 if "ratio_tok_s" in r else "")
        print(f"  {name:>28}: {r['tok_s']:7,.0f} tok/s, {r['tok_cpu_s']:7,.0f} tok/CPU-s "
              f"(first loss {r['first_loss']}){ratio}", flush=True)
    if args.throughput_only:
        print(json.dumps(tp))
        return 0
    sizes = QUICK if args.quick else FULL
    work = args.keep or Path(tempfile.mkdtemp(prefix="eyas-train-bench-"))
    sim, tau3, details = {}, {}, {}
    try:
        for storage in ("final", "topk", "compact"):
            r = tiny_drafter(storage, work, **sizes)
            sim[storage] = round(r["best"]["simulated_acceptance_length"], 3)
            tau3[storage] = round(r["best"]["acceptance_length"]["3"], 3)
            details[storage] = {k: v for k, v in r.items() if k != "export"}
            print(f"tiny drafter, storage {storage}: simulated acceptance length τ "
                  f"{sim[storage]:.3f} (3 steps: {tau3[storage]:.3f}; "
                  f"acc {[round(a, 2) for a in r['best']['acc']]}; "
                  f"{r['samples']} samples, {sizes['steps']} steps, train {r['train_s']} s)", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"train_tok_s": tp["train_tok_s"], "throughput": tp,
                      "simulated_acceptance_length": sim, "acceptance_length_3": tau3,
                      "tiny": details, "sizes": sizes,
                      "data": "offline shards from eyas.extract (tiny demo target)"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
