"""Drafter kinds: the Llama-style EAGLE-3 layer against the MLA one (SGLang's
Eagle3DeepseekV2ForCausalLM), with and without EAGLE-3.1's ``fc_norm`` / ``norm_output``.

    python benchmarks/drafter_study.py            # tiny target + Kimi replica, 3 seeds, 30 steps
    python benchmarks/drafter_study.py --steps 60 --samples 96   # docs/training.md's table
    python benchmarks/drafter_study.py --seeds 0  # one seed

Same data, steps, seeds and evaluator for every kind: the tiny demo target (a Llama; the MLA
drafter takes DeepSeek-V3's proportions of its head width) answering its own training
questions, and the Kimi replica (DeepSeek-V3 with MLA in Kimi-K2.5's wrapper; the MLA drafter
takes its sizes, and once its last layer's attention: ``init_attention: target``) on the same
questions' text in its own tokenizer. Records are extracted once (storage "final"); each
setting trains from the same seed and is scored at its last step by training's simulated
acceptance length τ (TTT 7 steps, bonus token counted) on held-out questions. Reported per
kind: τ mean ± standard error over seeds, trainable parameters, the draft step's cost (ms per
drafted token through the evaluator's cached session on this CPU, one thread; and its matmul
multiply-adds per token without the head), and what the server caches per token (bf16). Then
the same counts at Kimi-K2.5's real geometry (no training). Prints tables and, last, one JSON
line.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from eyas.train.config import TrainConfig  # noqa: E402
from eyas.train.data import OfflineSource  # noqa: E402
from eyas.train.model import Drafter, DrafterConfig  # noqa: E402

KINDS = {
    "llama": {},
    "llama + both": {"fc_norm": True, "norm_output": True},
    "mla": {"drafter": "mla"},
    "mla + fc_norm": {"drafter": "mla", "fc_norm": True},
    "mla + norm_output": {"drafter": "mla", "norm_output": True},
    "mla + both": {"drafter": "mla", "fc_norm": True, "norm_output": True},
}
TARGET_INIT = {"mla, init_attention: target": {"drafter": "mla", "mla": {"init_attention": "target"}}}

KIMI_TEXT = {"hidden_size": 7168, "intermediate_size": 18432, "num_attention_heads": 64,
             "num_key_value_heads": 64, "q_lora_rank": 1536, "kv_lora_rank": 512,
             "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
             "vocab_size": 163840, "rope_theta": 50000.0, "max_position_embeddings": 262144,
             "rope_scaling": {"type": "yarn", "factor": 64.0, "beta_fast": 1.0, "beta_slow": 1.0,
                              "mscale": 1.0, "mscale_all_dim": 1.0,
                              "original_max_position_embeddings": 4096}}
"""Kimi-K2.5's text_config, the fields the drafter reads (its public config.json)."""


def step_macs(cfg: DrafterConfig) -> int:
    """Matmul multiply-adds of one drafted token, head and attention scores left out (the
    head is the same for both kinds; scores grow with the context: see `score_macs`)."""
    H, M, A = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads
    mlp = 3 * H * M
    if cfg.attention == "mla":
        nope, rope, v = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        attn = (2 * H * (cfg.q_lora_rank + cfg.kv_lora_rank + rope)
                + cfg.q_lora_rank * A * (nope + rope)
                + A * nope * cfg.kv_lora_rank + A * cfg.kv_lora_rank * v  # absorbed w_kc, w_vc
                + A * v * H)
    else:
        d, kv = cfg.dim_per_head, cfg.num_key_value_heads
        attn = 2 * H * (A + 2 * kv) * d + A * d * H
    return attn + mlp


