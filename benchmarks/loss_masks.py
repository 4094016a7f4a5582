"""Benchmark phase 2's loss masks: a tiktoken-based slow tokenizer against a fast one.

    python benchmarks/loss_masks.py --quick     # 100 conversations, well under a minute
    python benchmarks/loss_masks.py             # 600 conversations

Both tokenizers are built here, offline, on the same standard-library text with a vocabulary of
4,096: the tiny target's fast byte-level BPE (baseline) and the Kimi-like tiktoken tokenizer,
a slow Python class loaded with ``trust_remote_code`` (`eyas.tiny.kimi_tokenizer`). Each renders
the same synthetic conversations (questions and answers made of standard-library docstrings)
with its own chat template and builds ``input_ids`` + ``loss_mask`` the way a phase-2 worker
does (`render_with_spans`, then `encode_with_offsets` on the batch). Printed per tokenizer:
tokens per CPU-second in one process, and the share of that time spent getting ids and
offsets. The last line printed is one JSON object with the figures, including the slow/fast
throughput ratio and the CPU-hours the slow path needs for the users' 87.8M tokens.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

USERS_TOKENS = 87.8e6  # the users' merged set (CONTEXT.md)


def _conversations(n: int, seed: int = 0):
    from eyas.conversation import Conversation, Message
    from eyas.tiny.corpus import iter_docitems

    docs = [d.doc for d in iter_docitems() if len(d.doc) > 200]
    rng = random.Random(seed)
    out = []
    for i in range(n):
        msgs = [Message("system", "You are a helpful assistant.")]
        for _ in range(rng.randint(1, 3)):
            msgs.append(Message("user", rng.choice(docs)[:300]))
            msgs.append(Message("assistant", rng.choice(docs), reasoning_content=rng.choice(docs)[:400]))
        out.append(Conversation(f"c{i}", msgs))
    return out


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _run(tok, convs, batch: int = 64) -> dict:
    from eyas.prepare.loss_mask import cached_probe, mask_from_offsets, render_with_spans
    from eyas.prepare.offsets import encode_with_offsets

    probe = cached_probe(tok)
    tokens = supervised = 0
    render_s = encode_s = 0.0
    for k in range(0, len(convs), batch):
        c0 = _cpu()
        rendered = [render_with_spans(tok, c, probe=probe) for c in convs[k : k + batch]]
        c1 = _cpu()
        encoded = encode_with_offsets(tok, [r.text for r in rendered])
        c2 = _cpu()
        for r, (ids, offsets) in zip(rendered, encoded, strict=True):
            mask = mask_from_offsets(offsets, r.spans)
            tokens += len(ids)
            supervised += sum(mask)
        render_s += c1 - c0
        encode_s += c2 - c1
    total = render_s + encode_s
    return {
        "tokens": tokens,
        "supervised": supervised,
        "cpu_s": round(total, 2),
        "tok_per_cpu_s": round(tokens / total),
        "encode_share": round(encode_s / total, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 conversations")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from eyas.tiny.kimi_tokenizer import build_kimi_tokenizer
    from eyas.tiny.tokenizer import build_tokenizer

    convs = _conversations(100 if args.quick else 600)
    with tempfile.TemporaryDirectory() as tmp:
        fast = AutoTokenizer.from_pretrained(build_tokenizer(Path(tmp) / "fast"))
        slow = AutoTokenizer.from_pretrained(
            build_kimi_tokenizer(Path(tmp) / "kimi"), trust_remote_code=True
        )
        _run(fast, convs[:8])  # warm up both (imports, template compilation)
        _run(slow, convs[:8])
        started = time.monotonic()
        base = _run(fast, convs)
        ours = _run(slow, convs)
        wall = time.monotonic() - started
    for name, r in (("fast (baseline)", base), ("tiktoken, slow", ours)):
        print(
            f"{name:<16} {r['tokens']:>9,} tokens  {r['cpu_s']:>7.2f} CPU-s  "
            f"{r['tok_per_cpu_s']:>9,} tok/CPU-s  ids+offsets {100 * r['encode_share']:.0f}%"
        )
    ratio = ours["tok_per_cpu_s"] / base["tok_per_cpu_s"]
    hours = USERS_TOKENS / ours["tok_per_cpu_s"] / 3600
    print(f"slow/fast throughput {ratio:.2f}; the users' 87.8M tokens: {hours:.1f} CPU-hours "
          f"on the slow path ({wall:.0f} s wall for this run)")
    print(json.dumps({"conversations": len(convs), "fast": base, "slow": ours,
                      "slow_over_fast": round(ratio, 3), "users_cpu_hours": round(hours, 2)}))


if __name__ == "__main__":
    main()
