"""The drafter's output head and the training-time test's soft cross-entropy, fused.

For every TTT step i and every scored origin n of that step, the loss term is

    c_i · soft-CE(p_{n+1+i}, softmax(lm_head(norm(out_i[n]))))

(``c_i`` = the step's weight over its number of scored origins, ``p`` the teacher's
draft-vocabulary distribution). Written with autograd ops, the [rows, V_draft] logits of a step
would either stay alive until backward (too large at long context) or be recomputed there (a
fourth matmul of the largest matrix, plus the softmax again). ``head_soft_ce`` computes the
gradients in the forward pass instead, a chunk of rows at a time: logits, their softmax,
``∂/∂logits = c_i · (mass · softmax - p)``, then the gradients of the head's weight, of the
norm's weight and of the outputs, each of which is a small tensor. Backward only scales them by
the incoming gradient. Three matmuls per chunk (the minimum) and no [rows, V_draft] tensor kept.

Objectives (``train.loss``, eyas.train.config). "kl" is the above. The LK objectives (Samarin
et al., "LK Losses: Direct Acceptance Rate Optimization for Speculative Decoding", arXiv
2602.23881) score a row by the acceptance rate itself, ``α = Σ_x min(p(x), q(x))`` over the
draft vocabulary (``q`` the drafter's softmax, ``p`` the teacher as the soft-CE sees it:
restricted to the draft vocabulary and renormalised, so the target's mass outside the draft
vocabulary, which the drafter can never propose, is no term of α; rows whose teacher argmax
lies outside the draft vocabulary are left out by the caller, as for "kl"):

* "lk_log": ``-log(max(α, LK_ALPHA_FLOOR))``; ``∂/∂z = -(q ⊙ (a - Σ a q)) / α`` with
  ``a = [q < p]`` (0 where α is at the floor).
* "lk_hybrid": ``λ · KL(p‖q) + (1 - λ) · (1 - α)`` with ``λ = exp(-LK_ETA · α)``, α taken
  without gradient, per row (KL while the drafter is far from the teacher, total variation
  ``1 - α`` as it nears it); ``∂/∂z = λ (mass · q - p) - (1 - λ) q ⊙ (a - Σ a q)``. η = 3 is
  the setting reported best for the paper; λ per row, from that row's α, is eyas's reading of
  the adaptive schedule as open implementations of the paper compute it (vLLM speculators'
  ``lk_hybrid``), not checked against the paper's own text.

The step weights ``c_i`` apply to every objective alike. The returned per-step sums are the
soft-CE's whatever the objective (a metric comparable across objectives).

Numerics equal the autograd formulation (``eyas.train.dense`` is the reference the tests hold
this to, in float64): the norm in at least float32, the matmuls in the autocast dtype when the
caller runs under autocast (bf16), else in the head's dtype; the softmax and the loss in at
least float32.

Shape suffixes: N flattened positions (B·T), H hidden width, Vd draft vocabulary, C rows of
one chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

import torch

from eyas.train.config import LossObjective
from eyas.train.model import Drafter, chunk_rows

LK_ETA = 3.0
"""η of "lk_hybrid": ``λ = exp(-η · α)`` (the paper's best setting)."""
LK_ALPHA_FLOOR = 1e-8
"""α is clamped to at least this before "lk_log" takes its log (no gradient below it)."""


@dataclass
class _Spec:
    """What the fused function needs besides the differentiable tensors."""

    idx: list[torch.Tensor]
    """Per step: the scored origins (flat rows of that step's output)."""
    ahead: list[int]
    """Per step: the teacher row of origin n is ``n + ahead``."""
    coeff: list[float]
    """Per step: the loss weight of one row's soft-CE."""
    p_NVd: torch.Tensor
    """Teacher probabilities over the draft vocabulary (0 outside its support)."""
    top_N: torch.Tensor
    """Teacher argmax (target ids)."""
    d2t: torch.Tensor
    """Draft id → target id."""
    eps: float
    objective: LossObjective
    mm_dtype: torch.dtype
    chunk_mb: float
    grad: bool


def _lk_rows(objective: LossObjective, z_CVd: torch.Tensor, q_CVd: torch.Tensor,
             p_CVd: torch.Tensor, mass_C1: torch.Tensor, lse_C1: torch.Tensor, grad: bool,
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-row LK loss [C] and, with `grad`, its gradient in the logits (``q_CVd``, the
    softmax, is reused for it)."""
    below_CVd = q_CVd < p_CVd  # where min(p, q) = q: the rows' α moves with q there
    alpha_C1 = torch.where(below_CVd, q_CVd, p_CVd).sum(-1, keepdim=True)
    if objective == "lk_log":
        rows = -alpha_C1.clamp_min(LK_ALPHA_FLOOR).log()
        d_alpha_C1 = torch.where(alpha_C1 >= LK_ALPHA_FLOOR, -1 / alpha_C1, 0.0)
        d_kl_C1 = None
    elif objective == "lk_hybrid":
        lam_C1 = (-LK_ETA * alpha_C1).exp()
        kl_C1 = (lse_C1 * mass_C1 - (p_CVd * z_CVd).sum(-1, keepdim=True)
                 + torch.xlogy(p_CVd, p_CVd).sum(-1, keepdim=True))
        rows = lam_C1 * kl_C1 + (1 - lam_C1) * (1 - alpha_C1)
        d_alpha_C1, d_kl_C1 = lam_C1 - 1, lam_C1
    else:  # head_soft_ce refused any other
        raise AssertionError(objective)
    if not grad:
        return rows[:, 0], None
    # ∂α/∂z = q ⊙ (a - Σ a q), a = [q < p]
    qa_CVd = q_CVd * below_CVd
    g_CVd = qa_CVd.sub_(q_CVd * qa_CVd.sum(-1, keepdim=True)).mul_(d_alpha_C1)
    if d_kl_C1 is not None:  # + λ · (mass · q - p)
        g_CVd += (q_CVd * mass_C1 - p_CVd).mul_(d_kl_C1)
    return rows[:, 0], g_CVd


class _HeadSoftCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, spec: _Spec, norm_w_H: torch.Tensor, head_w_VdH: torch.Tensor,
                *outs_NH: torch.Tensor):
        device = head_w_VdH.device
        k = len(outs_NH)
        ce = torch.zeros(k, dtype=torch.float64, device=device)
        hits = torch.zeros(k, dtype=torch.int64, device=device)
        loss = torch.zeros((), dtype=torch.float64, device=device)
        grad_norm_H = torch.zeros_like(norm_w_H, dtype=torch.promote_types(norm_w_H.dtype,
                                                                           torch.float32))
        grad_head_VdH = torch.zeros_like(head_w_VdH, dtype=grad_norm_H.dtype) if spec.grad else None
        grad_outs: list[torch.Tensor | None] = []
        mm = spec.mm_dtype
        head_mm = head_w_VdH.to(mm)
        Vd = head_w_VdH.shape[0]
        # logits, softmax, teacher rows, their product and the gradient: ~5 wide copies per row
        with torch.autocast(device.type, enabled=False):
            for i, out_NH in enumerate(outs_NH):
                idx = spec.idx[i]
                acc = torch.promote_types(out_NH.dtype, torch.float32)
                gx_nH = (torch.empty(idx.numel(), out_NH.shape[1], dtype=out_NH.dtype,
                                     device=device) if spec.grad else None)
                wide = 5 if spec.objective == "kl" else 8  # LK: softmax, min(p, q), [q < p]
                rows = chunk_rows(spec.chunk_mb, wide * Vd * acc.itemsize, max(1, idx.numel()))
                for a in range(0, idx.numel(), rows):
                    idx_C = idx[a : a + rows]
                    x_CH = out_NH.index_select(0, idx_C).to(acc)  # as RMSNorm computes
                    r_C1 = torch.rsqrt(x_CH.pow(2).mean(-1, keepdim=True) + spec.eps)
                    u_CH = x_CH * r_C1
                    y_CH = norm_w_H * u_CH.to(out_NH.dtype)
                    z_CVd = (y_CH.to(mm) @ head_mm.T).to(torch.promote_types(mm, acc))
                    target = spec.top_N.index_select(0, idx_C + spec.ahead[i])
                    m_C1, top_C1 = z_CVd.max(-1, keepdim=True)  # the first maximum, as argmax
                    hits[i] += (spec.d2t[top_C1[:, 0]] == target).sum()
                    e_CVd = (z_CVd - m_C1).exp_()
                    s_C1 = e_CVd.sum(-1, keepdim=True)
                    p_CVd = spec.p_NVd.index_select(0, idx_C + spec.ahead[i]).to(z_CVd.dtype)
                    mass_C1 = p_CVd.sum(-1, keepdim=True)
                    # Σ_rows soft-CE = Σ mass · logsumexp(z) - Σ p · z
                    part = ((m_C1 + s_C1.log()) * mass_C1).sum() - torch.dot(p_CVd.view(-1),
                                                                            z_CVd.view(-1))
                    ce[i] += part.double()
                    if spec.objective == "kl":
                        loss += spec.coeff[i] * part.double()
                        if not spec.grad:
                            continue
                        # d loss / d logits: c_i · (mass · softmax - p)
                        g_CVd = e_CVd.mul_(mass_C1 / s_C1).sub_(p_CVd).mul_(spec.coeff[i])
                    else:
                        lse_C1 = m_C1 + s_C1.log()
                        rows_loss, g_CVd = _lk_rows(spec.objective, z_CVd, e_CVd.div_(s_C1),
                                                    p_CVd, mass_C1, lse_C1, spec.grad)
                        loss += spec.coeff[i] * rows_loss.sum().double()
                        if not spec.grad:
                            continue
                        g_CVd.mul_(spec.coeff[i])
                    g_mm = g_CVd.to(mm)
                    grad_head_VdH += (g_mm.T @ y_CH.to(mm)).to(grad_head_VdH.dtype)
                    gy_CH = (g_mm @ head_mm).to(acc)
                    # RMSNorm: y = w · u, u = x · r, r = (mean x² + eps)^-1/2
                    grad_norm_H += (gy_CH * u_CH).sum(0).to(grad_norm_H.dtype)
                    gu_CH = gy_CH * norm_w_H.to(acc)
                    gx_CH = r_C1 * (gu_CH - u_CH * (gu_CH * u_CH).mean(-1, keepdim=True))
                    gx_nH[a : a + rows] = gx_CH.to(out_NH.dtype)
                grad_outs.append(gx_nH)
        ctx.spec = spec
        ctx.shapes = [o.shape for o in outs_NH]
        ctx.grads = (grad_norm_H.to(norm_w_H.dtype),
                     grad_head_VdH.to(head_w_VdH.dtype) if spec.grad else None, grad_outs)
        ctx.mark_non_differentiable(ce, hits)
        return loss.to(torch.promote_types(norm_w_H.dtype, torch.float32)), ce, hits

    @staticmethod
    def backward(ctx, g_loss, _g_ce, _g_hits):
        grad_norm_H, grad_head_VdH, grad_outs = ctx.grads
        spec: _Spec = ctx.spec
        outs = []
        for i, shape in enumerate(ctx.shapes):
            g = torch.zeros(shape, dtype=grad_outs[i].dtype, device=grad_outs[i].device)
            g.index_copy_(0, spec.idx[i], grad_outs[i] * g_loss.to(grad_outs[i].dtype))
            outs.append(g)
        return (None, grad_norm_H * g_loss.to(grad_norm_H.dtype),
                grad_head_VdH * g_loss.to(grad_head_VdH.dtype), *outs)


def head_soft_ce(
    drafter: Drafter,
    outs_NH: list[torch.Tensor],
    idx: list[torch.Tensor],
    ahead: list[int],
    coeff: list[float],
    p_NVd: torch.Tensor,
    top_N: torch.Tensor,
    d2t: torch.Tensor,
    *,
    chunk_mb: float,
    objective: LossObjective = "kl",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, ce_sum [k], hits [k])`` over the TTT steps' pre-norm outputs `outs_NH`.

    loss = Σ_i coeff_i · Σ_{n ∈ idx_i} soft-CE(p[n + ahead_i], softmax(lm_head(norm(out_i[n]))))
    (differentiable in the outputs and in the weights of ``drafter.norm`` and
    ``drafter.lm_head``); ce_sum_i the step's unweighted sum (float64) and hits_i the rows whose
    argmax, as a target id (`d2t`), equals the teacher's `top_N` (both detached). Under autocast
    the matmuls run in its dtype, as ``drafter.logits`` would. `objective` other than "kl":
    the loss sums that LK objective's row terms instead (the module docstring); ce_sum and hits
    are the same.
    """
    if objective not in get_args(LossObjective):
        raise ValueError(f"train.loss: {objective!r} is not one of "
                         f"{', '.join(get_args(LossObjective))}")
    head_w = drafter.lm_head.weight
    device = head_w.device
    kind = device.type
    mm = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else head_w.dtype
    grad = torch.is_grad_enabled() and (head_w.requires_grad or drafter.norm.weight.requires_grad
                                        or any(o.requires_grad for o in outs_NH))
    spec = _Spec(idx=idx, ahead=ahead, coeff=coeff, p_NVd=p_NVd, top_N=top_N, d2t=d2t,
                 eps=drafter.norm.eps, objective=objective, mm_dtype=mm, chunk_mb=chunk_mb,
                 grad=grad)
    return _HeadSoftCE.apply(spec, drafter.norm.weight, head_w, *outs_NH)
