"""Speculative decoding is lossless: greedy output equals the target's own greedy output token
for token; sampled output follows the target's distribution (chi-square, fixed seeds), and the
same test rejects a biased sampler."""

from __future__ import annotations

from collections import Counter
from itertools import product

import pytest
import torch

from eyas.evaluate.drafters import NgramDrafter, Proposal
from eyas.evaluate.speculate import generate, verify

from .helpers import small_eagle, small_target

PROMPT = (1, 5, 2, 7, 3)


class OracleDrafter:
    """Proposes the reference continuation `ref`, corrupting the draft at index
    ``cycle % (k + 1)`` (index k: nothing corrupted, every draft passes): verification must
    then accept exactly 0, 1, .., k drafts in turn."""

    needs_aux = False
    name = "oracle"

    def __init__(self, ref: list[int], vocab: int) -> None:
        self.ref, self.vocab = ref, vocab

    def session(self):
        return self

    def begin(self, prompt, aux, first) -> None:
        self.pos, self.cycle = 1, 0

    def commit(self, tokens, aux) -> None:
        self.pos += len(tokens)
        self.cycle += 1

    def propose(self, k, temperature, generator) -> Proposal:
        drafts = list(self.ref[self.pos:self.pos + k])
        bad = self.cycle % (k + 1)
        if bad < len(drafts):
            drafts[bad] = (drafts[bad] + 1) % self.vocab
        return Proposal(drafts)


def hf_greedy(target, prompt, n: int) -> list[int]:
    """The target's greedy continuation by transformers' own `generate` (independent code)."""
    ids = torch.tensor([list(prompt)])
    out = target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=n, min_new_tokens=n, eos_token_id=None,
                                pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_greedy_verification_accepts_exactly_the_matching_prefix_and_keeps_the_output():
    target = small_target(vocab=16)
    ref = hf_greedy(target, PROMPT, 40)
    assert generate(target, None, PROMPT, max_new_tokens=40).tokens == ref
    for k in (1, 3):
        g = generate(target, OracleDrafter(ref, 16), PROMPT, max_new_tokens=40, draft_tokens=k)
        assert g.tokens == ref
        # Cycle c accepts c % (k+1) drafts; the last cycle may be cut by max_new_tokens.
        assert g.accepted[:-1] == [c % (k + 1) for c in range(len(g.accepted) - 1)]
        assert sum(g.accept_lengths) == len(ref) - 1


@pytest.mark.parametrize("method", ["eagle", "ngram"])
def test_greedy_output_equals_the_targets_own_greedy_output(method):
    target = small_target(vocab=16, seed=3)
    drafter = small_eagle(target, [0, 2, 3, 5, 7, 11, 13], seed=1) if method == "eagle" \
        else NgramDrafter(2)
    for prompt in (PROMPT, (4, 4, 9, 1), tuple(range(12))):
        ref = hf_greedy(target, prompt, 32)
        g = generate(target, drafter, prompt, max_new_tokens=32, draft_tokens=3)
        assert g.tokens == ref, prompt
        assert g.cycles == len(g.accept_lengths) > 0


def test_greedy_on_the_tiny_target_equals_its_own_greedy_output(tiny_target):
    """The real tiny target (float32) with prompt lookup, which accepts often: equal, or the
    first difference sits at a near tie of the target's logits (arithmetic order)."""
    from transformers import AutoTokenizer

    from eyas.evaluate.prompts import render_ids
    from eyas.evaluate.target import Target, load_target

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(str(tiny_target))
    target = Target(load_target(tiny_target, torch.device("cpu"), torch.float32), [0, 1, 2])
    drafter = NgramDrafter(3)
    for q in ("Describe `collections.Counter.most_common`.", "What does `json.dumps` do?"):
        prompt = render_ids(tok, [{"role": "user", "content": q}])
        plain = generate(target, None, prompt, max_new_tokens=48, stop_ids=[tok.eos_token_id])
        g = generate(target, drafter, prompt, max_new_tokens=48, draft_tokens=3,
                     stop_ids=[tok.eos_token_id])
        diff = next((i for i, (a, b) in enumerate(zip(plain.tokens, g.tokens, strict=False))
                     if a != b), None)
        if diff is None:
            assert g.tokens == plain.tokens
        else:
            assert plain.margins[diff] < 1e-4, (diff, plain.margins[diff])


