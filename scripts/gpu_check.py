"""HF-backend extraction throughput on a Llama-3.1-8B-shaped model with random weights
(and, as subcommands, a training step and the offline evaluator: see the sections below).

    bash scripts/gpu_check.sh            # one GPU, bf16, a few minutes
    python scripts/gpu_check.py --tiny   # CPU smoke test of the same code path
    python scripts/gpu_check.py evaluate [--tiny]   # evaluator: tiny target, CPU vs GPU τ

Needs only torch and transformers (no downloads: the model is built from a LlamaConfig in
memory, weights random). Runs the same length-sorted padded batches through the bare base
model and through ``HFBackend.run_batch`` (storage "final"), and prints one JSON line:
tokens/s of each, efficiency, and the extraction's share of the GPU's dense bf16 peak
(FLOPs ~= 2 x parameters x tokens; attention FLOPs not counted, so the share is a floor).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from eyas.extract.hf_backend import HFBackend, pad_batch, plan_batches  # noqa: E402
from eyas.layers import default_aux_layers  # noqa: E402

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}


def build(tiny: bool, device: torch.device) -> LlamaForCausalLM:
    if tiny:
        cfg = LlamaConfig(vocab_size=1024, hidden_size=128, intermediate_size=256,
                          num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)
        dtype = torch.float32
    else:  # Llama-3.1-8B shape
        cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                          num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                          max_position_embeddings=131072, rope_theta=500000.0)
        dtype = torch.bfloat16
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # build straight in bf16: no 32 GB fp32 copy first
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny", action="store_true", help="tiny model on CPU (smoke test)")
    p.add_argument("--samples", type=int, default=None)
    p.add_argument("--batch-tokens", type=int, default=None)
    p.add_argument("--seconds", type=float, default=None, help="time budget per measurement")
    args = p.parse_args(argv)
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    samples = args.samples or (16 if args.tiny else 128)
    batch_tokens = args.batch_tokens or (2048 if args.tiny else 32768)
    budget = args.seconds or (5.0 if args.tiny else 30.0)
    t_build = time.perf_counter()
    model = build(args.tiny, device)
    params = sum(p.numel() for p in model.model.parameters())  # the head is not run for "final"
    build_s = time.perf_counter() - t_build
    rng = random.Random(0)
    lo, hi = (16, 128) if args.tiny else (512, 4096)
    records = [{"id": str(i), "input_ids": [rng.randrange(1, model.config.vocab_size)
                                            for _ in range(rng.randint(lo, hi))],
                "loss_mask": []} for i in range(samples)]
    for r in records:
        r["loss_mask"] = [1] * len(r["input_ids"])
    batches = [[records[i] for i in b] for b in
               plan_batches([len(r["input_ids"]) for r in records], batch_tokens)]
    tokens = sum(len(r["input_ids"]) for r in records)
    aux = default_aux_layers(model.config.num_hidden_layers)
    backend = HFBackend(None, model=model, aux_layers=aux, storage="final",
                        device=str(device))

    def padded(b):
        ids, mask = pad_batch(b)
        return ids.to(device), mask.to(device)

    inputs = [padded(b) for b in batches]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def timed(fn) -> float:
        best, spent = float("inf"), 0.0
        fn()  # warm-up
        while spent < budget or best == float("inf"):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            dt = time.perf_counter() - t0
            best, spent = min(best, dt), spent + dt
        return best

    def bare():
        with torch.inference_mode():
            for ids, mask in inputs:
                model.model(input_ids=ids, attention_mask=mask, use_cache=False)

    def extract():
        for b in batches:
            backend.run_batch(b)

    t_bare = timed(bare)
    t_ext = timed(extract)
    gpu = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in gpu), None)
    ext_tok_s = tokens / t_ext
    tflops = 2 * params * ext_tok_s / 1e12
    print(json.dumps({
        "device": gpu, "model": "tiny" if args.tiny else "llama-3.1-8b-shaped",
        "params_no_head": params, "tokens": tokens, "batches": len(batches),
        "batch_tokens": batch_tokens, "aux_layers": aux, "build_s": round(build_s, 1),
        "forward_tok_s": round(tokens / t_bare, 1), "extract_tok_s": round(ext_tok_s, 1),
        "efficiency": round(t_bare / t_ext, 3), "extract_tflops": round(tflops, 2),
        "peak_bf16_tflops": peak,
        "share_of_peak": round(tflops / peak, 4) if peak and device.type == "cuda" else None,
    }))
    return 0



# ------------------------------------------------------------------------------------------
# Training step (issue 5): `python scripts/gpu_check.py train [--tiny]`
# A Llama-3.1-8B-shaped EAGLE-3 drafter (H 4096, 32/8 heads, MLP 14336, target vocabulary
# 128,256, draft vocabulary 32,000), random weights and data, TTT unroll 7, bf16 autocast.
# Prints one JSON line: training tokens/s and model FLOPs utilisation (drafter matmuls only,
# 6 x params-touched per token per unroll step; attention and the teacher's head not counted,
# so the figure is a floor).
# ------------------------------------------------------------------------------------------
def train_check(argv: list[str] | None = None) -> int:
    from eyas.train.config import TrainConfig
    from eyas.train.data import Batches, MemorySource
    from eyas.train.model import Drafter, DrafterConfig
    from eyas.train.trainer import Trainer
    from eyas.train.vocab import DraftVocab

    p = argparse.ArgumentParser(description="drafter training throughput")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    args = p.parse_args(argv)
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    if args.tiny:
        H, M, nq, nkv, V, Vd, T, steps = 64, 128, 4, 2, 512, 256, 64, 2
    else:
        H, M, nq, nkv, V, Vd, T, steps = 4096, 14336, 32, 8, 128_256, 32_000, 2048, 6
    T, steps = args.seq or T, args.steps or steps
    cfg = DrafterConfig(hidden_size=H, target_hidden_size=H, intermediate_size=M,
                        num_attention_heads=nq, num_key_value_heads=nkv, vocab_size=V,
                        draft_vocab_size=Vd)
    g = torch.Generator().manual_seed(0)
    samples = [{"input_ids": torch.randint(0, V, (T,), generator=g),
                "loss_mask": torch.ones(T, dtype=torch.long),
                "aux_hidden": torch.randn(T, 3 * H, generator=g).bfloat16(),
                "final_hidden": torch.randn(T, H, generator=g).bfloat16()}
               for _ in range(steps + 1)]
    torch.manual_seed(0)
    drafter = Drafter(cfg, torch.randn(V, H) * 0.02)
    head = (torch.randn(V, H) * 0.02).to(device)
    vocab = DraftVocab(torch.randperm(V, generator=g)[:Vd].sort().values, V)
    tcfg = TrainConfig(steps=steps + 1, micro_batch=1, ttt_steps=7, warmup_steps=1,
                       device=str(device))
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(tcfg, drafter, vocab, Batches(MemorySource(samples), micro_batch=1,
                                                         seed=0), None, Path(tmp),
                          lm_head_VH=head)
        trainer.step()  # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(steps):
            trainer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    tok_s = T * steps / dt
    kv = nkv * (H // nq)
    per_step = 2 * H * (H + 2 * kv) + H * H + 3 * H * M + H * Vd
    flops_per_token = 6 * (3 * H * H + 7 * per_step)
    gpu = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in gpu), None)
    tflops = flops_per_token * tok_s / 1e12
    print(json.dumps({
        "check": "train", "device": gpu, "model": "tiny" if args.tiny else "llama-3.1-8b-drafter",
        "seq": T, "steps": steps, "ttt_steps": 7, "draft_vocab": Vd,
        "trainable_params": drafter.num_trainable_parameters(),
        "train_tok_s": round(tok_s, 1), "model_tflops": round(tflops, 2),
        "mfu": round(tflops / peak, 4) if peak and device.type == "cuda" else None,
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1)
        if device.type == "cuda" else None,
    }))
    return 0


# ------------------------------------------------------------------------------------------
# Offline evaluator: `python scripts/gpu_check.py evaluate [--tiny]`
# The tiny target and a drafter trained for it (here, online, unless --drafter names one) run
# the evaluator twice on the same held-out prompts: on the CPU and on the GPU, both float32,
# greedy, 3 draft tokens. τ must match (within 2 %: float32 kernels differ in the last bits, which
# can flip a near tie); then once more on the GPU in bf16 for tokens/s. Prints one JSON line:
# τ and tokens/s with and without the drafter per run (cpu_fp32, dev_fp32, dev_bf16), lossless
# checks, tau_match; exit status 1 when τ differs or a float32 run is not lossless.
# --tiny: both runs on the CPU (smoke test of the same code path).
# ------------------------------------------------------------------------------------------
def evaluate_check(argv: list[str] | None = None) -> int:
    import tempfile

    from eyas.evaluate.config import EvaluateConfig
    from eyas.evaluate.prompts import file_prompts, select
    from eyas.evaluate.run import evaluate
    from eyas.prepare.phases import demo_data_dir
    from eyas.prepare.tokenize import load_tokenizer
    from eyas.tiny import build_tiny_target

    p = argparse.ArgumentParser(description="offline evaluator: CPU vs GPU")
    p.add_argument("--tiny", action="store_true", help="both runs on the CPU, fewer prompts")
    p.add_argument("--drafter", type=Path, help="an exported drafter of the tiny target")
    p.add_argument("--steps", type=int, default=None, help="training steps of the drafter")
    p.add_argument("--prompts", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=None)
    args = p.parse_args(argv)
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    steps = args.steps or (4 if args.tiny else 150)
    n_prompts = args.prompts or (3 if args.tiny else 16)
    max_new = args.max_new_tokens or (16 if args.tiny else 64)
    t0 = time.perf_counter()
    model_dir = build_tiny_target()
    build_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        drafter = args.drafter or _train_tiny_drafter(model_dir, Path(tmp), steps, device)
        tok = load_tokenizer(model_dir)
        selection = select([("eval_prompts", file_prompts(demo_data_dir() / "eval_prompts.jsonl",
                                                          tok))],
                           per_dataset=n_prompts, max_tokens=2048, training=set())
        base = EvaluateConfig(prompts_per_dataset=n_prompts, max_new_tokens=max_new,
                              draft_tokens=3, mode="greedy", dtype="float32", device="cpu",
                              threads=1 if args.tiny else None)
        runs = {"cpu_fp32": base, "dev_fp32": base.model_copy(update={"device": str(device)})}
        if device.type == "cuda":
            runs["dev_bf16"] = base.model_copy(update={"device": str(device),
                                                          "dtype": "bfloat16"})
        reports = {name: evaluate(model_dir, drafter, selection, cfg, Path(tmp) / name,
                                  tokenizer=tok, on_log=None) for name, cfg in runs.items()}
    tau_cpu, tau_dev = (reports[n]["acceptance_length"] for n in ("cpu_fp32", "dev_fp32"))
    match = abs(tau_cpu - tau_dev) <= 0.02 * tau_cpu
    out = {"check": "evaluate", "device": torch.cuda.get_device_name(0)
           if device.type == "cuda" else "cpu", "tiny_target_build_s": round(build_s, 1),
           "drafter_steps": None if args.drafter else steps, "prompts": n_prompts,
           "max_new_tokens": max_new, "draft_tokens": 3, "tau_match": match}
    for name, r in reports.items():
        out[name] = {"tau": round(r["acceptance_length"], 4),
                     "baselines": {m: round(s["acceptance_length"], 4)
                                   for m, s in r["baselines"].items()},
                     "tokens_per_s": {m: round(v, 1) for m, v in r["tokens_per_s"].items() if v},
                     "draft_to_target_cost": round(r["costs"]["draft_to_target"], 3),
                     "predicted_speedup_this_device": (
                         round(r["predicted_speedup_this_device"], 3)
                         if r["predicted_speedup_this_device"] is not None else None),
                     "lossless": r["lossless"]["equal"],
                     "near_tie_divergences": r["lossless"].get("near_ties"),
                     "real_divergences": r["lossless"].get("real"),
                     "mismatches": r["lossless"]["mismatches"][:3]}
    print(json.dumps(out))
    return 0 if match and all(r["lossless"]["equal"] for n, r in reports.items()
                              if n != "dev_bf16") else 1


def _train_tiny_drafter(model_dir: Path, tmp: Path, steps: int, device: torch.device) -> Path:
    """Train and export a drafter for the tiny target on its own Q&A (online: the target runs
    beside the drafter), as the demo does, in `steps` steps."""
    from eyas.layers import default_aux_layers
    from eyas.train.config import TrainConfig
    from eyas.train.data import OnlineSource
    from eyas.train.run import train_drafter
    from eyas.train.tiny_data import tiny_records, write_jsonl

    train = write_jsonl(tmp / "train.jsonl", tiny_records(model_dir, 96))
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    cfg = TrainConfig(steps=steps, lr=2e-3, warmup_steps=min(20, steps // 4), micro_batch=4,
                      max_len=256, ttt_steps=3, draft_vocab_size=vocab, eval_every=steps,
                      checkpoint_every=steps, log_every=max(1, steps // 5), device=str(device))
    layers = default_aux_layers(json.loads((model_dir / "config.json").read_text())
                                ["num_hidden_layers"])
    source = OnlineSource(train, model_dir, storage="final", aux_layers=layers, device=str(device))
    summary = train_drafter(source, None, model_dir, tmp / "drafter", cfg, aux_layers=layers,
                            on_log=None)
    return Path(summary["export"])


if __name__ == "__main__":
    if sys.argv[1:2] == ["train"]:
        raise SystemExit(train_check(sys.argv[2:]))
    if sys.argv[1:2] == ["sglang"]:  # SGLang backend vs HF on a tiny DeepSeek-V3 (own module)
        from gpu_check_sglang import main as sglang_check

        raise SystemExit(sglang_check(sys.argv[2:]))
    if sys.argv[1:2] == ["evaluate"]:
        raise SystemExit(evaluate_check(sys.argv[2:]))
    raise SystemExit(main())
