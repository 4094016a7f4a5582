"""Training-time test: unrolled logits equal step-by-step drafting; the memory-bounded loss
equals the dense reference; the teacher; loss and counts."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from eyas.train import dense
from eyas.train.ttt import (
    TargetHead,
    Teacher,
    draft_reference,
    teacher_from_final,
    teacher_from_topk,
    ttt_loss,
    unroll,
)
from eyas.train.vocab import DraftVocab

from .helpers import small_drafter, small_vocab


def attention_chunk_mb(rows: int, B: int, heads: int, T: int, itemsize: int) -> float:
    """The `chunk_mb` that makes ``attend_causal`` take `rows` queries per chunk."""
    return rows * 4 * B * heads * T * itemsize / 2**20


@pytest.mark.parametrize(("kv_heads", "rows", "kernel"),
                         [(2, 3, "chunked"), (4, 11, "chunked"), (4, 1, "chunked"),
                          (2, 0, "fused"), (4, 0, "fused")])
def test_unrolled_logits_equal_step_by_step_drafting(kv_heads, rows, kernel):
    """float64, tolerance 1e-9: the fused attention, and chunks of 1, 3 and all 11 queries,
    against ``draft_reference`` (one entry at a time through the dense ``attend``)."""
    torch.manual_seed(1)
    drafter = small_drafter(seed=3, num_key_value_heads=kv_heads).double()
    B, T, steps = 2, 11, 5
    ids = torch.randint(0, 50, (B, T))
    aux = torch.randn(B, T, 96, dtype=torch.float64)
    with torch.no_grad():
        unrolled = unroll(drafter, ids, aux, steps, chunk_mb=attention_chunk_mb(rows, B, 4, T, 8),
                          kernel=kernel)
    for b in range(B):
        for origin in (0, 3, T - 4, T - 1):
            ref = draft_reference(drafter, ids[b], aux[b], origin, steps)
            for i in range(steps):
                torch.testing.assert_close(unrolled[i][b, origin], ref[i], rtol=1e-9, atol=1e-9)


def test_eagle31_options_on_the_llama_kind_unroll_as_step_by_step_drafting():
    """fc_norm / norm_output (SGLang's Llama class reads both): the unroll still equals
    drafting one entry at a time."""
    torch.manual_seed(1)
    drafter = small_drafter(seed=3, fc_norm=True, norm_output=True).double()
    with torch.no_grad():
        for norm in drafter.fc_norm:
            norm.weight.uniform_(0.5, 1.5)
        ids = torch.randint(0, 50, (1, 9))
        aux = torch.randn(1, 9, 96, dtype=torch.float64)
        unrolled = unroll(drafter, ids, aux, 4, chunk_mb=1e-5)
    for origin in (0, 4, 8):
        ref = draft_reference(drafter, ids[0], aux[0], origin, 4)
        for i in range(4):
            torch.testing.assert_close(unrolled[i][0, origin], ref[i], rtol=1e-9, atol=1e-9)


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
    assert t.in_vocab_BT.tolist() == [[True, False]]  # token 2 is not drafted


@pytest.mark.parametrize("chunk_mb", [256, 1e-4])
def test_streamed_teacher_equals_the_whole_vocabulary_one(chunk_mb):
    """Chunks of rows and of vocabulary columns (1e-4 MiB: a few of each) give the dense
    teacher's log-probabilities (fp32, 1e-5) and exactly its argmax, ties included."""
    g = torch.Generator().manual_seed(4)
    vocab = DraftVocab(torch.sort(torch.randperm(50, generator=g)[:24]).values, 50)
    head = torch.randn(50, 32, generator=g)
    head[41] = head[7]  # two equal logits everywhere: the first one is the argmax
    final = torch.randn(2, 9, 32, generator=g) * 3
    final[0, 0] = head[7] * 10
    want = dense.teacher_from_final(final, head, vocab)
    assert want.top_BT[0, 0] == 7
    got = TargetHead(head, vocab, chunk_mb=chunk_mb).teacher(final)
    torch.testing.assert_close(got.logp_BTVd, want.logp_BTVd, rtol=1e-5, atol=1e-5)
    assert torch.equal(got.top_BT, want.top_BT) and torch.equal(got.in_vocab_BT, want.in_vocab_BT)
    assert not got.in_vocab_BT.all() and got.in_vocab_BT.any()


def test_teacher_from_topk_drops_outside_ids_and_renormalises():
    vocab = DraftVocab(torch.tensor([0, 2, 5]), 8)
    ids = torch.tensor([[[2, 7, 0], [7, 6, 1]]], dtype=torch.int32)
    logp = torch.log(torch.tensor([[[0.5, 0.3, 0.1], [0.6, 0.2, 0.1]]])).half()
    t = teacher_from_topk(ids, logp, vocab)
    p = t.logp_BTVd[0, 0].exp()
    torch.testing.assert_close(p, torch.tensor([0.1 / 0.6, 0.5 / 0.6, 0.0]), atol=2e-3, rtol=0)
    assert t.valid_BT.tolist() == [[True, False]]
    assert t.top_BT.tolist() == [[2, 7]]
    assert t.in_vocab_BT.tolist() == [[True, False]]




def random_batch(seed: int, B: int = 2, T: int = 12, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50, (B, T), generator=g)
    aux = torch.randn(B, T, 96, generator=g, dtype=dtype)
    mask = (torch.rand(B, T, generator=g) < 0.7).long()
    final = torch.randn(B, T, 32, generator=g, dtype=dtype) * 2
    head = torch.randn(50, 32, generator=g, dtype=dtype)
    return ids, aux, mask, final, head


@pytest.mark.parametrize(("checkpoint_steps", "kernel"),
                         [(False, "chunked"), (True, "chunked"), (False, "fused"), (True, "fused")])
def test_memory_bounded_loss_equals_the_dense_reference(checkpoint_steps, kernel):
    """float64: loss, counts and every gradient of ``ttt.ttt_loss`` (fused attention, or in
    chunks of 2 queries; the loss in chunks of 3 positions, optionally each step recomputed)
    equal ``dense.ttt_loss`` to 1e-10; the teacher has out-of-vocabulary argmaxes."""
    ids, aux, mask, final, head = random_batch(5, dtype=torch.float64)
    results, grads = [], []
    for path in ("dense", "chunked"):
        drafter = small_drafter(seed=6).double()
        vocab = small_vocab(drafter.cfg)
        if path == "dense":
            teacher = dense.teacher_from_final(final, head, vocab)
            r = dense.ttt_loss(drafter, ids, mask, aux, teacher, vocab, steps=4)
        else:
            teacher = teacher_from_final(final, head, vocab)
            r = ttt_loss(drafter, ids, mask, aux, teacher, vocab, steps=4,
                         chunk_mb=3 * 5 * 24 * 4 / 2**20, checkpoint_steps=checkpoint_steps,
                         kernel=kernel)
        assert not teacher.in_vocab_BT.all()
        r.loss.backward()
        results.append(r)
        grads.append({n: p.grad for n, p in drafter.named_parameters()})
    want, got = results
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-10, atol=0)
    torch.testing.assert_close(got.ce, want.ce, rtol=1e-10, atol=0)
    assert torch.equal(got.correct, want.correct) and torch.equal(got.total, want.total)
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-10, atol=1e-12, msg=name)


