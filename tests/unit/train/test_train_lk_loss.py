"""``train.loss`` lk_log / lk_hybrid: values and gradients of the fused head loss and of the
whole TTT loss equal a plain PyTorch reference written here (autograd through
``torch.minimum``), with out-of-vocabulary targets, loss masks and the steps' weights; the
setting is validated, part of a training's identity, and trains."""

from __future__ import annotations

import math

import pytest
import torch

from eyas.config import parse_config
from eyas.errors import ConfigError
from eyas.train import dense
from eyas.train.head_loss import LK_ALPHA_FLOOR, LK_ETA, head_soft_ce
from eyas.train.ttt import teacher_from_final, ttt_loss

from .helpers import small_drafter, small_vocab
from .test_train_head_loss import autograd_reference, grads_of, problem
from .test_train_trainer import make_trainer
from .test_train_ttt import random_batch

LK = ["lk_log", "lk_hybrid"]


def plain_term(objective: str, z: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """One position's loss term from its draft logits `z` [Vd] and teacher `p` [Vd], written
    out from the definitions."""
    q = torch.softmax(z.to(torch.promote_types(z.dtype, torch.float32)), -1)
    p = p.to(q.dtype)
    alpha = torch.minimum(p, q).sum()
    if objective == "lk_log":
        return -torch.log(torch.clamp(alpha, min=LK_ALPHA_FLOOR))
    kl = sum(p[x] * (torch.log(p[x]) - torch.log(q[x])) for x in range(p.numel()) if p[x] > 0)
    lam = math.exp(-LK_ETA * float(alpha.detach()))  # λ without gradient
    return lam * kl + (1 - lam) * (1 - alpha)


def plain_head_loss(objective, drafter, outs, idx, ahead, coeff, p):
    loss = 0
    for i, out in enumerate(outs):
        z = drafter.logits(out.index_select(0, idx[i]))  # one matmul, as autocast rounds it
        for row, n in enumerate(idx[i].tolist()):
            loss = loss + coeff[i] * plain_term(objective, z[row], p[n + ahead[i]])
    return loss


@pytest.mark.parametrize("objective", LK)
@pytest.mark.parametrize("chunk_mb", [1e-6, 0.004, 1024])  # 1 row, a few rows, all rows
def test_fused_lk_loss_equals_the_plain_reference_in_float64(objective, chunk_mb):
    drafter, vocab, outs, idx, ahead, coeff, p, top = problem(torch.float64)
    d2t = vocab.draft_to_target
    loss, ce, hits = head_soft_ce(drafter, outs, idx, ahead, coeff, p, top, d2t,
                                  chunk_mb=chunk_mb, objective=objective)
    want = plain_head_loss(objective, drafter, outs, idx, ahead, coeff, p)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=0)
    # the per-step sums and hits stay the soft-CE's
    _, want_ce, want_hits = autograd_reference(drafter, vocab, outs, idx, ahead, coeff, p, top)
    torch.testing.assert_close(ce, want_ce, rtol=1e-12, atol=0)
    assert torch.equal(hits, want_hits)
    for got, exp in zip(grads_of(drafter, outs, 2.5 * loss), grads_of(drafter, outs, 2.5 * want),
                        strict=True):
        torch.testing.assert_close(got, exp, rtol=1e-10, atol=1e-13)
    # and it is another loss than the soft-CE's
    kl, _, _ = head_soft_ce(drafter, outs, idx, ahead, coeff, p, top, d2t, chunk_mb=chunk_mb)
    assert not torch.allclose(kl, loss)


@pytest.mark.parametrize("objective", LK)
def test_fused_lk_loss_under_cpu_bf16_autocast_matches_the_reference_under_it(objective):
    """The matmuls in bf16, α, λ and the gradient of the logits in float32, as the reference
    computes them under autocast."""
    drafter, vocab, outs, idx, ahead, coeff, p, top = problem(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # one chunk per step, as the reference's one matmul: bf16 rounds each matmul's
        # output once (the float64 test covers the chunking)
        loss, _, _ = head_soft_ce(drafter, outs, idx, ahead, coeff, p, top,
                                  vocab.draft_to_target, chunk_mb=1024, objective=objective)
        want = plain_head_loss(objective, drafter, outs, idx, ahead, coeff, p)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, want.float(), rtol=1e-4, atol=0)
    for got, exp in zip(grads_of(drafter, outs, loss), grads_of(drafter, outs, want), strict=True):
        assert got.dtype == exp.dtype
        torch.testing.assert_close(got, exp, rtol=2e-2, atol=1e-4)


def test_lk_log_of_a_one_hot_teacher_is_its_cross_entropy_and_zero_overlap_stays_finite():
    drafter, vocab, outs, idx, ahead, coeff, p, top = problem(torch.float64)
    d2t = vocab.draft_to_target
    one_hot = torch.nn.functional.one_hot(p.argmax(-1), p.shape[1]).to(p.dtype)
    lk, _, _ = head_soft_ce(drafter, outs, idx, ahead, coeff, one_hot, top, d2t, chunk_mb=1,
                            objective="lk_log")
    ce, _, _ = head_soft_ce(drafter, outs, idx, ahead, coeff, one_hot, top, d2t, chunk_mb=1)
    torch.testing.assert_close(lk, ce, rtol=1e-12, atol=0)  # α = q(top): -log α = CE
    # A drafter sure of a token the teacher gives 0: α underflows to 0, clamped before the log.
    with torch.no_grad():
        drafter.lm_head.weight.mul_(1e4)
    zero_p = torch.zeros_like(p)
    zero_p[:, 0] = 1.0
    for objective in LK:
        loss, _, _ = head_soft_ce(drafter, outs, idx, ahead, coeff, zero_p, top, d2t,
                                  chunk_mb=1, objective=objective)
        assert torch.isfinite(loss)
        assert all(torch.isfinite(g).all() for g in grads_of(drafter, outs, loss))


