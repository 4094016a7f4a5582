"""Training-time test: unroll k drafting steps for every position at once, in memory that grows
linearly with the sequence length.

Indexing. A batch row holds one sample: tokens ``x_0..x_{L-1}`` and, at each position s, the
target's auxiliary states ``aux_s`` (computed while the target read ``x_0..x_s``) and the
target's next-token distribution ``p_s`` (its prediction of ``x_{s+1}``).

When a server drafts after verifying the context up to position t, its drafter cache holds one
"step 0" entry per context position s ≤ t: token ``x_{s+1}`` with hidden ``fc(aux_s)`` at rotary
position s. Draft step 0 is the entry at s = t; it predicts ``x_{t+2}``. Draft step i (i ≥ 1)
appends one entry at rotary position t + i whose hidden is step i-1's output and whose token is
the one step i-1 predicted (training uses the data token ``x_{t+1+i}``: the chain we score is the
one in which every earlier draft was accepted). Step i predicts ``x_{t+2+i}``.

So we call t the chain's *origin*. In the unrolled computation the query of (step i, origin t)
may attend to: step-0 keys of every origin s ≤ t, and the keys of steps 1..i of its own origin t
(the "diagonal"). ``unroll`` computes exactly that: each step is ``Drafter.step`` over all T
origins at once with an ``UnrolledCache``, whose attention is ``attend_causal`` (causal over
the step-0 keys, the diagonal as extra keys per query: a flash kernel's causal pass merged
with the diagonal through its log-sum-exp, or a chunk of queries at a time) -- not a server's
``KVCache``, since every origin has a chain of its own and T queries a step want memory
linear in T. ``draft_reference`` runs the drafter entry by entry as a server would (the same
step, over an explicit causal mask), and the tests hold the two equal. ``eyas.train.dense`` is
the same computation with [T, T] matrices (the same step, the cache's dense form), kept as
the reference and the baseline of ``benchmarks/train_memory.py``.

Loss at step i, origin t, where the predicted token ``x_{t+2+i}`` exists and its loss-mask bit is
set: soft cross-entropy between the drafter's draft-vocabulary distribution and the teacher's
``p_{t+1+i}`` restricted to the draft vocabulary (renormalised). Positions whose target argmax
lies outside the draft vocabulary are left out of the loss (the drafter can never propose that
token) but stay in the accuracy's denominator as misses; ``eyas.train.metrics`` defines acc_i
and the acceptance length τ. Total loss ``Σ_i 0.8^i · CE_i``, CE_i the mean over the positions
in the loss (with another `objective`, ``train.loss``, the mean of its per-position terms
instead: ``eyas.train.head_loss``). The head and the cross-entropy run a chunk of positions at a time (recomputed in
backward), so the [T, V] logits of a step never exist at once; ``checkpoint_steps`` recomputes
each whole step in backward too, keeping only its output, keys and values.

Shape suffixes: B batch, T positions, H hidden width, A = 3·H_target aux width, V target
vocabulary, Vd draft vocabulary, N flattened positions (B·T), A attention heads, D head width.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from eyas.train.config import LossObjective
from eyas.train.head_loss import head_soft_ce
from eyas.train.model import (
    DEFAULT_CHUNK_MB,
    AttentionKernel,
    Drafter,
    UnrolledCache,
    chunk_rows,
    frozen_weight,
    matmul_dtype,
)
from eyas.train.vocab import DraftVocab

STEP_WEIGHT = 0.8


@dataclass
class Teacher:
    """The target's next-token distribution at each position, restricted to the draft vocab."""

    logp_BTVd: torch.Tensor
    """float32 log-probabilities over the draft vocabulary (-inf where the teacher gives 0)."""
    top_BT: torch.Tensor
    """int64: the target's argmax token (a target id, whole vocabulary)."""
    valid_BT: torch.Tensor
    """bool: the restricted distribution has mass (topk teachers may miss the draft vocab)."""
    in_vocab_BT: torch.Tensor
    """bool: the target's argmax is in the draft vocabulary (else: out of the loss, a miss)."""

    @property
    def usable_BT(self) -> torch.Tensor:
        """Positions a loss can be computed at: restricted mass and an argmax the drafter has."""
        return self.valid_BT & self.in_vocab_BT