def test_loss_only_counts_masked_positions_and_weights_steps():
    drafter = small_drafter(seed=2)
    vocab = DraftVocab(torch.arange(24) * 2, 50)  # the even ids
    ids = torch.randint(0, 50, (2, 10))
    aux = torch.randn(2, 10, 96)
    teacher = teacher_from_final(torch.randn(2, 10, 32), torch.randn(50, 32), vocab)
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


def test_out_of_vocabulary_argmax_leaves_the_loss_and_counts_as_a_miss():
    drafter = small_drafter(seed=2)
    vocab = small_vocab(drafter.cfg)
    ids, aux, mask, final, head = random_batch(8, B=1, T=10)
    mask[:] = 1
    t = teacher_from_final(final, head, vocab)
    inside = t.in_vocab_BT.clone()
    assert 0 < int(inside.sum()) < inside.numel()

    def run(teacher: Teacher):
        with torch.no_grad():
            return ttt_loss(drafter, ids, mask, aux, teacher, vocab, steps=2)

    base = run(t)
    assert base.total.tolist() == [8, 7]  # the loss mask alone: origins 0..7 and 0..6
    # Whatever the teacher says at out-of-vocabulary positions does not move the loss ...
    other = t.logp_BTVd.clone()
    other[~inside] = torch.randn(int((~inside).sum()), vocab.size).log_softmax(-1)
    moved = run(Teacher(other, t.top_BT, t.valid_BT, t.in_vocab_BT))
    assert torch.equal(moved.loss, base.loss)
    # ... while the same change at in-vocabulary positions does (the check above can fail).
    other[inside] = torch.randn(int(inside.sum()), vocab.size).log_softmax(-1)
    assert not torch.equal(run(Teacher(other, t.top_BT, t.valid_BT, t.in_vocab_BT)).loss,
                           base.loss)
    # Hits only where the target's argmax can be drafted.
    reachable = [int(shift_bool(inside, 1 + i)[0, : 8 - i].sum()) for i in range(2)]
    assert all(c <= n for c, n in zip(base.correct.tolist(), reachable, strict=True))


