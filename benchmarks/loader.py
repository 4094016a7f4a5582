"""Training data loader: the tokens/s it hands the trainer from storage "compact" shards,
today's loader against the previous one, in the same run, and against what one GPU of the
users' run consumes.

    python benchmarks/loader.py --quick   # 6 samples of 8,192 tokens at the Kimi-K2.5 width
                                          # (~1 GB of shards; a few minutes)
    python benchmarks/loader.py           # 16 samples
    python benchmarks/loader.py --tiny    # seconds: a smoke test of the same code

Shards: written by ``eyas.extract.store.write_shard`` (storage "compact": aux states in float8
with one scale per token and layer, the top-32 teacher), at Kimi-K2.5's width (3 × 7,168 aux
states a token), each sample 8,192 tokens -- 0.18 GB of float8 a sample.

- old: ``Batches(prefetch=0)``: each micro-batch read and dequantised (float8 → bf16) on the
  training thread, as before;
- new: ``Batches(prefetch=4, dequantize=False)``, as ``eyas.train.run`` builds it: a thread
  reads ahead; the float8 states are widened on the device (``Batch.aux_on``), where it costs
  a few milliseconds on a GPU. On this CPU-only machine that widening is measured apart
  (``cpu_dequantise_tok_s``): on a CPU device it stays on the training thread.

Each figure: the tokens of the micro-batches over the wall time the training thread spends
waiting in ``next(batches)`` (micro-batch 1, one pass, shards in the page cache).
``loader_tok_s`` takes the batches as fast as they come (the loader's own rate);
``stall_s`` lets the training thread spend each sample's tokens / ``--consume-tok-s`` seconds
elsewhere first (a GPU step, which leaves the CPU free: a sleep stands in for it) and
reports the total wait beyond the first batch. The consumption: the users' run trains about
32,000 tokens/s across 8 GPUs, 4,000 a GPU (issue 19). Goal: ``ratio`` = loader tokens/s over
that ≥ 2.

The last line is one JSON object: ``loader_tok_s``, ``old_loader_tok_s``,
``consume_tok_s``, ``ratio``, ``old_ratio``, ``stall_s``, ``old_stall_s``,
``cpu_dequantise_tok_s``, the configuration and ``load_average`` (the machine is shared).
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from eyas.extract.store import quantize_aux, shard_name, write_shard  # noqa: E402
from eyas.train.data import Batches, OfflineSource  # noqa: E402

KIMI_HIDDEN = 7168
TOPK = 32
USERS_TOK_S_PER_GPU = 32_000 / 8
"""The users' Kimi-K2.5 run: about 32,000 training tokens/s across 8 GPUs (issue 19)."""


