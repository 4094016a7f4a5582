"""The fused head + soft cross-entropy equals the same loss written with autograd ops: loss,
per-step sums, hits and every gradient, in float64 and under bf16 autocast on CPU."""

from __future__ import annotations

import pytest
import torch

from eyas.train.head_loss import head_soft_ce

from .helpers import small_drafter, small_vocab


def problem(dtype: torch.dtype, seed: int = 0):
    """A drafter, two steps' outputs [N, H] (leaf tensors), scored rows, a teacher with some
    zero-probability tokens, coefficients."""
    drafter = small_drafter(seed=seed).to(dtype)
    vocab = small_vocab(drafter.cfg)
    g = torch.Generator().manual_seed(seed)
    N, H, Vd = 23, drafter.cfg.hidden_size, vocab.size
    outs = [(3 * torch.randn(N, H, generator=g, dtype=dtype)).requires_grad_() for _ in range(2)]
    idx = [torch.tensor([0, 2, 3, 7, 11, 19, 20]), torch.tensor([1, 4, 5, 6, 12, 18])]
    logits = torch.randn(N + 3, Vd, generator=g, dtype=torch.float64) * 2
    logits[:, ::5] = float("-inf")  # outside the teacher's support
    p = logits.softmax(-1).to(torch.float32)
    top = vocab.draft_to_target[logits.argmax(-1)]
    coeff = [1 / 7, 0.8 / 6]
    return drafter, vocab, outs, idx, [1, 2], coeff, p, top


def autograd_reference(drafter, vocab, outs, idx, ahead, coeff, p, top):
    """The loss as autograd ops: logits of the scored rows, log-softmax, soft-CE."""
    loss = 0
    ces, hits = [], []
    for i, out in enumerate(outs):
        z = drafter.logits(out.index_select(0, idx[i]))
        logq = z.to(torch.promote_types(z.dtype, torch.float32)).log_softmax(-1)
        t = p.index_select(0, idx[i] + ahead[i]).to(logq.dtype)
        ce = -(t * logq).sum()
        ces.append(ce.detach())
        hits.append((vocab.draft_to_target[z.argmax(-1)] == top[idx[i] + ahead[i]]).sum())
        loss = loss + coeff[i] * ce
    return loss, torch.stack(ces), torch.stack(hits)


def grads_of(drafter, outs, loss):
    params = [drafter.norm.weight, drafter.lm_head.weight, *outs]
    return torch.autograd.grad(loss, params)


@pytest.mark.parametrize("chunk_mb", [1e-6, 0.004, 1024])  # 1 row, a few rows, all rows
def test_fused_head_loss_equals_autograd_in_float64(chunk_mb):
    drafter, vocab, outs, idx, ahead, coeff, p, top = problem(torch.float64)
    d2t = vocab.draft_to_target
    loss, ce, hits = head_soft_ce(drafter, outs, idx, ahead, coeff, p, top, d2t, chunk_mb=chunk_mb)
    want_loss, want_ce, want_hits = autograd_reference(drafter, vocab, outs, idx, ahead, coeff,
                                                       p, top)
    torch.testing.assert_close(loss, want_loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(ce, want_ce, rtol=1e-12, atol=0)
    assert torch.equal(hits, want_hits)
    for got, want in zip(grads_of(drafter, outs, 2.5 * loss),
                         grads_of(drafter, outs, 2.5 * want_loss), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)


def test_fused_head_loss_under_cpu_bf16_autocast_matches_autograd_under_it():
    """The matmuls run in bf16 like ``drafter.logits`` under autocast (the logits rounded to
    bf16), the softmax and the loss in float32: the two agree to float32 summation order."""
    drafter, vocab, outs, idx, ahead, coeff, p, top = problem(torch.float32)
    d2t = vocab.draft_to_target
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, ce, hits = head_soft_ce(drafter, outs, idx, ahead, coeff, p, top, d2t,
                                      chunk_mb=0.004)
        want_loss, want_ce, want_hits = autograd_reference(drafter, vocab, outs, idx, ahead,
                                                           coeff, p, top)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, want_loss, rtol=1e-4, atol=0)
    torch.testing.assert_close(ce.float(), want_ce, rtol=1e-4, atol=0)
    assert torch.equal(hits, want_hits)
    for got, want in zip(grads_of(drafter, outs, loss), grads_of(drafter, outs, want_loss),
                         strict=True):
        assert got.dtype == want.dtype
        # both round the same float32 gradient of the logits to bf16 for their matmuls
        torch.testing.assert_close(got, want, rtol=2e-2, atol=1e-4)
    # and bf16 is not float32: the same loss without autocast differs
    loss32, _, _ = head_soft_ce(drafter, outs, idx, ahead, coeff, p, top, d2t, chunk_mb=0.004)
    assert not torch.allclose(loss32, loss, rtol=1e-6, atol=0)


def test_without_grad_it_keeps_no_gradient_and_gives_the_same_figures():
    drafter, vocab, outs, idx, ahead, coeff, p, top = problem(torch.float64)
    d2t = vocab.draft_to_target
    with_grad = head_soft_ce(drafter, outs, idx, ahead, coeff, p, top, d2t, chunk_mb=0.004)
    with torch.no_grad():
        loss, ce, hits = head_soft_ce(drafter, outs, idx, ahead, coeff, p, top, d2t,
                                      chunk_mb=0.004)
    assert not loss.requires_grad
    assert torch.equal(loss, with_grad[0].detach())
    assert torch.equal(ce, with_grad[1]) and torch.equal(hits, with_grad[2])


def test_no_scored_rows_gives_zero_loss_and_zero_gradients():
    drafter, vocab, outs, _, ahead, coeff, p, top = problem(torch.float64)
    empty = [torch.zeros(0, dtype=torch.long)] * 2
    loss, ce, hits = head_soft_ce(drafter, outs, empty, ahead, coeff, p, top,
                                  vocab.draft_to_target, chunk_mb=1)
    assert float(loss.detach()) == 0 and ce.tolist() == [0, 0] and hits.tolist() == [0, 0]
    for g in grads_of(drafter, outs, loss):
        assert not g.any()