def shift_bool(x: torch.Tensor, by: int) -> torch.Tensor:
    return torch.cat([x[:, by:], x.new_zeros(x.shape[0], by)], dim=1)


def test_topk_and_final_teachers_share_the_accuracy_denominator():
    drafter = small_drafter(seed=2)
    vocab = small_vocab(drafter.cfg)
    ids, aux, mask, final, head = random_batch(9)
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 12, 50, generator=g)
    logits[:, ::3, 1::2] += 20  # every third position: the top-4 are odd, outside small_vocab
    values, top_ids = logits.log_softmax(-1).topk(4, -1)
    topk = teacher_from_topk(top_ids, values.half(), vocab)
    assert not topk.valid_BT.all()
    with torch.no_grad():
        a = ttt_loss(drafter, ids, mask, aux, topk, vocab, steps=3)
        b = ttt_loss(drafter, ids, mask, aux, teacher_from_final(final, head, vocab), vocab,
                     steps=3)
    assert torch.equal(a.total, b.total)
    assert a.total.tolist() == [int(mask[:, 2 + i :].sum()) for i in range(3)]


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any operation returns (forward and backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


@pytest.mark.parametrize("kernel", ["chunked", "fused"])
def test_no_step_allocates_a_sequence_by_sequence_matrix(kernel):
    """T = 160, 4 heads, 7 steps: the dense path creates [B, A, T, T] tensors (the guard);
    the memory-bounded one's largest tensor is the [B, T, 3·H] aux input: never a chunk of more
    than 8 queries' scores (8·A·T), nor [T, V] logits (the fused kernel's own blocks live
    inside it)."""
    B, T, A = 1, 160, 4
    drafter = small_drafter(seed=1)
    vocab = small_vocab(drafter.cfg)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (B, T), generator=g)
    aux, mask = torch.randn(B, T, 96, generator=g), torch.ones(B, T, dtype=torch.long)
    final, head = torch.randn(B, T, 32, generator=g), torch.randn(50, 32, generator=g)
    sizes = {}
    for path in ("dense", "chunked"):
        with LargestTensor() as seen:
            if path == "dense":
                r = dense.ttt_loss(drafter, ids, mask, aux,
                                   dense.teacher_from_final(final, head, vocab), vocab)
            else:
                chunk = attention_chunk_mb(8, B, A, T, 4)
                r = ttt_loss(drafter, ids, mask, aux,
                             teacher_from_final(final, head, vocab, chunk_mb=chunk), vocab,
                             chunk_mb=chunk, kernel=kernel)
            r.loss.backward()
        sizes[path] = seen.numel
    assert sizes["dense"] >= B * A * T * T
    assert sizes["chunked"] == B * T * 96
