"""Training-time test: unroll k drafting steps for every position at once.

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
(the "diagonal"). That is what ``unroll`` builds; ``draft_reference`` runs the drafter entry by
entry as a server would, and the tests hold the two equal.

Loss at step i, origin t: soft cross-entropy between the drafter's draft-vocabulary distribution
and the teacher's ``p_{t+1+i}`` restricted to the draft vocabulary (renormalised), where the
predicted token ``x_{t+2+i}`` exists and its loss-mask bit is set. Total loss
``Σ_i 0.8^i · mean_t CE_i``. Accuracy acc_i: the drafter's argmax (as a target id) equals the
teacher's argmax over the *whole* target vocabulary (a drafter can never propose a token outside
its vocabulary, and this counts that against it). Simulated acceptance length
``Σ_k Π_{i≤k} acc_i`` (draft tokens accepted per verification, not counting the target's own
bonus token).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eyas.train.model import Drafter, attend
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


def teacher_from_final(
    final_BTH: torch.Tensor, lm_head_VH: torch.Tensor, vocab: DraftVocab
) -> Teacher:
    """Teacher from the target's last (normed) hidden states: logits = final @ lm_headᵀ."""
    logits_BTV = final_BTH.float() @ lm_head_VH.float().T
    top = logits_BTV.argmax(-1)
    d2t = vocab.draft_to_target.to(final_BTH.device)
    logp = logits_BTV.index_select(-1, d2t).log_softmax(-1)
    return Teacher(logp, top, torch.ones_like(top, dtype=torch.bool))


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
    return Teacher(logp, top, valid)


@dataclass
class StepOutputs:
    """What one unrolled step produced."""

    logits_BTVd: torch.Tensor
    valid_BT: torch.Tensor


@dataclass
class TTTResult:
    """Loss and per-step counts of one batch (counts sum exactly across batches/processes)."""

    loss: torch.Tensor
    """Scalar: Σ_i 0.8^i · mean soft-CE of step i."""
    correct: torch.Tensor
    """int64 [k]: positions whose step-i argmax matched the teacher's."""
    total: torch.Tensor
    """int64 [k]: positions scored at step i."""
    ce: torch.Tensor
    """float [k]: per-step mean soft-CE (detached)."""


def shift(x: torch.Tensor, by: int, fill: float | int = 0) -> torch.Tensor:
    """``out[:, t] = x[:, t + by]``, padded with `fill` past the end (along dim 1)."""
    if by == 0:
        return x
    pad = x.new_full((x.shape[0], by, *x.shape[2:]), fill)
    return torch.cat([x[:, by:], pad], dim=1)


def unroll(
    drafter: Drafter,
    ids_BT: torch.Tensor,
    aux_BTA: torch.Tensor,
    steps: int,
) -> list[torch.Tensor]:
    """Logits [B, T, Vd] of steps 0..steps-1 at every origin t (see the module docstring).

    Rows past a sample's end compute garbage that the caller masks out; they never influence
    real origins (a query only sees origins s ≤ t).
    """
    B, T = ids_BT.shape
    device = ids_BT.device
    attn = drafter.midlayer.self_attn
    origin_T = torch.arange(T, device=device)
    causal_BTT = (origin_T[None, :] <= origin_T[:, None]).expand(B, T, T)
    hidden_BTH = drafter.fc(aux_BTA.to(drafter.fc.weight.dtype))
    k0 = v0 = None
    diag_k: list[torch.Tensor] = []
    diag_v: list[torch.Tensor] = []
    out_logits = []
    for i in range(steps):
        tok_BT = shift(ids_BT, 1 + i)
        pos_BT = (origin_T + i).expand(B, T)
        x = drafter.midlayer.attn_input(drafter.embed(tok_BT), hidden_BTH)
        q, k, v = attn.qkv(x, pos_BT)  # [B, h, T, D]
        if i == 0:
            k0, v0 = k, v
            ctx = attend(q, k, v, causal_BTT)
        else:
            diag_k.append(k)
            diag_v.append(v)
            ctx = _attend_with_diagonal(q, k0, v0, causal_BTT, diag_k, diag_v)
        out_BTH = drafter.midlayer.finish(hidden_BTH, attn.out(ctx))
        out_logits.append(drafter.logits(out_BTH))
        hidden_BTH = out_BTH
    return out_logits


