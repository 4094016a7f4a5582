"""The teacher of storage "final", computed every step vs precomputed once (issue 27, point 5).

    python benchmarks/teacher.py --quick    # T 512, hidden 512 (minutes on a shared CPU)
    python benchmarks/teacher.py            # T 2,048, hidden 1,024

The teacher of storage "final" (`eyas.train.ttt.TargetHead.teacher`) is the full-vocabulary
argmax (``final @ lm_headᵀ`` over all V = 163,840 rows, in chunks) and the draft-vocabulary
log-probabilities (the Vd = 32,000 rows). Training keeps the argmax once computed
(``train.teacher_memo``, default on: `eyas.train.teacher_memo.ArgmaxMemo`), so only the first
epoch pays for it. Measured here on CPU, at the Kimi vocabulary sizes and a reduced hidden size
(the cost of both matmuls is linear in it), one torch thread:

- ``baseline_s``: the teacher from the stored final state, in full (median of ``--repeats``);
- ``argmax_precomputed_s``: what is left with the argmax and its in-vocabulary bit stored
  (4 bytes a token; the bit follows from ``t2d``): the draft-vocabulary distribution alone;
- ``topk_s``: a stored top-K teacher (``teacher_from_topk``; K ids + K log-probs, 6·K bytes a
  token) replacing the final state (2·H bytes: 14 KB at H = 7,168) -- what extraction's
  storage "topk" / "compact" stores (its K are the whole vocabulary's);
- ``epochs``: the trainer's teacher path itself (`ArgmaxMemo.teacher`) over an "epoch" of
  ``--samples`` samples (the T tokens cut into that many, one a micro-batch), in this
  process: ``without_memo_s`` (an epoch without the memo, median of ``--repeats``),
  ``with_memo_s`` (the first epoch, which fills the memo, and a later one, median of
  ``--repeats``, each epoch in another order; the later ones interleaved with those
  without, so that both see the same load), ``memo_ratio`` (a later epoch with the memo
  over one without), ``first_epoch_ratio``, the memo's bytes, and whether every teacher
  tensor of the memo's epochs equals the one computed in full.

Last line: JSON with the times, their ratios to the baseline and the bytes per token of each
form.
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

from eyas.train.teacher_memo import ArgmaxMemo  # noqa: E402
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


def _timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def epochs(head: TargetHead, final_BTH: torch.Tensor, samples: int, repeats: int) -> dict:
    """Epochs of the trainer's teacher over `samples` samples (one a micro-batch) without the
    memo (median of `repeats`) and with it: the first (filling it) and a later one (median of
    `repeats`, each in another order); their ratio and sameness."""
    T = final_BTH.shape[1]
    cuts = torch.linspace(0, T, samples + 1).round().long().tolist()
    rows = [final_BTH[:, a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True) if b > a]
    n = len(rows)
    orders = [[(k + e) % n for k in range(n)][::-1 if e % 2 else 1] for e in range(repeats + 1)]
    memo = ArgmaxMemo()
    same = True

    def epoch(e: int, use_memo: bool) -> None:
        nonlocal same
        for k in orders[e]:
            if use_memo:
                t = memo.teacher(head, rows[k], [k], [rows[k].shape[1]])
                same = same and all(torch.equal(getattr(t, f), getattr(full[k], f))
                                    for f in ("logp_BTVd", "top_BT", "valid_BT", "in_vocab_BT"))
            else:
                head.teacher(rows[k])

    full = [head.teacher(r) for r in rows]  # the reference teachers (not timed)
    first_s, _ = _timed(lambda: epoch(0, True))
    # Interleaved, so that both see the same load of a shared machine.
    plain, memoised = [], []
    for e in range(1, repeats + 1):
        plain.append(_timed(lambda: epoch(0, False))[0])
        memoised.append(_timed(lambda e=e: epoch(e, True))[0])
    without_s, later_s = statistics.median(plain), statistics.median(memoised)
    return {"samples": n, "without_memo_s": round(without_s, 4),
            "with_memo_s": {"first_epoch": round(first_s, 4), "later_epoch": round(later_s, 4)},
            "memo_ratio": round(later_s / without_s, 4),
            "first_epoch_ratio": round(first_s / without_s, 4),
            "memo_hits": memo.hits, "memo_misses": memo.misses, "memo_bytes": memo.nbytes,
            "memo_is_the_same_teacher": same}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="T 512, hidden 512")
    p.add_argument("--tokens", type=int, default=None)
    p.add_argument("--hidden", type=int, default=None)
    p.add_argument("--topk", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--samples", type=int, default=4, help="samples of an epoch (of T tokens)")
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
    per_epoch = epochs(head, final_BTH, args.samples, args.repeats)
    result = {
        "tokens": T, "hidden": H, "vocab": KIMI_VOCAB, "draft_vocab": DRAFT_VOCAB, "topk": k,
        "baseline_s": round(base_s, 4), "argmax_precomputed_s": round(argmax_s, 4),
        "topk_s": round(topk_s, 4), "precomputed_is_the_same_teacher": same,
        "argmax_precomputed_ratio": round(argmax_s / base_s, 4),
        "topk_ratio": round(topk_s / base_s, 4),
        "bytes_per_token": {"final_state_at_kimi_hidden": 2 * KIMI_HIDDEN,
                            "argmax_and_bit": 5, "memo": 4, "topk": 6 * k},
        "epochs": per_epoch,
    }
    print(f"T {T}, hidden {H} (Kimi: {KIMI_HIDDEN}), V {KIMI_VOCAB:,}, Vd {DRAFT_VOCAB:,}, "
          f"one thread, median of {args.repeats}")
    print(f"teacher from the final state (today)   {base_s:8.3f} s")
    print(f"argmax + bit precomputed (Vd softmax)  {argmax_s:8.3f} s  "
          f"({argmax_s / base_s:.2f}x)")
    print(f"top-{k} draft-vocabulary teacher stored  {topk_s:8.3f} s  ({topk_s / base_s:.3f}x)")
    e = per_epoch
    print(f"an epoch of {e['samples']} samples, no memo    {e['without_memo_s']:8.3f} s")
    print(f"  with the memo: first epoch          {e['with_memo_s']['first_epoch']:8.3f} s  "
          f"({e['first_epoch_ratio']:.2f}x)")
    print(f"  with the memo: a later epoch        {e['with_memo_s']['later_epoch']:8.3f} s  "
          f"({e['memo_ratio']:.3f}x; memo {e['memo_bytes']:,} B)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