def plain_ttt_loss(objective, drafter, ids, mask, aux, teacher, vocab, steps):
    """Σ_i 0.8^i · mean over step i's positions in the loss of the position's term, position
    by position: origin t of sample b is in step i's loss when its predicted token t+2+i exists
    and is loss-masked and the teacher at t+1+i has an in-vocabulary argmax."""
    logits = dense.unroll(drafter, ids, aux, steps)
    B, T = ids.shape
    loss = 0
    for i in range(steps):
        terms = [plain_term(objective, logits[i][b, t], teacher.logp_BTVd[b, t + 1 + i].exp())
                 for b in range(B) for t in range(T)
                 if t + 2 + i < T and mask[b, t + 2 + i] and teacher.usable_BT[b, t + 1 + i]]
        if terms:
            loss = loss + 0.8**i * sum(terms) / len(terms)
    return loss


@pytest.mark.parametrize("objective", LK)
def test_ttt_loss_equals_the_plain_reference_with_masks_oov_targets_and_step_weights(objective):
    ids, aux, mask, final, head = random_batch(5, dtype=torch.float64)
    grads = []
    for path in ("plain", "ttt", "dense"):
        drafter = small_drafter(seed=6).double()
        vocab = small_vocab(drafter.cfg)
        teacher = teacher_from_final(final, head, vocab)
        assert not teacher.in_vocab_BT.all() and not mask.bool().all()
        if path == "plain":
            loss = plain_ttt_loss(objective, drafter, ids, mask, aux, teacher, vocab, 3)
        elif path == "ttt":
            loss = ttt_loss(drafter, ids, mask, aux, teacher, vocab, steps=3, objective=objective,
                            chunk_mb=3 * 8 * 24 * 8 / 2**20).loss
        else:
            loss = dense.ttt_loss(drafter, ids, mask, aux, teacher, vocab, steps=3,
                                  objective=objective).loss
        loss.backward()
        grads.append((loss.detach(), {n: p.grad for n, p in drafter.named_parameters()}))
    (want, want_g), *others = grads
    for got, got_g in others:
        torch.testing.assert_close(got, want, rtol=1e-10, atol=0)
        for name, g in want_g.items():
            torch.testing.assert_close(got_g[name], g, rtol=1e-9, atol=1e-12, msg=name)


def test_the_loss_setting_is_validated_by_name():
    raw = {"name": "t", "target": {"model": "m"}, "datasets": [{"name": "a", "source": "a.jsonl"}]}
    assert parse_config(raw).train.loss == "kl"
    assert parse_config({**raw, "train": {"loss": "lk_hybrid"}}).train.loss == "lk_hybrid"
    with pytest.raises(ConfigError, match=r"train\.loss: Input should be 'kl', 'lk_log' or "
                                          r"'lk_hybrid'"):
        parse_config({**raw, "train": {"loss": "tv"}})


def test_another_loss_is_another_training_for_resume_and_the_cache():
    from eyas.train.resume import resume_settings, train_settings

    raw = {"name": "t", "target": {"model": "m"}, "datasets": [{"name": "a", "source": "a.jsonl"}]}
    kl = parse_config(raw)
    for objective in LK:
        lk = parse_config({**raw, "train": {"loss": objective}})
        assert resume_settings(lk, "offline") != resume_settings(kl, "offline")
        assert train_settings(lk, "offline") != train_settings(kl, "offline")
    # The default trains as eyas did before the option: a run trained then keeps its identity.
    assert "loss" not in train_settings(kl, "offline")["train"]
    assert "loss" not in resume_settings(kl, "offline")["train"]
    # ... and the teacher's memo changes how fast, not what is trained.
    no_memo = parse_config({**raw, "train": {"teacher_memo": False}})
    assert resume_settings(no_memo, "offline") == resume_settings(kl, "offline")


@pytest.mark.parametrize("objective", LK)
def test_training_with_an_lk_loss_lowers_it(tmp_path, objective):
    t = make_trainer(tmp_path, steps=12, loss=objective)
    first = t.evaluate()
    t.fit()
    evals = [h for h in t.state.history if h["kind"] == "eval"]
    assert [e["step"] for e in evals] == [3, 6, 9, 12]
    assert evals[-1]["loss"] < first.loss
    assert all(math.isfinite(h["loss"]) for h in t.state.history)


def test_an_unknown_objective_is_refused_naming_the_setting_and_the_choices():
    drafter, vocab, outs, idx, ahead, coeff, p, top = problem(torch.float64)
    with pytest.raises(ValueError, match="train.loss: 'tv' is not one of kl, lk_log, lk_hybrid"):
        head_soft_ce(drafter, outs, idx, ahead, coeff, p, top, vocab.draft_to_target,
                     chunk_mb=1, objective="tv")