class TargetHead:
    """The target's output head, as the teacher of storage ``final`` uses it.

    Holds the rows of the draft vocabulary (``lm_head[d2t]``, float32: the restricted
    distribution is computed from them exactly) and the whole head in its stored dtype (bf16
    for real targets: 2.3 GB for Kimi-K2.5 instead of 4.7), read a vocabulary chunk at a time
    for the full-vocabulary argmax. `chunk_mb` bounds every temporary. The trainer keeps each
    sample's argmax once computed (``eyas.train.teacher_memo``, ``train.teacher_memo``).
    """

    def __init__(self, lm_head_VH: torch.Tensor, vocab: DraftVocab, *,
                 chunk_mb: float = DEFAULT_CHUNK_MB) -> None:
        self.head_VH = frozen_weight(lm_head_VH)
        self.vocab = vocab
        self.chunk_mb = chunk_mb
        d2t = vocab.draft_to_target.to(lm_head_VH.device)
        wide = torch.promote_types(lm_head_VH.dtype, torch.float32)
        self.head_VdH = self.head_VH.index_select(0, d2t).to(wide)
        self.t2d_V = vocab.t2d.to(lm_head_VH.device)

    @torch.no_grad()
    def teacher(self, final_BTH: torch.Tensor, top_BT: torch.Tensor | None = None) -> Teacher:
        """Teacher from the target's last (normed) hidden states: logits = final @ lm_headᵀ.

        The restricted log-probabilities are float32 (or wider); the argmax runs over the whole
        vocabulary in chunks (`argmax`). `top_BT` (int64, on the head's device): that argmax
        as computed before (``eyas.train.teacher_memo``), so the V-wide matmul is skipped.
        """
        B, T, H = final_BTH.shape
        wide = self.head_VdH.dtype
        x_NH = final_BTH.reshape(B * T, H).to(self.head_VH.device)
        N, Vd = x_NH.shape[0], self.head_VdH.shape[0]
        logp_NVd = torch.empty(N, Vd, dtype=wide, device=x_NH.device)
        rows = chunk_rows(self.chunk_mb, 2 * Vd * wide.itemsize, N)
        for a in range(0, N, rows):
            logits = x_NH[a : a + rows].to(wide) @ self.head_VdH.T
            logp_NVd[a : a + rows] = logits.log_softmax(-1)
        if top_BT is None:
            top_BT = self._argmax_N(x_NH).view(B, T)
        elif top_BT.shape != (B, T):
            raise ValueError(f"top_BT is {tuple(top_BT.shape)}, expected {(B, T)}")
        return Teacher(logp_NVd.view(B, T, Vd), top_BT, torch.ones_like(top_BT, dtype=torch.bool),
                       self.t2d_V[top_BT])

    @torch.no_grad()
    def argmax(self, final_BTH: torch.Tensor) -> torch.Tensor:
        """int64 [B, T]: the target's whole-vocabulary argmax (`teacher`'s ``top_BT``)."""
        B, T, H = final_BTH.shape
        return self._argmax_N(final_BTH.reshape(B * T, H).to(self.head_VH.device)).view(B, T)

    def _argmax_N(self, x_NH: torch.Tensor) -> torch.Tensor:
        """In vocabulary chunks, in the head's dtype on GPU (bf16: ties aside, the same
        argmax) and in float32 on CPU; the first maximum wins, as torch.argmax."""
        wide = self.head_VdH.dtype
        N, V = x_NH.shape[0], self.head_VH.shape[0]
        top_dtype = self.head_VH.dtype if x_NH.is_cuda else wide
        x_top = x_NH.to(top_dtype)
        best_N = torch.full((N,), float("-inf"), dtype=wide, device=x_NH.device)
        top_N = torch.zeros(N, dtype=torch.int64, device=x_NH.device)
        cols = chunk_rows(self.chunk_mb, 2 * N * wide.itemsize, V)
        for v0 in range(0, V, cols):
            value, index = (x_top @ self.head_VH[v0 : v0 + cols].to(top_dtype).T).to(wide).max(-1)
            better = value > best_N  # strict: the first maximum wins, as torch.argmax
            best_N = torch.where(better, value, best_N)
            top_N = torch.where(better, index + v0, top_N)
        return top_N


def teacher_from_final(
    final_BTH: torch.Tensor, lm_head_VH: torch.Tensor, vocab: DraftVocab, *,
    chunk_mb: float = DEFAULT_CHUNK_MB,
) -> Teacher:
    """``TargetHead(lm_head_VH, vocab).teacher(final_BTH)`` (a trainer keeps the TargetHead)."""
    return TargetHead(lm_head_VH, vocab, chunk_mb=chunk_mb).teacher(final_BTH)


