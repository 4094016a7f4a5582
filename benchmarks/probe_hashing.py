"""Benchmark the host probe's hash of merged records (``eyas status --config``): what it costs
to cover each record's token ids and loss mask, not only its id and length.

    python benchmarks/probe_hashing.py --quick     # 400 records, seconds
    python benchmarks/probe_hashing.py             # 2,000 records at the users' mean length

A synthetic ``merged/train.jsonl`` in eyas's own layout (records of 1,000-6,000 tokens, ids
below Kimi's 163,840) is hashed three ways in one process: the probe's
`content_hashes` (stdlib only, the arrays' text taken as written when compact), a full parse
of every record (``json.loads`` + compact ``json.dumps``: the baseline, what the probe falls
back to), and eyas's own `plan_shards` (orjson). All three must give the same hashes. Printed:
MB/s of each and the ratio probe / full parse; the last line is one JSON object with the
figures and the seconds the probe needs for the users' 850 MB merged set.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

USERS_MERGED_BYTES = 850e6  # the users' merged set (docs/remote.md)


def _write(path: Path, n: int) -> None:
    from eyas.io import dumps_line

    rng = random.Random(0)
    with open(path, "wb") as fh:
        for i in range(n):
            t = rng.randint(1000, 6000)
            fh.write(dumps_line({"id": f"s{i}", "dataset": "B1",
                                 "input_ids": [rng.randrange(163840) for _ in range(t)],
                                 "loss_mask": [0] * (t // 3) + [1] * (t - t // 3)}))


def _full_parse(path: Path, shard_size: int) -> dict[int, str]:
    hashes, h, count = {}, hashlib.sha256(), 0
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            obj = json.loads(line)
            h.update("\t".join([str(obj["id"]), json.dumps(obj["input_ids"], separators=(",", ":")),
                                json.dumps(obj["loss_mask"], separators=(",", ":"))]).encode()
                     + b"\n")
            count += 1
            if count % shard_size == 0:
                hashes[count // shard_size - 1] = h.hexdigest()[:16]
                h = hashlib.sha256()
    if count % shard_size:
        hashes[count // shard_size] = h.hexdigest()[:16]
    return hashes


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    from eyas.extract.config import ExtractConfig
    from eyas.extract.shards import plan_shards
    from eyas.remote._probe_script import content_hashes

    n, shard_size = (400, 64) if args.quick else (2000, 64)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.jsonl"
        _write(path, n)
        size = path.stat().st_size
        runs = {
            "probe": lambda: content_hashes(str(path), shard_size),
            "full_parse": lambda: _full_parse(path, shard_size),
            "plan_shards": lambda: {s.index: s.content_hash
                                    for s in plan_shards(path, ExtractConfig(shard_size=shard_size))},
        }
        seconds, results = {}, {}
        for name, run in runs.items():
            t0 = time.perf_counter()
            results[name] = run()
            seconds[name] = time.perf_counter() - t0
    if not (results["probe"] == results["full_parse"] == results["plan_shards"]):
        print("the three hashes differ", file=sys.stderr)
        return 1
    rate = {k: size / 1e6 / v for k, v in seconds.items()}
    for k in runs:
        print(f"{k:<12} {size / 1e6:6.1f} MB in {seconds[k]:6.2f} s = {rate[k]:7.1f} MB/s")
    ratio = seconds["full_parse"] / seconds["probe"]
    print(f"probe / full parse: {ratio:.1f}x faster; the users' 850 MB: "
          f"{USERS_MERGED_BYTES / 1e6 / rate['probe']:.0f} s")
    print(json.dumps({"bytes": size, "records": n, "mb_per_s": rate, "probe_over_full_parse": ratio,
                      "users_seconds": USERS_MERGED_BYTES / 1e6 / rate["probe"]}))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