# -- sampling ----------------------------------------------------------------------------------
def chi_square_p(counts: Counter, probs: dict, n: int) -> float:
    """p-value of observed `counts` against `probs` (cells expected below 5 pooled)."""
    stat, df = 0.0, -1
    pool_obs, pool_exp = 0.0, 0.0
    for cell, p in probs.items():
        expected = n * p
        if expected < 5:
            pool_obs += counts.get(cell, 0)
            pool_exp += expected
            continue
        stat += (counts.get(cell, 0) - expected) ** 2 / expected
        df += 1
    if pool_exp > 0:
        stat += (pool_obs - pool_exp) ** 2 / pool_exp
        df += 1
    assert sum(counts.values()) == n and df >= 3
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def verify_draws(p_V, q_V, n: int, seed: int, *, claimed_q=None, temperature=1.0) -> Counter:
    """Tokens emitted first by `verify` for one draft d ~ q against target row p (the row
    after d is p too, so acceptance emits d)."""
    g = torch.Generator().manual_seed(seed)
    logits = p_V.log()[None].repeat(2, 1)
    out = Counter()
    for _ in range(n):
        d = int(torch.multinomial(q_V, 1, generator=g))
        q = (claimed_q if claimed_q is not None else q_V)[None]
        a, nxt = verify(logits, Proposal([d], q), temperature, g)
        out[d if a == 1 else nxt] += 1
    return out


P = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04], dtype=torch.float64)
Q = torch.tensor([0.05, 0.10, 0.45, 0.05, 0.30, 0.05], dtype=torch.float64)


def test_rejection_sampling_emits_the_targets_distribution():
    n = 20_000
    counts = verify_draws(P, Q, n, seed=0)
    assert chi_square_p(counts, dict(enumerate(P.tolist())), n) > 1e-3
    # A deterministic proposal (prompt lookup: q is a point mass) keeps it too.
    point = torch.zeros(6, dtype=torch.float64)
    point[2] = 1.0
    counts = verify_draws(P, point, n, seed=1)
    assert chi_square_p(counts, dict(enumerate(P.tolist())), n) > 1e-3


def test_the_chi_square_check_rejects_a_biased_sampler():
    """The same check, fed a drafter that reports another q than the one it drew from (so
    acceptance and residual are computed against the wrong q), or greedy acceptance of
    sampled drafts, sees the bias."""
    n = 20_000
    uniform = torch.full((6,), 1 / 6, dtype=torch.float64)
    counts = verify_draws(P, Q, n, seed=0, claimed_q=uniform)
    assert chi_square_p(counts, dict(enumerate(P.tolist())), n) < 1e-6
    counts = verify_draws(P, Q, n, seed=0, temperature=None)
    assert chi_square_p(counts, dict(enumerate(P.tolist())), n) < 1e-6


def exact_joint(target, prompt, length: int) -> dict:
    """P(y_1..y_length | prompt) of the target, by enumerating every prefix."""
    V = target.vocab_size
    probs = {}
    for seq in product(range(V), repeat=length):
        logits = target.model(torch.tensor([list(prompt) + list(seq)])).logits[0].double()
        p = 1.0
        for i, tok in enumerate(seq):
            p *= float(torch.softmax(logits[len(prompt) - 1 + i], -1)[tok])
        probs[seq] = p
    assert abs(sum(probs.values()) - 1) < 1e-9
    return probs


@pytest.mark.slow
@pytest.mark.parametrize("method", ["eagle", "ngram"])
def test_sampled_sequences_follow_the_targets_joint_distribution(method):
    """Three tokens per sample (the prompt's token, then a verification of 2 drafts and
    more when it rejects), 1,500 samples with fixed seeds, against the exact joint of the
    target over a 5-token vocabulary (125 cells)."""
    torch.set_num_threads(1)
    target = small_target(vocab=5, init=0.5, seed=7)
    drafter = (small_eagle(target, [0, 1, 3], seed=2, std=0.5) if method == "eagle"
               else NgramDrafter(2))
    prompt = (0, 1, 2, 0, 1)
    with torch.inference_mode():
        probs = exact_joint(target, prompt, 3)
    n = 1500
    g = torch.Generator().manual_seed(11)
    counts = Counter(tuple(generate(target, drafter, prompt, max_new_tokens=3, draft_tokens=2,
                                    temperature=1.0, generator=g).tokens) for _ in range(n))
    assert chi_square_p(counts, probs, n) > 1e-3
