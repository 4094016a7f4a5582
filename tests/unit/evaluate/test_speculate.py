"""Speculative decoding is lossless: greedy output equals the target's own greedy output token
for token; sampled output follows the target's distribution (chi-square, fixed seeds), and the
same test rejects a biased sampler."""

from __future__ import annotations

from collections import Counter
from itertools import product

import pytest
import torch

from eyas.evaluate.drafters import NgramDrafter, Proposal
from eyas.evaluate.speculate import Sampling, generate, verify

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
        rule = Sampling(temperature, rule="rejection") if temperature is not None else None
        a, nxt = verify(logits, Proposal([d], q), rule, g)
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
@pytest.mark.parametrize("method,rule", [("eagle", "rejection"), ("ngram", "rejection"),
                                         ("eagle", "target_only")])
def test_sampled_sequences_follow_the_targets_joint_distribution(method, rule):
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
                                    sampling=Sampling(1.0, rule=rule), generator=g).tokens)
                     for _ in range(n))
    assert chi_square_p(counts, probs, n) > 1e-3


# -- SGLang's default sampled verification ---------------------------------------------------
def greedy_chain(target, drafter, prompt, first: int, k: int):
    """The drafter's greedy chain after `prompt` + `first`, and the target's logits at
    ``[first, d_1 .. d_k]`` (one verification's rows)."""
    session = target.session(capture=True)
    _, aux = session.forward(list(prompt), last_only=True)
    drafts = drafter.session()
    drafts.begin(prompt, aux, first)
    proposal = drafts.propose(k, None, None)
    logits, _ = session.forward([first, *proposal.tokens])
    return proposal, logits


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_sglang_default_accepts_the_greedy_draft_with_the_targets_probability(top_p):
    """Rule target_only on a tiny target and drafter: the number of accepted drafts of one
    verification has the exact distribution P(a=0) = 1 - p_0(d_1), P(a=1) = p_0(d_1)(1 -
    p_1(d_2)), P(a=2) = p_0(d_1) p_1(d_2) (p after temperature and top-p), and the first token
    kept follows p_0. Rejection sampling's acceptance of the same drafter (Σ min(p_0, q_0) at
    the first position) is far from it, so the test tells the two rules apart."""
    target = small_target(vocab=6, init=0.5, seed=4)
    drafter = small_eagle(target, seed=1, std=0.5)
    with torch.inference_mode():
        proposal, logits = greedy_chain(target, drafter, (0, 1, 2, 3, 1), 2, 2)
    rule = Sampling(0.9, top_p=top_p)
    p = rule.probs(logits)
    d1, d2 = proposal.tokens
    exact = {0: 1 - float(p[0, d1]), 1: float(p[0, d1]) * (1 - float(p[1, d2])),
             2: float(p[0, d1]) * float(p[1, d2])}
    assert min(exact.values()) > 0.05, exact
    n = 20_000
    g = torch.Generator().manual_seed(5)
    accepted, first = Counter(), Counter()
    for _ in range(n):
        a, nxt = verify(logits, proposal, rule, g)
        accepted[a] += 1
        first[d1 if a >= 1 else nxt] += 1
    for t in range(6):  # top-p's cut tokens never come; the others at their rate
        pt = float(p[0, t])
        assert abs(first[t] / n - pt) <= 4 * (pt * (1 - pt) / n) ** 0.5, (t, first, p[0])
    mean = sum(a * c for a, c in accepted.items()) / n
    expect = exact[1] + 2 * exact[2]
    sd = (sum(a * a * q for a, q in exact.items()) - expect ** 2) ** 0.5 / n ** 0.5
    assert abs(mean - expect) < 4 * sd, (mean, expect, sd)
    assert all(abs(accepted[a] / n - q) < 4 * (q * (1 - q) / n) ** 0.5 for a, q in exact.items())
    if top_p < 1:
        assert (p[0] == 0).any()  # top-p cut the tail: the test is not the top_p=1 one again
    # The drafter's own q at the first position (its draft vocabulary is every token): rejection
    # sampling would accept the first draft with probability Σ min(p_0, q_0), far from p_0(d_1).
    q0 = torch.softmax(proposal.logits[0].double() / 0.9, -1)
    rejection_first = float(torch.minimum(p[0], q0).sum())
    assert abs(rejection_first - float(p[0, d1])) > 10 * (1 / n) ** 0.5


def test_acceptance_thresholds_raise_acceptance_as_sglang_documents():
    """threshold_single: a draft with p >= it is always accepted; threshold_acc: accepted with
    probability min(1, p / it)."""
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    p0 = float(torch.softmax(logits[0], -1)[0])  # ~0.665
    g = torch.Generator().manual_seed(0)
    n = 4000

    def rate(rule):
        return sum(verify(logits, Proposal([0]), rule, g)[0] for _ in range(n)) / n

    assert abs(rate(Sampling()) - p0) < 0.03
    assert rate(Sampling(threshold_single=0.6)) == 1.0
    assert rate(Sampling(threshold_single=0.7)) < 0.7
    assert abs(rate(Sampling(threshold_acc=0.8)) - p0 / 0.8) < 0.03


def test_the_evaluators_sampling_mode_drafts_greedily_by_default_as_sglang_does():
    """`evaluate.mode: sampling` models SGLang's default: the drafter is asked for its argmax
    (temperature None); rule "rejection" asks it to sample at the temperature."""
    from eyas.evaluate.config import EvaluateConfig
    from eyas.evaluate.run import sampling_of

    asked = []

    class Spy(OracleDrafter):
        def propose(self, k, temperature, generator):
            asked.append(temperature)
            return super().propose(k, temperature, generator)

    target = small_target(vocab=16)
    ref = generate(target, None, PROMPT, max_new_tokens=12).tokens
    default = sampling_of(EvaluateConfig(mode="sampling", temperature=0.7, top_p=0.9))
    assert default == Sampling(0.7, top_p=0.9, rule="target_only")
    assert sampling_of(EvaluateConfig()) is None
    g = torch.Generator().manual_seed(0)
    generate(target, Spy(ref, 16), PROMPT, max_new_tokens=12, sampling=default, generator=g)
    assert asked and set(asked) == {None}
    asked.clear()
    rejection = sampling_of(EvaluateConfig(mode="sampling", temperature=0.7,
                                           sampling_rule="rejection"))
    generate(target, Spy(ref, 16), PROMPT, max_new_tokens=12, sampling=rejection, generator=g)
    assert asked and set(asked) == {0.7}


def test_plain_greedy_decoding_records_the_rounding_step_of_the_targets_dtype():
    """A bf16 target's top-2 margins are whole multiples of the bf16 spacing at the top logit,
    and each comes with that spacing (the near-tie limit of the lossless check)."""
    from eyas.evaluate.speculate import rounding_step

    target = small_target(vocab=16, dtype=torch.bfloat16)
    g = generate(target, None, PROMPT, max_new_tokens=8)
    assert len(g.margins) == len(g.rounding_steps) == 8
    with torch.inference_mode():
        top2 = target.model(torch.tensor([list(PROMPT)])).logits[0, -1].topk(2).values.float()
    assert g.margins[0] == float(top2[0] - top2[1])
    assert g.rounding_steps[0] == rounding_step(float(top2.abs().max()), torch.bfloat16)
    assert g.rounding_steps[0] == torch.finfo(torch.bfloat16).eps * 2.0 ** int(
        torch.floor(torch.log2(top2.abs().max())))
