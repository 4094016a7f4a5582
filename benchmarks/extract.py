"""Extraction benchmark: HF-backend throughput against a bare forward, and bytes per token.

    python benchmarks/extract.py --quick      # CPU, about a minute or two

For each model (the tiny target when it is already built -- else a random Llama of the same
shape -- and a larger random Llama, hidden 512, 8 layers) the same length-sorted, padded
batches run twice: through the bare base model (``model.model``: the decoder stack and final
norm, what storage "final" needs) and through ``HFBackend.run_batch`` (hooks on the three aux
layers, bf16 cast, copy to the CPU, NaN/inf check). Efficiency = extract tokens/s divided by
forward tokens/s (real tokens, not padding); best of `--reps` timings each. Bytes per token
are measured from shards actually written, per storage option ("final", "topk", "compact"),
against SpecForge's 8·H.
The last line is one JSON object (figures of the larger model, plus a ``models`` entry).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from eyas.extract.hf_backend import HFBackend, pad_batch, plan_batches  # noqa: E402
from eyas.extract.plan import specforge_bytes_per_token  # noqa: E402
from eyas.extract.store import DATA_NAME, write_shard  # noqa: E402
from eyas.layers import default_aux_layers  # noqa: E402


def tiny_or_lookalike() -> tuple[str, torch.nn.Module]:
    from eyas.layout import cache_dir
    from eyas.tiny.build import TARGET_NAME, is_complete

    folder = cache_dir() / TARGET_NAME
    if is_complete(folder):
        from transformers import AutoModelForCausalLM

        return "tiny-target", AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return "tiny-shaped-random", random_llama(hidden=256, layers=4, vocab=2048)


def random_llama(hidden: int, layers: int, vocab: int) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden,
                      num_hidden_layers=layers, num_attention_heads=max(4, hidden // 64),
                      num_key_value_heads=max(2, hidden // 256), max_position_embeddings=4096)
    return LlamaForCausalLM(cfg)


def make_records(n: int, vocab: int, lo: int, hi: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = rng.randint(lo, hi)
        out.append({"id": f"b{i}", "input_ids": [rng.randrange(1, vocab) for _ in range(t)],
                    "loss_mask": [1] * t})
    return out


def bench_model(name: str, model: torch.nn.Module, records: list[dict], batch_tokens: int,
                reps: int, workdir: Path) -> dict:
    model = model.eval()
    hidden = model.config.hidden_size
    aux = default_aux_layers(model.config.num_hidden_layers)
    batches = [[records[i] for i in b] for b in
               plan_batches([len(r["input_ids"]) for r in records], batch_tokens)]
    tokens = sum(len(r["input_ids"]) for r in records)
    padded = [pad_batch(b) for b in batches]
    backend = HFBackend(None, model=model, aux_layers=aux, storage="final", device="cpu")

    def bare() -> None:
        with torch.inference_mode():
            for ids, mask in padded:
                model.model(input_ids=ids, attention_mask=mask, use_cache=False)

    def extract() -> list[dict]:
        out = []
        for b in batches:
            out.extend(backend.run_batch(b).samples)
        return out

    bare()  # warm-up
    extract()
    t_bare, t_ext = [], []
    for _ in range(reps):  # interleaved, so load from other processes hits both alike
        t0 = time.perf_counter()
        bare()
        t_bare.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        samples = extract()
        t_ext.append(time.perf_counter() - t0)
    forward_tok_s = tokens / min(t_bare)
    extract_tok_s = tokens / min(t_ext)

    bpt = {}
    for storage in ("final", "topk", "compact"):
        if storage != "final":
            tb = HFBackend(None, model=model, aux_layers=aux, storage=storage, topk=32, device="cpu")
            samples = [s for b in batches for s in tb.run_batch(b).samples]
        shard = workdir / f"{name}-{storage}"
        rec = write_shard(shard, samples, storage=storage, aux_layers=aux, hidden_size=hidden,
                          topk=32)
        bpt[storage] = round((shard / DATA_NAME).stat().st_size / rec["num_tokens"], 1)
    ratio = {k: round(v / specforge_bytes_per_token(hidden), 3) for k, v in bpt.items()}
    return {
        "model": name, "hidden_size": hidden, "layers": model.config.num_hidden_layers,
        "aux_layers": aux, "tokens": tokens, "batches": len(batches),
        "forward_tok_s": round(forward_tok_s, 1), "extract_tok_s": round(extract_tok_s, 1),
        "efficiency": round(extract_tok_s / forward_tok_s, 3),
        "bytes_per_token": bpt, "specforge_bytes_per_token": specforge_bytes_per_token(hidden),
        "ratio_to_specforge": ratio,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small CPU run (default)")
    p.add_argument("--samples", type=int, default=None)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    n = args.samples or (24 if args.quick else 256)
    results = []
    with tempfile.TemporaryDirectory(prefix="eyas-bench-extract-") as tmp:
        name, tiny = tiny_or_lookalike()
        records = make_records(n, tiny.config.vocab_size, 32, 256)
        results.append(bench_model(name, tiny, records, 4096, args.reps, Path(tmp)))
        print(json.dumps(results[-1]), file=sys.stderr)
        big = random_llama(hidden=512, layers=8, vocab=8192)
        records = make_records(n, 8192, 32, 256, seed=1)
        results.append(bench_model("llama-h512-l8", big, records, 4096, args.reps, Path(tmp)))
        print(json.dumps(results[-1]), file=sys.stderr)
    main_fig = results[-1]
    print(json.dumps({
        "extract_tok_s": main_fig["extract_tok_s"],
        "forward_tok_s": main_fig["forward_tok_s"],
        "efficiency": main_fig["efficiency"],
        "bytes_per_token": main_fig["bytes_per_token"],
        "specforge_bytes_per_token": main_fig["specforge_bytes_per_token"],
        "ratio_to_specforge": main_fig["ratio_to_specforge"],
        "model": main_fig["model"],
        "models": results,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