def teacher_from_topk(
    topk_ids_BTK: torch.Tensor, topk_logp_BTK: torch.Tensor, vocab: DraftVocab
) -> Teacher:
    """Teacher from stored top-K log-probs: ids outside the draft vocab are dropped, the rest
    renormalised. Positions with none of their K ids in the draft vocab are not valid."""
    B, T, _ = topk_ids_BTK.shape
    t2d = vocab.target_to_draft().to(topk_ids_BTK.device)
    draft_ids = t2d[topk_ids_BTK.long()]  # [B, T, K], -1 outside
    keep = draft_ids >= 0
    # Dropped ids go to an extra trash column, cut off after the scatter.
    logp = torch.full((B, T, vocab.size + 1), float("-inf"), device=topk_ids_BTK.device)
    index = torch.where(keep, draft_ids, vocab.size)
    logp.scatter_(-1, index, topk_logp_BTK.float())
    logp = logp[..., : vocab.size]
    norm = logp.logsumexp(-1, keepdim=True)
    valid = keep.any(-1)
    logp = torch.where(valid[..., None], logp - norm, logp)
    top = topk_ids_BTK.long().gather(-1, topk_logp_BTK.float().argmax(-1, keepdim=True))[..., 0]
    return Teacher(logp, top, valid, t2d[top] >= 0)


@dataclass
class TTTResult:
    """Loss and per-step counts of one batch (counts sum exactly across batches/processes)."""

    loss: torch.Tensor
    """Scalar: Σ_i 0.8^i · mean soft-CE of step i (of the objective's term, when not "kl")."""
    correct: torch.Tensor
    """int64 [k]: positions whose step-i argmax matched the teacher's."""
    total: torch.Tensor
    """int64 [k]: positions scored at step i (their predicted token is loss-masked)."""
    ce: torch.Tensor
    """float [k]: per-step mean soft-CE (detached; the soft-CE whatever the objective)."""


