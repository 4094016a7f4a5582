"""Training-time test: unrolled logits equal step-by-step drafting; loss and metrics."""

from __future__ import annotations

import math

import pytest
import torch

from eyas.train.ttt import (
    acceptance_length,
    draft_reference,
    teacher_from_final,
    teacher_from_topk,
    ttt_loss,
    unroll,
)
from eyas.train.vocab import DraftVocab

from .helpers import small_drafter, small_vocab


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_unrolled_logits_equal_step_by_step_drafting(kv_heads):
    torch.manual_seed(1)
    drafter = small_drafter(seed=3, num_key_value_heads=kv_heads).double()
    B, T, steps = 2, 11, 5
    ids = torch.randint(0, 50, (B, T))
    aux = torch.randn(B, T, 96, dtype=torch.float64)
    with torch.no_grad():
        unrolled = unroll(drafter, ids, aux, steps)
    for b in range(B):
        for origin in (0, 3, T - 4, T - 1):
            ref = draft_reference(drafter, ids[b], aux[b], origin, steps)
            for i in range(steps):
                torch.testing.assert_close(unrolled[i][b, origin], ref[i], rtol=1e-9, atol=1e-9)


def test_a_causal_mask_at_later_steps_would_differ():
    """The check above can fail: step 2 of a plain causal pass is not step-by-step drafting."""
    drafter = small_drafter(seed=3).double()
    ids = torch.randint(0, 50, (1, 9), generator=torch.Generator().manual_seed(0))
    aux = torch.randn(1, 9, 96, dtype=torch.float64)
    with torch.no_grad():
        unrolled = unroll(drafter, ids, aux, 3)
        # Plain causal over step-1 hiddens (what a naive unroll computes):
        h0 = drafter.fc(aux)
        out0 = drafter.forward_causal(ids.roll(-1, 1), h0, torch.arange(9)[None])
        naive1 = drafter.logits(drafter.forward_causal(ids.roll(-2, 1), out0, torch.arange(9)[None] + 1))
    assert not torch.allclose(unrolled[1][0, 4], naive1[0, 4], atol=1e-6)


def test_padding_rows_do_not_change_real_rows():
    drafter = small_drafter(seed=5)
    ids = torch.randint(0, 50, (1, 8))
    aux = torch.randn(1, 8, 96)
    with torch.no_grad():
        short = unroll(drafter, ids[:, :6], aux[:, :6], 3)
        long = unroll(drafter, ids, aux, 3)
    # Origins whose step-i token lies inside the short sample see the same inputs.
    for i in range(3):
        n = 6 - 1 - i
        torch.testing.assert_close(short[i][:, :n], long[i][:, :n])


def test_teacher_from_final_restricts_and_takes_whole_vocab_argmax():
    vocab = DraftVocab(torch.tensor([1, 3, 4]), 6)
    head = torch.eye(6)
    final = torch.tensor([[[0.0, 5.0, 1.0, 2.0, 0.0, 0.0], [0.0, 0.0, 9.0, 1.0, 2.0, 0.0]]])
    t = teacher_from_final(final, head, vocab)
    assert t.top_BT.tolist() == [[1, 2]]
    expected = torch.log_softmax(torch.tensor([5.0, 2.0, 0.0]), -1)
    torch.testing.assert_close(t.logp_BTVd[0, 0], expected)
    assert t.valid_BT.all()


def test_teacher_from_topk_drops_outside_ids_and_renormalises():
    vocab = DraftVocab(torch.tensor([0, 2, 5]), 8)
    ids = torch.tensor([[[2, 7, 0], [7, 6, 1]]], dtype=torch.int32)
    logp = torch.log(torch.tensor([[[0.5, 0.3, 0.1], [0.6, 0.2, 0.1]]])).half()
    t = teacher_from_topk(ids, logp, vocab)
    p = t.logp_BTVd[0, 0].exp()
    torch.testing.assert_close(p, torch.tensor([0.1 / 0.6, 0.5 / 0.6, 0.0]), atol=2e-3, rtol=0)
    assert t.valid_BT.tolist() == [[True, False]]
    assert t.top_BT.tolist() == [[2, 7]]


def test_loss_only_counts_masked_positions_and_weights_steps():
    drafter = small_drafter(seed=2)
    cfg = drafter.cfg
    vocab = small_vocab(cfg)
    ids = torch.randint(0, 50, (2, 10))
    aux = torch.randn(2, 10, 96)
    final = torch.randn(2, 10, 32)
    head = torch.randn(50, 32)
    teacher = teacher_from_final(final, head, vocab)
    mask = torch.zeros(2, 10, dtype=torch.long)
    mask[0, 6:] = 1
    r = ttt_loss(drafter, ids, mask, aux, teacher, vocab, steps=3)
    # Step i supervises token t+2+i with t >= 0: 4 masked tokens (6..9) reachable at every step.
    assert r.total.tolist() == [4, 4, 4]
    torch.testing.assert_close(r.loss, sum(0.8**i * r.ce[i] for i in range(3)))
    r.loss.backward()
    assert drafter.fc.weight.grad.abs().sum() > 0
    assert drafter.embed_VH.grad is None
    # No supervised token: zero loss, zero counts.
    r0 = ttt_loss(drafter, ids, torch.zeros_like(mask), aux, teacher, vocab, steps=2)
    assert float(r0.loss.detach()) == 0.0 and r0.total.tolist() == [0, 0]


def test_acceptance_length_is_sum_of_running_products():
    acc, length = acceptance_length(torch.tensor([8, 6, 3]), torch.tensor([10, 10, 10]))
    assert acc == [0.8, 0.6, 0.3]
    assert math.isclose(length, 0.8 + 0.48 + 0.144)
    assert acceptance_length(torch.tensor([0]), torch.tensor([0]))[1] == 0.0
