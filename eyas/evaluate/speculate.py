"""Speculative decoding of one sequence: draft k tokens, verify them with the target, repeat.

A cycle: the drafter proposes d_1..d_n (n <= k) after the last token y; the target reads
``[y, d_1, .., d_n]`` on top of its cache in one forward pass, which gives its next-token
distribution p_0..p_n at those positions; `verify` keeps the longest acceptable prefix
d_1..d_a and adds one token of the target's own (a correction drawn at position a, or, when
every draft passed, the bonus token from p_n). The target's cache is cut back to drop the
rejected drafts; the drafter is told what was kept. Acceptance length τ = tokens gained per
verification (accepted drafts + 1), as SGLang and the EAGLE papers count it.

Lossless by construction, and tested so:

- greedy (`sampling` None): d_i is accepted when it is the argmax of p_{i-1}, the token
  added is the argmax at the first mismatch (or after the last draft): the output is the
  target's own greedy output, token for token;
- sampling (`Sampling`): p is the target's distribution as SGLang samples it (softmax at the
  temperature, then top-k, then top-p, each renormalised). Two acceptance rules, as SGLang
  0.5.23 has them (`Sampling.rule`):

  - ``target_only``, SGLang's default for a request with temperature > 0
    (``tree_speculative_sampling_target_only``): the drafter proposes its argmax d_i (no
    sampling on the draft side); d_i is accepted with probability p(d_i) (raised by
    ``--speculative-accept-threshold-single`` / ``-acc``: accepted outright when p(d_i) >=
    threshold_single, else when u < p(d_i) / threshold_acc; both 1 by default, and then
    lossless); on rejection the token is drawn from p without d_i. That is rejection sampling
    of a point-mass proposal.
  - ``rejection``, SGLang's opt-in ``--speculative-use-rejection-sampling``: d_i ~ q_i (the
    drafter's softmax at the temperature) is accepted with probability min(1, p(d_i) / q(d_i));
    on rejection the token is drawn from the residual norm(max(0, p - q)).

  After n acceptances the bonus is drawn from p_n. Each token is then distributed exactly as
  the target's p (Leviathan et al. 2023, Chen et al. 2023). A deterministic proposal (prompt
  lookup) is the point mass q = 1{d} under either rule.

Every random draw goes through the caller's `torch.Generator` (on the CPU, in float64), so a
seed fixes the output on any device.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from eyas.evaluate.drafters import DraftMethod, Proposal
from eyas.evaluate.target import Target


@dataclass(frozen=True)
class Sampling:
    """Sampled decoding: the target's distribution and the rule that accepts drafts (module
    docstring)."""

    temperature: float = 1.0
    top_p: float = 1.0
    """Keep the most likely tokens whose probabilities sum to at least this (1: all)."""
    top_k: int | None = None
    """Keep the k most likely tokens (None: all)."""
    rule: Literal["target_only", "rejection"] = "target_only"
    threshold_single: float = 1.0
    """``target_only``: accept a draft outright when p(draft) >= this (1: lossless)."""
    threshold_acc: float = 1.0
    """``target_only``: accept with probability min(1, p(draft) / this) (1: lossless)."""

    @property
    def draft_temperature(self) -> float | None:
        """What the drafter samples at: None (its argmax) under ``target_only``."""
        return self.temperature if self.rule == "rejection" else None

    def probs(self, logits_nV: torch.Tensor) -> torch.Tensor:
        """The target's sampling distribution per row ([n, V] float64 on the CPU): softmax at
        the temperature, then top-k and top-p, each renormalised (SGLang's order)."""
        p = torch.softmax(logits_nV.detach().cpu().double() / self.temperature, dim=-1)
        if self.top_k is not None and self.top_k < p.shape[-1]:
            kth = p.topk(self.top_k, dim=-1).values[..., -1:]
            p = torch.where(p >= kth, p, 0.0)
            p = p / p.sum(-1, keepdim=True)
        if self.top_p < 1.0:
            sorted_p, _ = p.sort(dim=-1, descending=True)
            before = sorted_p.cumsum(-1) - sorted_p  # mass of the tokens ahead of each
            # The smallest prefix reaching top_p; ties with its last token are kept too.
            last = torch.where(before < self.top_p, sorted_p, math.inf).min(-1, keepdim=True)
            p = torch.where(p >= last.values, p, 0.0)
            p = p / p.sum(-1, keepdim=True)
        return p


@dataclass
class Generation:
    """One generated sequence and what it cost."""

    tokens: list[int]
    """Generated tokens (the first one comes from the prompt's forward pass)."""
    accept_lengths: list[int] = field(default_factory=list)
    """Per verification: tokens kept (accepted drafts + 1, fewer when the answer ended)."""
    proposed: list[int] = field(default_factory=list)
    """Per verification: draft tokens proposed."""
    accepted: list[int] = field(default_factory=list)
    """Per verification: draft tokens the target accepted."""
    seconds: float = 0.0
    """Wall time of the whole generation, prompt included."""
    prefill_seconds: float = 0.0
    """Wall time of the prompt's forward pass (and the drafter's pass over the prompt)."""
    target_seconds: float = 0.0
    """Wall time of the target's forward passes after the prompt."""
    target_calls: int = 0
    """Those forward passes (one per verification, or per token without a drafter)."""
    draft_seconds: float = 0.0
    """Wall time of drafting after the prompt (proposals and the drafter's cache updates)."""
    draft_steps: int = 0
    """Drafter chain steps run after the prompt (k per verification)."""
    margins: list[float] = field(default_factory=list)
    """Plain greedy decoding only: top-1 minus top-2 logit of each chosen token (a tiny
    margin is a near tie that arithmetic order can flip)."""
    rounding_steps: list[float] = field(default_factory=list)
    """Beside `margins`: one rounding step of the target's dtype at the top logit's magnitude
    (`rounding_step`); a margin within it is a near tie."""

    @property
    def cycles(self) -> int:
        return len(self.accept_lengths)

    def tie_at(self, i: int) -> tuple[float | None, float | None]:
        """The top-2 margin and rounding step recorded at token `i` (None, None beyond them)."""
        if i < len(self.margins):
            return self.margins[i], self.rounding_steps[i]
        return None, None


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token sequences differ (the shorter one's length when one
    is a prefix of the other), None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _choose(logits_V: torch.Tensor, sampling: Sampling | None,
            generator: torch.Generator | None) -> int:
    if sampling is None:
        return int(logits_V.argmax())
    return int(torch.multinomial(sampling.probs(logits_V[None])[0], 1, generator=generator))


def verify(logits_nV: torch.Tensor, proposal: Proposal, sampling: Sampling | None,
           generator: torch.Generator | None) -> tuple[int, int]:
    """Accept a prefix of `proposal` against the target's logits at ``[y, d_1, .., d_n]``.

    `logits_nV` has n + 1 rows (row i: the target's prediction after d_i; row 0 after y).
    Returns ``(a, token)``: the number of accepted drafts and the target's token that follows
    them. `sampling` None is greedy; otherwise its rule (module docstring).
    """
    drafts = proposal.tokens
    n = len(drafts)
    if logits_nV.shape[0] != n + 1:
        raise ValueError(f"{n} drafts need {n + 1} rows of logits, got {logits_nV.shape[0]}")
    if sampling is None:
        best = logits_nV.argmax(-1).tolist()
        for i, d in enumerate(drafts):
            if d != best[i]:
                return i, best[i]
        return n, best[n]
    p_nV = sampling.probs(logits_nV)
    # Under target_only the proposal's q is never read: SGLang's default treats every draft
    # as a point mass (its kernel gets zeros for the draft probabilities).
    q_nV = proposal.probs if sampling.rule == "rejection" else None
    for i, d in enumerate(drafts):
        p = p_nV[i]
        p_d = float(p[d])
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        if q_nV is None:
            if p_d > 0 and (u < p_d / sampling.threshold_acc or p_d >= sampling.threshold_single):
                continue
        elif u * float(q_nV[i, d]) < p_d:  # u < p/q without dividing (q(d) > 0: d ~ q)
            continue
        if q_nV is not None:
            residual = (p - q_nV[i].double()).clamp(min=0)
        else:
            residual = p.clone()
            residual[d] = 0.0
        total = float(residual.sum())
        # Zero only when p == q up to rounding, where a rejection has probability ~0.
        residual = residual / total if total > 0 else p
        return i, int(torch.multinomial(residual, 1, generator=generator))
    return n, int(torch.multinomial(p_nV[n], 1, generator=generator))


def rounding_step(value: float, dtype: torch.dtype) -> float:
    """The spacing of `dtype`'s numbers at |value|: eps · 2^floor(log2 |value|) (bfloat16:
    0.0625 for logits in [8, 16)). Two logits one step apart may swap order when the same
    sum is computed in another order (a verification's k + 1 rows against one row)."""
    info = torch.finfo(dtype)
    if value == 0 or not math.isfinite(value):
        return info.tiny
    return info.eps * 2.0 ** math.floor(math.log2(abs(value)))


def is_near_tie(margin: float | None, step: float | None) -> bool:
    """A top-2 margin of zero or within one rounding step (`rounding_step`)."""
    return margin is not None and step is not None and margin <= step


def _record_margin(gen: Generation, logits_V: torch.Tensor, dtype: torch.dtype) -> None:
    top = logits_V.topk(2).values
    gen.margins.append(float(top[0] - top[1]))
    gen.rounding_steps.append(rounding_step(max(abs(float(top[0])), abs(float(top[1]))), dtype))


def generate(
    target: Target,
    method: DraftMethod | None,
    prompt: Sequence[int],
    *,
    max_new_tokens: int,
    draft_tokens: int = 3,
    sampling: Sampling | None = None,
    generator: torch.Generator | None = None,
    stop_ids: Collection[int] = (),
) -> Generation:
    """Generate up to `max_new_tokens` after `prompt`, with `method` drafting `draft_tokens`
    per verification, or by plain decoding (one target step per token) when `method` is None.

    Stops after a token of `stop_ids` (kept in the output). `sampling` None is greedy.
    """
    if not prompt:
        raise ValueError("empty prompt")
    dev = target.device
    clock = time.perf_counter
    t_start = clock()
    session = target.session(capture=method is not None and method.needs_aux)
    logits, aux = session.forward(prompt, last_only=True)
    first = _choose(logits[-1], sampling, generator)
    gen = Generation(tokens=[first])
    dtype = getattr(target.model, "dtype", logits.dtype)
    if method is None and sampling is None:
        _record_margin(gen, logits[-1], dtype)
    drafts = method.session() if method is not None else None
    if drafts is not None:
        drafts.begin(prompt, aux, first)
    _sync(dev)
    gen.prefill_seconds = clock() - t_start
    stop = set(stop_ids)
    last = first
    while len(gen.tokens) < max_new_tokens and last not in stop:
        if drafts is None:
            t0 = clock()
            logits, _ = session.forward([last])
            last = _choose(logits[-1], sampling, generator)
            if sampling is None:
                _record_margin(gen, logits[-1], dtype)
            _sync(dev)
            gen.target_seconds += clock() - t0
            gen.target_calls += 1
            gen.tokens.append(last)
            continue
        t0 = clock()
        proposal = drafts.propose(draft_tokens,
                                  sampling.draft_temperature if sampling else None, generator)
        _sync(dev)
        t1 = clock()
        before = session.length
        logits, aux = session.forward([last, *proposal.tokens])
        a, nxt = verify(logits, proposal, sampling, generator)
        session.crop(before + 1 + a)  # keep y and the accepted drafts; nxt is read next cycle
        _sync(dev)
        t2 = clock()
        kept = [*proposal.tokens[:a], nxt]
        drafts.commit(kept, aux[: a + 1] if aux is not None else None)
        _sync(dev)
        t3 = clock()
        gen.draft_seconds += (t1 - t0) + (t3 - t2)
        gen.draft_steps += draft_tokens
        gen.target_seconds += t2 - t1
        gen.target_calls += 1
        room = max_new_tokens - len(gen.tokens)
        kept = kept[:room]
        for j, tok in enumerate(kept):
            if tok in stop:
                kept = kept[: j + 1]
                break
        gen.tokens.extend(kept)
        gen.accept_lengths.append(len(kept))
        gen.proposed.append(len(proposal.tokens))
        gen.accepted.append(a)
        last = kept[-1]
    _sync(dev)
    gen.seconds = clock() - t_start
    return gen