def score_macs(cfg: DrafterConfig) -> int:
    """Multiply-adds per cached token of one query's attention (scores + weighted values)."""
    A = cfg.num_attention_heads
    if cfg.attention == "mla":  # absorbed: over the latent and the rotary key, values = latent
        return A * (2 * cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    return A * 2 * cfg.dim_per_head


def run(train_dir: Path, eval_dir: Path, model: Path, out: Path, *, seed: int, steps: int,
        kind: dict, lr: float, max_len: int) -> dict:
    from eyas.evaluate.drafters import EagleDrafter, load_drafter
    from eyas.extract.target import load_target_embeddings
    from eyas.train.run import train_drafter

    src = OfflineSource(train_dir)
    cfg = TrainConfig(steps=steps, lr=lr, warmup_steps=max(1, steps // 10), micro_batch=4,
                      max_len=max_len, eval_every=steps, log_every=steps, device="cpu",
                      draft_vocab_size=32_000, seed=seed, **kind)
    final: dict = {}
    t0 = time.perf_counter()
    summary = train_drafter(src, OfflineSource(eval_dir), model, out, cfg,
                            aux_layers=src.aux_layers,
                            on_log=lambda r: final.update(r) if r["kind"] == "eval" else None)
    seconds = time.perf_counter() - t0
    drafter, vocab, _ = load_drafter(Path(summary["export"]), load_target_embeddings(model))
    return {"tau": final["simulated_acceptance_length"], "seconds": round(seconds, 1),
            "params": drafter.num_trainable_parameters(),
            "step_ms": draft_step_ms(EagleDrafter(drafter, vocab), drafter),
            "macs": step_macs(drafter.cfg), "score_macs": score_macs(drafter.cfg),
            "kv_bytes": drafter.cfg.kv_bytes_per_token()}


def draft_step_ms(method, drafter: Drafter, context: int = 128, k: int = 8, reps: int = 5) -> float:
    """Median ms per drafted token: a session holding `context` cached entries proposes k."""
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, drafter.cfg.vocab_size, (context,), generator=g).tolist()
    aux = torch.randn(context, 3 * drafter.cfg.target_hidden_size, generator=g)
    s = method.session()
    s.begin(prompt, aux, 1)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        s.propose(k, None, None)
        times.append((time.perf_counter() - t0) / k * 1000)
    return round(statistics.median(times), 3)


def replica_records(replica: Path, tiny: Path, n: int, *, heldout: bool) -> list[dict]:
    """The tiny target's Q&A text in the replica's own tokenizer: question, then the answer
    (loss-masked)."""
    from transformers import AutoTokenizer

    from eyas.tiny.qa import split_qa, training_messages

    tok = AutoTokenizer.from_pretrained(str(replica), trust_remote_code=True)
    train, held = split_qa()
    out = []
    for qa in (held if heldout else train)[:n]:
        msgs = training_messages(qa)
        question = "\n".join(m["content"] for m in msgs[:-1]) + "\n"
        q_ids = tok.encode(question, add_special_tokens=False)
        a_ids = tok.encode(msgs[-1]["content"], add_special_tokens=False)
        out.append({"id": f"{'eval' if heldout else 'train'}-{qa.name}", "dataset": "tiny",
                    "input_ids": q_ids + a_ids, "loss_mask": [0] * len(q_ids) + [1] * len(a_ids)})
    return out


def summarise(rows: list[dict]) -> dict:
    taus = [r["tau"] for r in rows]
    se = statistics.stdev(taus) / math.sqrt(len(taus)) if len(taus) > 1 else 0.0
    first = rows[0]
    return {"tau": round(statistics.mean(taus), 4), "se": round(se, 4),
            "taus": [round(t, 4) for t in taus], "params": first["params"],
            "step_ms": round(statistics.median(r["step_ms"] for r in rows), 3),
            "macs": first["macs"], "score_macs": first["score_macs"],
            "kv_bytes": first["kv_bytes"],
            "train_s": round(statistics.mean(r["seconds"] for r in rows), 1)}


def kimi_geometry() -> dict:
    """Parameters, KV bytes and multiply-adds per drafted token at Kimi-K2.5's real sizes."""
    out = {}
    for name, kind in (("llama", "llama"), ("mla", "mla")):
        cfg = DrafterConfig.from_target(KIMI_TEXT, 32_000, attention=kind)
        with torch.device("meta"):
            d = Drafter(cfg, torch.empty(cfg.vocab_size, cfg.hidden_size))
        out[name] = {"params": d.num_trainable_parameters(), "kv_bytes": cfg.kv_bytes_per_token(),
                     "macs": step_macs(cfg), "score_macs": score_macs(cfg)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--samples", type=int, default=48, help="training questions (eval: half)")
    p.add_argument("--keep", type=Path, help="keep the work folder here")
    p.add_argument("--targets", default="tiny,replica")
    p.add_argument("--kinds", default=None, help="comma-separated kind names (default: all)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    from eyas.tiny import build_kimi_replica, build_tiny_target
    from eyas.train.tiny_data import extract_shards, tiny_records, write_jsonl

    tiny = build_tiny_target()
    work = args.keep or Path(tempfile.mkdtemp(prefix="eyas-drafter-study-"))
    results: dict[str, dict] = {}
    try:
        for target in args.targets.split(","):
            model = tiny if target == "tiny" else build_kimi_replica()
            merged = work / target / "merged"
            n_eval = args.samples // 2
            if target == "tiny":
                write_jsonl(merged / "train.jsonl", tiny_records(tiny, args.samples))
                write_jsonl(merged / "eval.jsonl", tiny_records(tiny, n_eval, heldout=True))
            else:
                write_jsonl(merged / "train.jsonl", replica_records(model, tiny, args.samples,
                                                                    heldout=False))
                write_jsonl(merged / "eval.jsonl", replica_records(model, tiny, n_eval,
                                                                   heldout=True))
            dirs = {}
            for split in ("train", "eval"):
                if target == "tiny":
                    dirs[split] = extract_shards(model, merged / f"{split}.jsonl",
                                                 work / target / "hidden" / split,
                                                 storage="final", shard_size=64)
                else:
                    from eyas.extract.config import ExtractConfig
                    from eyas.extract.run import extract

                    dirs[split] = work / target / "hidden" / split
                    extract(merged / f"{split}.jsonl", dirs[split], model_dir=model,
                            trust_remote_code=True,
                            cfg=ExtractConfig(storage="final", shard_size=64, device="cpu"))
            kinds = {**KINDS, **(TARGET_INIT if target == "replica" else {})}
            if args.kinds:
                kinds = {k: v for k, v in kinds.items() if k in args.kinds.split(",")}
            lr = 2e-3
            for name, kind in kinds.items():
                rows = []
                for seed in seeds:
                    r = run(dirs["train"], dirs["eval"], model,
                            work / target / "drafters" / f"{name}-{seed}".replace(" ", "_"),
                            seed=seed, steps=args.steps, kind=kind, lr=lr, max_len=256)
                    rows.append(r)
                    print(f"{target} seed {seed} {name:>30}: τ {r['tau']:.3f} "
                          f"({r['seconds']} s)", flush=True)
                results[f"{target} | {name}"] = summarise(rows)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n{args.samples} train / {args.samples // 2} held-out questions, {args.steps} steps "
          f"x micro-batch 4, lr 2e-3, seeds {seeds}")
    print(f"{'target | kind':>40} {'τ':>6} {'± se':>6} {'params':>9} {'ms/tok':>7} "
          f"{'MACs/tok':>9} {'KV B/tok':>8}")
    for name, r in results.items():
        print(f"{name:>40} {r['tau']:6.3f} {r['se']:6.3f} {r['params']:9,d} {r['step_ms']:7.3f} "
              f"{r['macs']:9,d} {r['kv_bytes']:8d}")
    kimi = kimi_geometry()
    print("\nKimi-K2.5 geometry (32,000-token draft vocabulary):")
    for name, r in kimi.items():
        print(f"{name:>6}: {r['params'] / 1e9:.2f} B parameters, KV {r['kv_bytes']:,} B/token, "
              f"{r['macs'] / 1e6:,.0f} M MACs/token + {r['score_macs']:,} per cached token")
    print(json.dumps({"study": results, "kimi": kimi, "seeds": seeds, "steps": args.steps,
                      "samples": args.samples}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