def write_shards(root: Path, *, samples: int, tokens: int, hidden: int, per_shard: int) -> int:
    """`samples` random samples of `tokens` tokens in "compact" shards; returns bytes written."""
    g = torch.Generator().manual_seed(0)
    for index in range(0, samples, per_shard):
        batch = []
        for i in range(index, min(samples, index + per_shard)):
            aux = torch.randn(tokens, 3 * hidden, generator=g, dtype=torch.bfloat16)
            aux_fp8, aux_scale = quantize_aux(aux)
            del aux
            logp, ids = torch.randn(tokens, 4 * TOPK, generator=g).log_softmax(-1).topk(TOPK)
            batch.append({"id": f"s{i}", "input_ids": torch.randint(0, 160_000, (tokens,),
                                                                    generator=g),
                          "loss_mask": torch.ones(tokens, dtype=torch.long),
                          "aux_fp8": aux_fp8, "aux_scale": aux_scale,
                          "topk_ids": ids, "topk_logprobs": logp.half()})
        write_shard(root / shard_name(index // per_shard), batch, storage="compact",
                    aux_layers=[2, 30, 58], hidden_size=hidden, topk=TOPK)
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def take(batches: Batches, n: int, consume_tok_s: float | None) -> dict:
    """Wall seconds the training thread waits for `n` micro-batches (the first one apart);
    with `consume_tok_s` it spends each batch's tokens / that rate elsewhere first."""
    waits, tokens = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        batch = next(batches)
        waits.append(time.perf_counter() - t0)
        tokens += batch.num_tokens
        if consume_tok_s:
            time.sleep(batch.num_tokens / consume_tok_s)
    batches.close()
    first = n and waits[0]
    later = sum(waits[1:])
    return {"tokens": tokens, "wait_s": round(sum(waits), 3), "first_s": round(first, 3),
            "stall_s": round(later, 3),
            "tok_s": round((tokens - tokens / n) / max(later, 1e-9), 1) if n > 1 else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="6 samples (default 16)")
    p.add_argument("--tiny", action="store_true", help="narrow and short samples (smoke test)")
    p.add_argument("--consume-tok-s", type=float, default=USERS_TOK_S_PER_GPU,
                   help="the trainer's consumption, tokens/s a process (default: the users' "
                        "4,000 a GPU)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--keep", type=Path, help="write the shards here and keep them")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    samples = 6 if args.quick else 16
    tokens, hidden = (512, 256) if args.tiny else (8192, KIMI_HIDDEN)
    if args.tiny:
        samples = 6
    load_before = os.getloadavg()[0]
    work = args.keep or Path(tempfile.mkdtemp(prefix="eyas-loader-bench-"))
    try:
        nbytes = write_shards(work / "hidden", samples=samples, tokens=tokens, hidden=hidden,
                              per_shard=4)
        src = OfflineSource(work / "hidden")
        for k in range(len(src)):  # into the page cache: both loaders read it from memory
            src.load(k, dequantize=False)
        print(f"{samples} samples × {tokens:,} tokens, aux width 3 × {hidden:,}, storage "
              f"compact: {nbytes / 2**30:.2f} GiB of shards; load average {load_before:.1f}",
              flush=True)

        def loader(new: bool) -> Batches:
            return Batches(src, micro_batch=1, seed=0, prefetch=4 if new else 0,
                           dequantize=not new)

        rates = {"new": take(loader(True), samples, None),
                 "old": take(loader(False), samples, None)}
        stalls = {"new": take(loader(True), samples, args.consume_tok_s),
                  "old": take(loader(False), samples, args.consume_tok_s)}
        batch = next(loader(True))
        t0 = time.perf_counter()
        batch.aux_on(torch.device("cpu"))
        widen_s = time.perf_counter() - t0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    new, old = rates["new"]["tok_s"], rates["old"]["tok_s"]
    result = {"loader_tok_s": new, "old_loader_tok_s": old, "consume_tok_s": args.consume_tok_s,
              "ratio": round(new / args.consume_tok_s, 2),
              "old_ratio": round(old / args.consume_tok_s, 2),
              "stall_s": stalls["new"]["stall_s"], "old_stall_s": stalls["old"]["stall_s"],
              "consumed_s": round(stalls["new"]["tokens"] / args.consume_tok_s, 1),
              "cpu_dequantise_tok_s": round(batch.num_tokens / widen_s, 1),
              "config": {"samples": samples, "tokens": tokens, "aux_width": 3 * hidden,
                         "topk": TOPK, "storage": "compact", "micro_batch": 1, "prefetch": 4,
                         "threads": args.threads, "shard_gib": round(nbytes / 2**30, 2)},
              "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)]}
    print(f"loader: {new:,.0f} tok/s (old {old:,.0f}); against {args.consume_tok_s:,.0f} tok/s "
          f"consumed: {result['ratio']}x (old {result['old_ratio']}x); the trainer waited "
          f"{result['stall_s']} s (old {result['old_stall_s']} s) over "
          f"{result['consumed_s']} s of steps; widening float8 on this CPU: "
          f"{result['cpu_dequantise_tok_s']:,.0f} tok/s", flush=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