def _attend_with_diagonal(
    q: torch.Tensor,
    k0: torch.Tensor,
    v0: torch.Tensor,
    causal_BTT: torch.Tensor,
    diag_k: list[torch.Tensor],
    diag_v: list[torch.Tensor],
) -> torch.Tensor:
    """Attention over step-0 keys (causal) plus this origin's own keys of steps 1..i."""
    scale = q.shape[-1] ** -0.5
    acc = torch.promote_types(q.dtype, torch.float32)
    qf = q.to(acc)
    s_ctx = torch.einsum("bhqd,bhkd->bhqk", qf, k0.to(acc)) * scale
    s_ctx = s_ctx.masked_fill(~causal_BTT[:, None], float("-inf"))
    s_diag = torch.stack([(qf * k.to(acc)).sum(-1) * scale for k in diag_k], dim=-1)  # [B,h,T,i]
    probs = torch.cat([s_ctx, s_diag], dim=-1).softmax(-1)
    T = k0.shape[2]
    p_ctx, p_diag = probs[..., :T].to(v0.dtype), probs[..., T:].to(v0.dtype)
    out = torch.einsum("bhqk,bhkd->bhqd", p_ctx, v0)
    for j, v in enumerate(diag_v):
        out = out + p_diag[..., j : j + 1] * v
    return out


def ttt_loss(
    drafter: Drafter,
    ids_BT: torch.Tensor,
    loss_mask_BT: torch.Tensor,
    aux_BTA: torch.Tensor,
    teacher: Teacher,
    vocab: DraftVocab,
    steps: int = 7,
) -> TTTResult:
    """Loss, per-step accuracy counts and CE of one padded batch (padding has loss_mask 0)."""
    logits = unroll(drafter, ids_BT, aux_BTA, steps)
    d2t = vocab.draft_to_target.to(ids_BT.device)
    loss = ids_BT.new_zeros((), dtype=torch.float32)
    correct, total, ces = [], [], []
    for i, logits_BTVd in enumerate(logits):
        valid = (shift(loss_mask_BT, 2 + i) > 0) & shift(teacher.valid_BT, 1 + i, False)
        t_logp = shift(teacher.logp_BTVd, 1 + i, 0.0)
        t_top = shift(teacher.top_BT, 1 + i)
        n = valid.sum()
        logp = logits_BTVd.float().log_softmax(-1)
        t_p = t_logp.exp()  # exp(-inf) = 0: tokens outside the teacher's support
        ce_BT = -(t_p * logp.masked_fill(t_p == 0, 0.0)).sum(-1)
        ce = (ce_BT * valid).sum() / n.clamp(min=1)
        loss = loss + (STEP_WEIGHT**i) * ce
        pred = d2t[logits_BTVd.argmax(-1)]
        correct.append(((pred == t_top) & valid).sum())
        total.append(n)
        ces.append(ce.detach())
    return TTTResult(loss, torch.stack(correct), torch.stack(total), torch.stack(ces))


def acceptance_length(correct: torch.Tensor, total: torch.Tensor) -> tuple[list[float], float]:
    """Per-step accuracy and simulated acceptance length ``Σ_k Π_{i≤k} acc_i``."""
    acc = [float(c) / float(t) if int(t) else 0.0 for c, t in zip(correct.tolist(), total.tolist(), strict=True)]
    run, length = 1.0, 0.0
    for a in acc:
        run *= a
        length += run
    return acc, length


@torch.no_grad()
def draft_reference(
    drafter: Drafter, ids_T: torch.Tensor, aux_TA: torch.Tensor, origin: int, steps: int
) -> list[torch.Tensor]:
    """Logits [Vd] of steps 0..steps-1 from origin `origin`, computed as a server drafts:
    one entry at a time, each a plain causal pass over the entries so far.

    Step-i entries take the data token ``x_{origin+1+i}`` (0 past the end, as ``unroll`` does).
    """
    T = ids_T.shape[0]
    tok = [int(ids_T[s + 1]) if s + 1 < T else 0 for s in range(origin + 1)]
    hid = list(drafter.fc(aux_TA[: origin + 1].to(drafter.fc.weight.dtype)))
    pos = list(range(origin + 1))
    result = []
    for i in range(steps):
        out = drafter.forward_causal(
            torch.tensor([tok]), torch.stack(hid)[None], torch.tensor([pos])
        )[0, -1]
        result.append(drafter.logits(out[None, None])[0, 0])
        nxt = origin + 2 + i
        tok.append(int(ids_T[nxt]) if nxt < T else 0)
        hid.append(out)
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
    "Teacher",
    "TTTResult",
    "acceptance_length",
    "draft_reference",
    "pad_batch",
    "teacher_from_final",
    "teacher_from_topk",
    "ttt_loss",
    "unroll",
]
