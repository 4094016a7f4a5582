"""The teacher of storage "final", computed every step vs precomputed once (issue 27, point 5).

    python benchmarks/teacher.py --quick    # T 512, hidden 512 (seconds)
    python benchmarks/teacher.py            # T 2,048, hidden 1,024

Training with storage "final" rebuilds each sample's teacher in every epoch
(`eyas.train.ttt.TargetHead.teacher`): the full-vocabulary argmax (``final @ lm_headᵀ`` over
all V = 163,840 rows, in chunks) and the draft-vocabulary log-probabilities (the Vd = 32,000
rows). Measured here on CPU, at the Kimi vocabulary sizes and a reduced hidden size (the
cost of both matmuls is linear in it), one torch thread, median of ``--repeats``:

- ``baseline_s``: today's teacher from the stored final state;
- ``argmax_precomputed_s``: what is left with the argmax and its in-vocabulary bit stored
  (4 bytes + 1 bit a token, computed once after the draft vocabulary is built): the
  draft-vocabulary distribution alone;
- ``topk_s``: a stored top-K draft-vocabulary teacher (``teacher_from_topk``; K ids + K
  log-probs, 6·K bytes a token) replacing the final state (2·H bytes: 14 KB at H = 7,168).

Nothing of this is wired into training (not built: docs/training.md "The teacher, every
epoch"). Last line: JSON with the three times, their ratios to the baseline and the bytes per
token of each form.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from eyas.train.ttt import TargetHead, teacher_from_topk  # noqa: E402
from eyas.train.vocab import DraftVocab  # noqa: E402

KIMI_VOCAB, DRAFT_VOCAB, KIMI_HIDDEN = 163_840, 32_000, 7_168


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="T 512, hidden 512")
    p.add_argument("--tokens", type=int, default=None)
    p.add_argument("--hidden", type=int, default=None)
    p.add_argument("--topk", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    T = args.tokens or (512 if args.quick else 2048)
    H = args.hidden or (512 if args.quick else 1024)
    g = torch.Generator().manual_seed(0)
    head_VH = (torch.randn(KIMI_VOCAB, H, generator=g) * 0.02).to(torch.bfloat16)
    d2t = torch.randperm(KIMI_VOCAB, generator=g)[:DRAFT_VOCAB].sort().values
    vocab = DraftVocab(d2t, KIMI_VOCAB)
    head = TargetHead(head_VH, vocab)
    final_BTH = torch.randn(1, T, H, generator=g).to(torch.bfloat16)
    baseline = head.teacher(final_BTH)
    top_BT, in_vocab_BT = baseline.top_BT.to(torch.int32), baseline.in_vocab_BT

    def draft_only():  # the part left when the argmax and its bit are stored
        logits = final_BTH.reshape(T, H).float() @ head.head_VdH.T
        return logits.log_softmax(-1), top_BT.long(), in_vocab_BT

    k = args.topk
    logp = baseline.logp_BTVd.reshape(T, -1)
    top_logp, top_ids = logp.topk(k, -1)
    topk_ids = d2t[top_ids].view(1, T, k).to(torch.int32)
    topk_logp = top_logp.view(1, T, k).to(torch.float16)

    # The precomputed form is the same teacher: the same restricted distribution and argmax.
    logp_left, top_left, _ = draft_only()
    same = bool(torch.allclose(logp_left.view_as(baseline.logp_BTVd), baseline.logp_BTVd,
                               atol=1e-4) and torch.equal(top_left.view_as(baseline.top_BT),
                                                          baseline.top_BT))
    base_s = _median(lambda: head.teacher(final_BTH), args.repeats)
    argmax_s = _median(draft_only, args.repeats)
    topk_s = _median(lambda: teacher_from_topk(topk_ids, topk_logp, vocab), args.repeats)
    result = {
        "tokens": T, "hidden": H, "vocab": KIMI_VOCAB, "draft_vocab": DRAFT_VOCAB, "topk": k,
        "baseline_s": round(base_s, 4), "argmax_precomputed_s": round(argmax_s, 4),
        "topk_s": round(topk_s, 4), "precomputed_is_the_same_teacher": same,
        "argmax_precomputed_ratio": round(argmax_s / base_s, 4),
        "topk_ratio": round(topk_s / base_s, 4),
        "bytes_per_token": {"final_state_at_kimi_hidden": 2 * KIMI_HIDDEN,
                            "argmax_and_bit": 5, "topk": 6 * k},
    }
    print(f"T {T}, hidden {H} (Kimi: {KIMI_HIDDEN}), V {KIMI_VOCAB:,}, Vd {DRAFT_VOCAB:,}, "
          f"one thread, median of {args.repeats}")
    print(f"teacher from the final state (today)   {base_s:8.3f} s")
    print(f"argmax + bit precomputed (Vd softmax)  {argmax_s:8.3f} s  "
          f"({argmax_s / base_s:.2f}x)")
    print(f"top-{k} draft-vocabulary teacher stored  {topk_s:8.3f} s  ({topk_s / base_s:.3f}x)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
