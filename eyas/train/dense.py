"""The training-time test written the plain way, with [T, T] matrices: the reference.

Same loss, counts and teacher as ``eyas.train.ttt``, computed as directly as possible: every
step's attention materialises float32 scores [B, A, T, T] against an explicit mask and keeps
them for backward, every step's logits [B, T, Vd] live at once, and the teacher of storage
``final`` computes the whole [B, T, V] logits. Memory therefore grows with T² (about 180 GB at
T = 8,192 with Kimi-K2.5's 64 heads); training never runs this. The tests hold ``ttt`` equal to
it, and ``benchmarks/train_memory.py`` measures both ("naive" = this one). Its steps are
``Drafter.step``'s, as training's are; only the attention (``DenseUnrolledCache``) is written
the plain way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eyas.train.config import LossObjective
from eyas.train.head_loss import LK_ALPHA_FLOOR, LK_ETA
from eyas.train.model import Drafter, UnrolledCache, attend
from eyas.train.ttt import STEP_WEIGHT, Teacher, TTTResult, shift, widen
from eyas.train.vocab import DraftVocab


def teacher_from_final(
    final_BTH: torch.Tensor, lm_head_VH: torch.Tensor, vocab: DraftVocab
) -> Teacher:
    """Teacher from the target's last hidden states, with the whole [B, T, V] logits."""
    wide = torch.promote_types(lm_head_VH.dtype, torch.float32)
    logits_BTV = final_BTH.to(wide) @ lm_head_VH.to(wide).T
    top = logits_BTV.argmax(-1)
    d2t = vocab.draft_to_target.to(final_BTH.device)
    logp = logits_BTV.index_select(-1, d2t).log_softmax(-1)
    return Teacher(logp, top, torch.ones_like(top, dtype=torch.bool),
                   vocab.t2d.to(final_BTH.device)[top])


def unroll(drafter: Drafter, ids_BT: torch.Tensor, aux_BTA: torch.Tensor,
           steps: int) -> list[torch.Tensor]:
    """Logits [B, T, Vd] of steps 0..steps-1 at every origin (``ttt.unroll``'s contract):
    ``Drafter.step`` with the [T, T] form of the training-time test's cache."""
    B, T = ids_BT.shape
    origin_T = torch.arange(T, device=ids_BT.device)
    hidden_BTH = drafter.project(aux_BTA.to(drafter.fc.weight.dtype))
    cache = DenseUnrolledCache()
    out_logits = []
    for i in range(steps):
        out_BTH, cache = drafter.step(shift(ids_BT, 1 + i), hidden_BTH,
                                      (origin_T + i).expand(B, T), cache)
        out_logits.append(drafter.logits(out_BTH))
        hidden_BTH = drafter.feedback(out_BTH)
    return out_logits


@dataclass(frozen=True, eq=False)
class DenseUnrolledCache(UnrolledCache):
    """``UnrolledCache``'s keys attended with [T, T] matrices: step 0 ``attend`` over the
    causal mask, later steps float32 scores over the step-0 keys and the diagonal side by
    side (``chunk_mb`` and ``kernel`` unused)."""

    def attention(self, q_BATD: torch.Tensor) -> torch.Tensor:
        assert self.k0_BATD is not None and self.v0_BATD is not None
        origin_T = torch.arange(self.k0_BATD.shape[2], device=q_BATD.device)
        causal_1TT = (origin_T[None, :] <= origin_T[:, None])[None]
        if not self.diag_k:
            return attend(q_BATD, self.k0_BATD, self.v0_BATD, causal_1TT)
        return _attend_with_diagonal(q_BATD, self.k0_BATD, self.v0_BATD, causal_1TT,
                                     self.diag_k, self.diag_v)


def _attend_with_diagonal(q, k0, v0, causal_BTT, diag_k, diag_v) -> torch.Tensor:
    """Attention over step-0 keys (causal) plus this origin's own keys of steps 1..i."""
    scale = q.shape[-1] ** -0.5
    acc = torch.promote_types(q.dtype, torch.float32)
    qf = q.to(acc)
    s_ctx = torch.einsum("bhqd,bhkd->bhqk", qf, k0.to(acc)) * scale
    s_ctx = s_ctx.masked_fill(~causal_BTT[:, None], float("-inf"))
    s_diag = torch.stack([(qf * k.to(acc)).sum(-1) * scale for k in diag_k], dim=-1)  # [B,A,T,i]
    probs = torch.cat([s_ctx, s_diag], dim=-1).softmax(-1)
    T = k0.shape[2]
    p_ctx, p_diag = probs[..., :T].to(v0.dtype), probs[..., T:].to(v0.dtype)
    out = torch.einsum("bhqk,bhkd->bhqd", p_ctx, v0)
    for j, v in enumerate(diag_v):
        out = out + p_diag[..., j : j + 1] * v
    return out


def ttt_loss(drafter: Drafter, ids_BT: torch.Tensor, loss_mask_BT: torch.Tensor,
             aux_BTA: torch.Tensor, teacher: Teacher, vocab: DraftVocab,
             steps: int = 7, objective: LossObjective = "kl") -> TTTResult:
    """``ttt.ttt_loss``'s result, from whole-sequence logits of every step (the LK objectives
    through autograd: ``torch.minimum`` for α)."""
    logits = unroll(drafter, ids_BT, aux_BTA, steps)
    d2t = vocab.draft_to_target.to(ids_BT.device)
    loss = ids_BT.new_zeros((), dtype=torch.float32)
    correct, total, ces = [], [], []
    for i, logits_BTVd in enumerate(logits):
        scored = shift(loss_mask_BT, 2 + i) > 0
        in_loss = scored & shift(teacher.usable_BT, 1 + i, False)
        t_p = shift(teacher.logp_BTVd, 1 + i, 0.0).exp()
        logp = widen(logits_BTVd).log_softmax(-1)
        ce_BT = -(t_p * logp.masked_fill(t_p == 0, 0.0)).sum(-1)
        ce = (ce_BT * in_loss).sum() / in_loss.sum().clamp(min=1)
        term_BT = ce_BT
        if objective != "kl":
            alpha_BT = torch.minimum(t_p, logp.exp()).sum(-1)
            if objective == "lk_log":
                term_BT = -alpha_BT.clamp_min(LK_ALPHA_FLOOR).log()
            else:
                lam_BT = (-LK_ETA * alpha_BT.detach()).exp()
                kl_BT = ce_BT + torch.xlogy(t_p, t_p).sum(-1)
                term_BT = lam_BT * kl_BT + (1 - lam_BT) * (1 - alpha_BT)
        step = ce if objective == "kl" else (term_BT * in_loss).sum() / in_loss.sum().clamp(min=1)
        loss = loss + (STEP_WEIGHT**i) * step
        pred = d2t[logits_BTVd.argmax(-1)]
        correct.append(((pred == shift(teacher.top_BT, 1 + i)) & in_loss).sum())
        total.append(scored.sum())
        ces.append(ce.detach())
    return TTTResult(loss, torch.stack(correct), torch.stack(total), torch.stack(ces))
