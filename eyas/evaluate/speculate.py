"""Speculative decoding of one sequence: draft k tokens, verify them with the target, repeat.

A cycle: the drafter proposes d_1..d_n (n <= k) after the last token y; the target reads
``[y, d_1, .., d_n]`` on top of its cache in one forward pass, which gives its next-token
distribution p_0..p_n at those positions; `verify` keeps the longest acceptable prefix
d_1..d_a and adds one token of the target's own (a correction drawn at position a, or, when
every draft passed, the bonus token from p_n). The target's cache is cut back to drop the
rejected drafts; the drafter is told what was kept. Acceptance length τ = tokens gained per
verification (accepted drafts + 1), as SGLang and the EAGLE papers count it.

Lossless by construction, and tested so:

- greedy (``temperature`` None): d_i is accepted when it is the argmax of p_{i-1}, the token
  added is the argmax at the first mismatch (or after the last draft): the output is the
  target's own greedy output, token for token;
- sampling: d_i ~ q_i is accepted with probability min(1, p(d_i) / q(d_i)); on rejection the
  token is drawn from the residual norm(max(0, p - q)); after n acceptances the bonus is drawn
  from p_n. Each token is then distributed exactly as the target's p (Leviathan et al. 2023,
  Chen et al. 2023). A deterministic proposal (prompt lookup) is the point mass q = 1{d}.

Every random draw goes through the caller's `torch.Generator` (on the CPU, in float64), so a
seed fixes the output on any device.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import torch

from eyas.evaluate.drafters import DraftMethod, Proposal
from eyas.evaluate.target import Target


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

    @property
    def cycles(self) -> int:
        return len(self.accept_lengths)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _choose(logits_V: torch.Tensor, temperature: float | None,
            generator: torch.Generator | None) -> int:
    if temperature is None:
        return int(logits_V.argmax())
    p = torch.softmax(logits_V.detach().cpu().double() / temperature, dim=-1)
    return int(torch.multinomial(p, 1, generator=generator))


def verify(logits_nV: torch.Tensor, proposal: Proposal, temperature: float | None,
           generator: torch.Generator | None) -> tuple[int, int]:
    """Accept a prefix of `proposal` against the target's logits at ``[y, d_1, .., d_n]``.

    `logits_nV` has n + 1 rows (row i: the target's prediction after d_i; row 0 after y).
    Returns ``(a, token)``: the number of accepted drafts and the target's token that follows
    them. `temperature` None is greedy; otherwise rejection sampling (module docstring).
    """
    drafts = proposal.tokens
    n = len(drafts)
    if logits_nV.shape[0] != n + 1:
        raise ValueError(f"{n} drafts need {n + 1} rows of logits, got {logits_nV.shape[0]}")
    if temperature is None:
        best = logits_nV.argmax(-1).tolist()
        for i, d in enumerate(drafts):
            if d != best[i]:
                return i, best[i]
        return n, best[n]
    p_nV = torch.softmax(logits_nV.detach().cpu().double() / temperature, dim=-1)
    for i, d in enumerate(drafts):
        p = p_nV[i]
        q_d = float(proposal.probs[i, d]) if proposal.probs is not None else 1.0
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        if u * q_d < float(p[d]):  # u < p/q without dividing (q_d > 0: d was drawn from q)
            continue
        if proposal.probs is not None:
            residual = (p - proposal.probs[i].double()).clamp(min=0)
        else:
            residual = p.clone()
            residual[d] = 0.0
        total = float(residual.sum())
        # Zero only when p == q up to rounding, where a rejection has probability ~0.
        residual = residual / total if total > 0 else p
        return i, int(torch.multinomial(residual, 1, generator=generator))
    return n, int(torch.multinomial(p_nV[n], 1, generator=generator))


def _top2_margin(logits_V: torch.Tensor) -> float:
    top = logits_V.topk(2).values
    return float(top[0] - top[1])


def generate(
    target: Target,
    method: DraftMethod | None,
    prompt: Sequence[int],
    *,
    max_new_tokens: int,
    draft_tokens: int = 3,
    temperature: float | None = None,
    generator: torch.Generator | None = None,
    stop_ids: Collection[int] = (),
) -> Generation:
    """Generate up to `max_new_tokens` after `prompt`, with `method` drafting `draft_tokens`
    per verification, or by plain decoding (one target step per token) when `method` is None.

    Stops after a token of `stop_ids` (kept in the output). `temperature` None is greedy.
    """
    if not prompt:
        raise ValueError("empty prompt")
    dev = target.device
    clock = time.perf_counter
    t_start = clock()
    session = target.session(capture=method is not None and method.needs_aux)
    logits, aux = session.forward(prompt, last_only=True)
    first = _choose(logits[-1], temperature, generator)
    gen = Generation(tokens=[first])
    if method is None and temperature is None:
        gen.margins.append(_top2_margin(logits[-1]))
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
            last = _choose(logits[-1], temperature, generator)
            if temperature is None:
                gen.margins.append(_top2_margin(logits[-1]))
            _sync(dev)
            gen.target_seconds += clock() - t0
            gen.target_calls += 1
            gen.tokens.append(last)
            continue
        t0 = clock()
        proposal = drafts.propose(draft_tokens, temperature, generator)
        _sync(dev)
        t1 = clock()
        before = session.length
        logits, aux = session.forward([last, *proposal.tokens])
        a, nxt = verify(logits, proposal, temperature, generator)
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
