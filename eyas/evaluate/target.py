"""The target as speculative decoding uses it: a KV cache that grows and is cut back, and the
three auxiliary hidden states of every position it reads.

One `TargetSession` per generated sequence (batch size 1). ``forward(ids)`` reads new tokens
on top of the cache and returns their next-token logits [n, V] and their auxiliary states
[n, 3·H] (the outputs of the decoder layers ``aux_layers``, eyas numbering, concatenated in
that order: what extraction stores and the drafter's ``fc`` reads). ``crop(length)`` forgets
everything past `length` tokens: the rejected drafts of a verification.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from eyas.errors import ConfigError
from eyas.extract.hf_backend import decoder_layers
from eyas.layers import validate_layers

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``"auto"``: bfloat16 on GPU, float32 on CPU (where bf16 matmuls are slow)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {name!r}; expected one of {sorted(DTYPES)}",
                          where="evaluate.dtype")
    return DTYPES[name]


def load_target(model_dir: Path, device: torch.device, dtype: torch.dtype,
                *, trust_remote_code: bool = False) -> torch.nn.Module:
    """The target causal LM from a local folder (flat, or the text model of a multimodal
    wrapper such as Kimi-K2.5's: `eyas.hf_target.load_causal_lm`), in `dtype`, on `device`,
    in eval mode."""
    from eyas.hf_target import load_causal_lm

    model = load_causal_lm(Path(model_dir), dtype=dtype, trust_remote_code=trust_remote_code)
    return model.to(device).eval()


def _cache_argument(model: torch.nn.Module) -> str:
    # transformers 5 renamed `past_key_values` to `cache` in later minor versions.
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class Target:
    """A loaded target and the decoder layers whose outputs are the auxiliary states.

    Raises ConfigError when an auxiliary layer does not exist in the target.
    """

    def __init__(self, model: torch.nn.Module, aux_layers: Sequence[int]) -> None:
        self.model = model
        _, self.layers = decoder_layers(model)
        self.aux_layers = validate_layers(list(aux_layers), len(self.layers),
                                          where="drafter aux layers")
        self.device = model.get_input_embeddings().weight.device
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self._cache_kw = _cache_argument(model)
        self._keep_kw = "logits_to_keep" in inspect.signature(model.forward).parameters

    def session(self, *, capture: bool = True) -> TargetSession:
        """A fresh sequence; `capture` False skips the auxiliary states (plain decoding)."""
        return TargetSession(self, capture=capture)


class TargetSession:
    """One sequence's KV cache on a `Target` (see the module docstring)."""

    def __init__(self, target: Target, *, capture: bool) -> None:
        from transformers import DynamicCache

        self.target = target
        self.capture = capture
        self.cache = DynamicCache()
        self.length = 0
        self._captured: dict[int, torch.Tensor] = {}

    def _hook(self, layer_id: int):
        def hook(_module: Any, _args: Any, output: Any) -> None:
            self._captured[layer_id] = output[0] if isinstance(output, tuple) else output

        return hook

    @torch.inference_mode()
    def forward(self, ids: Sequence[int], *, last_only: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Read `ids` after the cached tokens: logits [n, V] (float32; [1, V] of the last
        token with `last_only`, which spares a long prompt's [n, V]) and, when capturing,
        auxiliary states [n, 3·H] (the target's dtype), both on the target's device."""
        t = self.target
        ids_1T = torch.tensor([list(ids)], dtype=torch.long, device=t.device)
        handles = ([t.layers[i].register_forward_hook(self._hook(i)) for i in t.aux_layers]
                   if self.capture else [])
        kw = {t._cache_kw: self.cache}
        if last_only and t._keep_kw:
            kw["logits_to_keep"] = 1
        try:
            out = t.model(input_ids=ids_1T, use_cache=True, **kw)
        finally:
            for h in handles:
                h.remove()
        self.length += len(ids)
        aux = None
        if self.capture:
            aux = torch.cat([self._captured[i][0].to(t.device) for i in t.aux_layers], dim=-1)
            self._captured.clear()
        logits = out.logits[0, -1:] if last_only else out.logits[0]
        return logits.float(), aux

    def crop(self, length: int) -> None:
        """Forget the cached tokens past the first `length`."""
        drop = self.length - length
        if drop < 0:
            raise ValueError(f"cannot crop a {self.length}-token cache to {length} tokens")
        if drop:
            # A negative argument removes that many tokens in every transformers version.
            self.cache.crop(-drop)
            self.length = length
