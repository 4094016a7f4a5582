"""Is a greedy divergence rounding or real? Ask the target in float32.

A drafted greedy output that leaves the target's own greedy output at some position is either
an error (a cache cut at the wrong length, a wrong position, a mask) or the arithmetic of a
low-precision target: the verification reads k + 1 tokens in one forward, plain decoding one
token a step, the sums run in other orders, and in bfloat16 the 30 layers of a small model can
carry that difference past one rounding step of the logits. `speculate.is_near_tie` catches
the divergences whose top-2 logits were within one rounding step; this module settles the
others.

For a divergence after ``prefix`` where the target's own output took token ``r`` and the
drafted one took ``d``: the prefix's next-token logits are computed once by a float32 copy of
the target (L32) and once by the target as it runs (L, its dtype), each in one forward over
the whole prefix. The deviation of the low-precision path at the two tokens,
``|L[r] - L32[r]| + |L[d] - L32[d]|``, plus one rounding step of the logits, bounds how far
rounding moved their difference; a float32 margin ``|L32[r] - L32[d]|`` within it is
**rounding** (the two tokens are that close in exact arithmetic), beyond it the divergence is
**real**. The deviation is measured on one summation order, not on the two that diverged:
an estimate of the noise, made where it is measured, not a proof — and an underestimate where
the diverging paths read a long low-precision KV cache built a few tokens at a time (SmolLM2 in
bfloat16: two divergences of margin 0.29 and 0.20 against an estimate of 0.17, both with top-2
logits two rounding steps apart).

So a divergence the estimate does not settle is **replayed** (`Arbiter.replay`): the prompt is
decoded again on the float32 copy, by plain decoding and by the drafting method, through the
divergent position. If the two agree there, the method is lossless on this prompt in float32
and the low-precision divergence was arithmetic (rounding); if they still part, the difference
is real unless the float32 target's own top-2 logits are a near tie there. A bug in the
verification (a cache cut at the wrong length, a wrong position) does not depend on the dtype
and shows in the replay as well. The replay's drafts can differ from the low-precision run's
where the drafter reads the target's hidden states (an EAGLE drafter: float32 states), so a
bug that needs one exact pattern of accepts may not recur; prompt lookup drafts from the
tokens alone and repeats its pattern exactly.

The float32 copy costs the target's parameters at 4 bytes each on its device; it is built only
when there is a divergence to settle and skipped, saying why, when it does not fit in half the
memory available there.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from eyas.evaluate.speculate import Generation, first_difference, is_near_tie, rounding_step


def available_bytes(device: torch.device) -> int | None:
    """Free memory on `device` (CUDA: the driver's figure; CPU: ``MemAvailable`` of
    /proc/meminfo), or None where it cannot be read."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def float32_bytes(model: torch.nn.Module) -> int:
    """The parameters and buffers of `model` at 4 bytes each (tied weights counted once)."""
    seen = {id(t): t.numel() for t in [*model.parameters(), *model.buffers()]}
    return 4 * sum(seen.values())


@torch.inference_mode()
def _last_logits(model: torch.nn.Module, ids: Sequence[int], device: torch.device) -> torch.Tensor:
    out = model(input_ids=torch.tensor([list(ids)], dtype=torch.long, device=device),
                use_cache=False)
    return out.logits[0, -1].float().cpu()


class Arbiter:
    """Settles greedy divergences of one target (module docstring). Build it with the model as
    the evaluation ran it; the float32 copy is made at the first `settle`."""

    def __init__(self, model: torch.nn.Module, *, log: Callable[[str], None] = lambda _: None):
        self.model = model
        self.device = model.get_input_embeddings().weight.device
        self.dtype = model.get_input_embeddings().weight.dtype
        self.log = log
        self._model32: torch.nn.Module | None = None
        self.skipped: str | None = None
        """Why nothing was settled (the copy would not fit), or None."""

    @property
    def needed(self) -> bool:
        """Only a target running below float32 has rounding to tell apart."""
        return self.dtype != torch.float32

    def _copy(self) -> torch.nn.Module | None:
        if self._model32 is None and self.skipped is None:
            need = float32_bytes(self.model)
            free = available_bytes(self.device)
            if free is not None and need > free // 2:
                self.skipped = (f"a float32 copy of the target needs {need / 2**30:.1f} GiB, more "
                                f"than half of the {free / 2**30:.1f} GiB free on {self.device}")
                self.log(f"lossless check: divergences not settled in float32: {self.skipped}")
                return None
            self.log(f"lossless check: a float32 copy of the target ({need / 2**30:.2f} GiB) "
                     "settles the divergences that are not near ties")
            self._model32 = copy.deepcopy(self.model).float().eval()
        return self._model32

    def settle(self, prefix: Sequence[int], reference: int, drafted: int) -> dict[str, Any] | None:
        """The float32 verdict on a divergence after `prefix` (prompt and the tokens both
        outputs share): the target's own output took `reference`, the drafted one `drafted`.
        None when the float32 copy does not fit (`skipped` says why)."""
        model32 = self._copy()
        if model32 is None:
            return None
        exact = _last_logits(model32, prefix, self.device)
        low = _last_logits(self.model, prefix, self.device)
        margin = float(exact[reference] - exact[drafted])
        deviation = float((low[reference] - exact[reference]).abs()
                          + (low[drafted] - exact[drafted]).abs())
        step = rounding_step(max(abs(float(low[reference])), abs(float(low[drafted]))), self.dtype)
        tolerance = deviation + step
        top = int(exact.argmax())
        return {"margin": margin, "deviation": deviation, "rounding_step": step,
                "tolerance": tolerance, "rounding": abs(margin) <= tolerance,
                "top1": ("reference" if top == reference else
                         "drafted" if top == drafted else "another token")}

    def replay(self, position: int,
               decode: Callable[[torch.nn.Module, bool], Generation]) -> dict[str, Any] | None:
        """Both decodings again on the float32 copy (module docstring), compared through
        `position`: ``decode(model32, drafted)`` is the `Generation` of plain decoding
        (`drafted` False) or of the drafting method (True), as long as the evaluation decoded
        (so the method's verifications fall as they fell). ``equal`` when they agree through
        `position` (``rounding`` true); otherwise ``first_difference``, the float32 target's
        top-2 ``margin`` and ``rounding_step`` there, and ``rounding`` only at a float32 near
        tie. None when the float32 copy does not fit (`skipped` says why)."""
        model32 = self._copy()
        if model32 is None:
            return None
        n = position + 1
        own = decode(model32, False)  # its margins: recorded by plain greedy decoding
        j = first_difference(own.tokens[:n], decode(model32, True).tokens[:n])
        if j is None:
            return {"equal": True, "tokens": n, "rounding": True}
        margin, step = own.tie_at(j)
        return {"equal": False, "tokens": n, "first_difference": j, "margin": margin,
                "rounding_step": step, "rounding": is_near_tie(margin, step)}