def widen(x: torch.Tensor) -> torch.Tensor:
    """`x` in float32, or wider if it already is (bf16 logits are widened for the softmax)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def scored_counts(loss_mask_BT: torch.Tensor, steps: int) -> torch.Tensor:
    """float64 [steps]: positions of a batch that step i scores (their predicted token,
    i + 2 ahead of the origin, is loss-masked) -- the `denominators` of token weighting,
    known before the forward."""
    return torch.stack([(shift(loss_mask_BT, 2 + i) > 0).sum() for i in range(steps)]).double()


def shift(x: torch.Tensor, by: int, fill: float | int = 0) -> torch.Tensor:
    """``out[:, t] = x[:, t + by]``, padded with `fill` past the end (along dim 1)."""
    if by == 0:
        return x
    pad = x.new_full((x.shape[0], by, *x.shape[2:]), fill)
    return torch.cat([x[:, by:], pad], dim=1)


def unroll_outputs(
    drafter: Drafter,
    ids_BT: torch.Tensor,
    aux_BTA: torch.Tensor,
    steps: int,
    *,
    chunk_mb: float = DEFAULT_CHUNK_MB,
    checkpoint_steps: bool = False,
    kernel: AttentionKernel = "auto",
) -> Iterator[torch.Tensor]:
    """Pre-norm outputs [B, T, H] of steps 0..steps-1 at every origin t, one step at a time.

    Rows past a sample's end compute garbage that the caller masks out; they never influence
    real origins (a query only sees origins s ≤ t). With `checkpoint_steps` (and autograd on)
    each step keeps only its output, keys and values and is recomputed in backward. `kernel`:
    the attention's (``eyas.train.model.AttentionKernel``).
    """
    B, T = ids_BT.shape
    origin_T = torch.arange(T, device=ids_BT.device)
    hidden_BTH = drafter.project(aux_BTA.to(matmul_dtype(aux_BTA, drafter.fc.weight.dtype)))
    keep = checkpoint_steps and torch.is_grad_enabled()
    cache = UnrolledCache(chunk_mb=chunk_mb, kernel=kernel)
    for i in range(steps):
        tok_BT = shift(ids_BT, 1 + i)
        pos_BT = (origin_T + i).expand(B, T)
        if keep:  # the cache is a value: a recomputation in backward computes the same again
            out_BTH, cache = checkpoint(drafter.step, tok_BT, hidden_BTH, pos_BT, cache,
                                        use_reentrant=False)
        else:
            out_BTH, cache = drafter.step(tok_BT, hidden_BTH, pos_BT, cache)
        yield out_BTH
        hidden_BTH = drafter.feedback(out_BTH)


def unroll(
    drafter: Drafter,
    ids_BT: torch.Tensor,
    aux_BTA: torch.Tensor,
    steps: int,
    *,
    chunk_mb: float = DEFAULT_CHUNK_MB,
    kernel: AttentionKernel = "auto",
) -> list[torch.Tensor]:
    """Logits [B, T, Vd] of steps 0..steps-1 at every origin t (see the module docstring)."""
    return [drafter.logits(out) for out in
            unroll_outputs(drafter, ids_BT, aux_BTA, steps, chunk_mb=chunk_mb, kernel=kernel)]


def ttt_loss(
    drafter: Drafter,
    ids_BT: torch.Tensor,
    loss_mask_BT: torch.Tensor,
    aux_BTA: torch.Tensor,
    teacher: Teacher,
    vocab: DraftVocab,
    steps: int = 7,
    *,
    chunk_mb: float = DEFAULT_CHUNK_MB,
    checkpoint_steps: bool = False,
    denominators: Sequence[float] | None = None,
    kernel: AttentionKernel = "auto",
    objective: LossObjective = "kl",
) -> TTTResult:
    """Loss, per-step accuracy counts and CE of one padded batch (padding has loss_mask 0).

    Step i's soft-CE is summed over the batch's scored positions and divided by their count
    (`denominators[i]` instead, when given: a count over more than this batch, which makes
    each token of a whole optimizer step weigh the same: `scored_counts`). `kernel`: the
    attention's (``eyas.train.model.AttentionKernel``); `objective`: the per-position loss
    (``train.loss``: ``eyas.train.head_loss``).
    """
    B, T = ids_BT.shape
    d2t = vocab.draft_to_target.to(ids_BT.device)
    p_NVd = teacher.logp_BTVd.reshape(B * T, -1).exp()  # exp(-inf) = 0 outside the support
    top_N = teacher.top_BT.reshape(-1)
    outs, idxs, total = [], [], []
    for i, out_BTH in enumerate(unroll_outputs(drafter, ids_BT, aux_BTA, steps, chunk_mb=chunk_mb,
                                               checkpoint_steps=checkpoint_steps, kernel=kernel)):
        scored_N = (shift(loss_mask_BT, 2 + i) > 0).reshape(-1)
        usable_N = shift(teacher.usable_BT, 1 + i, False).reshape(-1)
        # origin n's teacher is flat row n + 1 + i (same sample: scored means t + 2 + i < T)
        idxs.append((scored_N & usable_N).nonzero().squeeze(1))
        outs.append(out_BTH.reshape(B * T, -1))
        total.append(scored_N.sum())
    counts = [max(1, idx.numel()) for idx in idxs]
    divide = counts if denominators is None else [max(float(d), 1e-12) for d in denominators]
    loss, ce_sum, hits = head_soft_ce(
        drafter, outs, idxs, [1 + i for i in range(steps)],
        [STEP_WEIGHT**i / n for i, n in enumerate(divide)], p_NVd, top_N, d2t, chunk_mb=chunk_mb,
        objective=objective)
    ce = (ce_sum / torch.tensor(counts, dtype=ce_sum.dtype, device=ce_sum.device)).to(loss.dtype)
    return TTTResult(loss, hits, torch.stack(total), ce)


@torch.no_grad()
def draft_reference(
    drafter: Drafter, ids_T: torch.Tensor, aux_TA: torch.Tensor, origin: int, steps: int
) -> list[torch.Tensor]:
    """Logits [Vd] of steps 0..steps-1 from origin `origin`, computed as a server drafts:
    one entry at a time, each a plain causal pass (``attend`` over an explicit mask) over the
    entries so far.

    Step-i entries take the data token ``x_{origin+1+i}`` (0 past the end, as ``unroll`` does).
    """
    T = ids_T.shape[0]
    tok = [int(ids_T[s + 1]) if s + 1 < T else 0 for s in range(origin + 1)]
    hid = list(drafter.project(aux_TA[: origin + 1].to(drafter.fc.weight.dtype)))
    pos = list(range(origin + 1))
    result = []
    for i in range(steps):
        n = len(tok)
        causal_1nn = torch.ones(n, n, dtype=torch.bool).tril()[None]
        out = drafter.forward_causal(
            torch.tensor([tok]), torch.stack(hid)[None], torch.tensor([pos]), causal_1nn
        )[0, -1]
        result.append(drafter.logits(out[None, None])[0, 0])
        nxt = origin + 2 + i
        tok.append(int(ids_T[nxt]) if nxt < T else 0)
        hid.append(drafter.feedback(out[None])[0])
        pos.append(origin + 1 + i)
    return result


def pad_batch(tensors: list[torch.Tensor], fill: float | int = 0) -> torch.Tensor:
    """Stack [T_b, ...] tensors into [B, max T, ...], padding with `fill`."""
    T = max(t.shape[0] for t in tensors)
    out = tensors[0].new_full((len(tensors), T, *tensors[0].shape[1:]), fill)
    for b, t in enumerate(tensors):
        out[b, : t.shape[0]] = t
    return out


__all__ = [
    "TargetHead",
    "Teacher",
    "TTTResult",
    "draft_reference",
    "pad_batch",
    "shift",
    "teacher_from_final",
    "teacher_from_topk",
    "ttt_loss",
    "unroll",
    "unroll_outputs",
]
