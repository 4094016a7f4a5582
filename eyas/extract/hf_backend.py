"""Hugging Face transformers backend: the target's auxiliary states and teacher, CPU or GPU.

How it works:
- forward hooks on the three auxiliary decoder layers keep only those layers' outputs
  (``output_hidden_states`` would keep every layer's, L x [B, T, H]);
- the base model (``model.model``) runs, not the CausalLM head: storage "final" stores its
  last hidden state (after the final norm), storages "topk" and "compact" apply the LM head
  themselves, a few hundred rows at a time, so the [B, T, V] logits tensor never exists
  whole; "compact" also quantises the aux states to float8 on the device (per token and
  layer scales, `eyas.extract.store.quantize_aux`), so only a byte per value crosses to the CPU;
- early stop: with no teacher signal (``storage=None``, aux states only) the forward is cut
  right after the last auxiliary layer. Both stored formats need the full stack -- "final"
  needs the final norm's output and "topk" the head on top of it -- so for them every layer
  runs; the cut saves ``(L - 1 - max(aux)) / L`` of the work only in aux-only mode (used by
  the benchmark and by setups whose teacher comes from elsewhere);
- batches by length: samples sorted longest first, packed while ``count x longest`` stays
  within ``batch_tokens``, right-padded with an attention mask (with causal attention, right
  padding leaves every real position's states unchanged);
- states leave the device in the storage dtype (bf16 by default); a sample whose states hold
  NaN or inf is returned as quarantined with a reason, not as a result.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eyas.devices import resolve_device
from eyas.errors import ConfigError
from eyas.extract.store import DTYPES, quantize_aux
from eyas.layers import validate_layers

LOGIT_CHUNK_ROWS = 512


class _StopForward(Exception):
    """Raised by the last auxiliary layer's hook to cut the forward pass short."""


def plan_batches(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Group sample indices into batches of similar length.

    Sorted longest first (ties by index, so the plan is deterministic); a batch grows while
    ``len(batch) * longest <= batch_tokens``. A sample longer than `batch_tokens` gets a
    batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]
        if current and (len(current) + 1) * longest > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


@dataclass
class BatchResult:
    """Per-sample outputs of one batch, in the batch's sample order."""

    samples: list[dict[str, Any]] = field(default_factory=list)
    quarantined: list[dict[str, str]] = field(default_factory=list)


def pad_batch(records: Sequence[dict[str, Any]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` [B, T] and attention mask [B, T] (1 on real tokens), on the CPU."""
    longest = max(len(r["input_ids"]) for r in records)
    ids_BT = torch.full((len(records), longest), pad_id, dtype=torch.long)
    mask_BT = torch.zeros((len(records), longest), dtype=torch.long)
    for b, r in enumerate(records):
        n = len(r["input_ids"])
        ids_BT[b, :n] = torch.as_tensor(r["input_ids"], dtype=torch.long)
        mask_BT[b, :n] = 1
    return ids_BT, mask_BT


def decoder_layers(model: torch.nn.Module) -> tuple[torch.nn.Module, Sequence[torch.nn.Module]]:
    """The base (decoder-stack) model and its list of decoder layers.

    Covers Llama-style models (``model.model.layers``) and the common alternatives; raises
    ConfigError naming the model class otherwise.
    """
    base = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ConfigError(
            f"{type(model).__name__}: cannot find the decoder layers (expected model.model.layers)",
            where="target.model",
        )
    return base, layers


class HFBackend:
    """Runs a transformers causal LM and returns aux states plus the chosen teacher signal.

    `storage` is "final", "topk", "compact" or None (aux states only, with the early stop). The model
    runs in `compute_dtype` (default bf16 on GPU, float32 on CPU, where bf16 matmuls are
    slow) and results are returned in `dtype`. Pass `model` to reuse a loaded model.
    """

    def __init__(
        self,
        model_dir: Path | None,
        *,
        aux_layers: Sequence[int],
        storage: str | None = "final",
        topk: int = 32,
        dtype: str = "bfloat16",
        device: str = "auto",
        compute_dtype: torch.dtype | None = None,
        trust_remote_code: bool = False,
        model: torch.nn.Module | None = None,
    ) -> None:
        self.device = resolve_device(device)
        if compute_dtype is None:
            compute_dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        if model is None:
            from eyas.hf_target import load_causal_lm  # flat, or Kimi-K2.5's wrapper

            model = load_causal_lm(model_dir, dtype=compute_dtype,
                                   trust_remote_code=trust_remote_code)
        self.model = model.to(self.device).eval()
        self.base, self.layers = decoder_layers(self.model)
        self.aux_layers = validate_layers(list(aux_layers), len(self.layers))
        self.storage = storage
        self.topk = topk
        self.dtype = DTYPES[dtype]
        self.hidden_size = int(self.model.config.get_text_config().hidden_size)
        self.pad_id = 0
        self._captured: dict[int, torch.Tensor] = {}
        self._handles: list[Any] = []

    # -- hooks ---------------------------------------------------------------------------
    def _hook(self, layer_id: int, last: bool):
        def hook(_module, _args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            self._captured[layer_id] = hidden
            if last:
                raise _StopForward

        return hook

    def _install(self) -> None:
        cut = self.storage is None
        for i in self.aux_layers:
            last = cut and i == self.aux_layers[-1]
            self._handles.append(self.layers[i].register_forward_hook(self._hook(i, last)))

    def _remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._captured.clear()

    # -- forward -------------------------------------------------------------------------
    @torch.inference_mode()
    def run_batch(self, records: Sequence[dict[str, Any]]) -> BatchResult:
        """Extract one batch. Each record has ``id``, ``input_ids`` and ``loss_mask``.

        Returns one result per non-quarantined record (``id``, ``input_ids``, ``loss_mask``,
        ``aux_hidden`` [T, 3H] -- for "compact" ``aux_fp8`` [T, 3H] + ``aux_scale`` [T, 3]
        instead -- and ``final_hidden`` [T, H] or ``topk_ids`` / ``topk_logprobs`` [T, K]) on
        the CPU, plus ``{"id", "reason"}`` for each quarantined
        record.
        """
        lengths = [len(r["input_ids"]) for r in records]
        ids_BT, mask_BT = pad_batch(records, self.pad_id)
        ids_BT, mask_BT = ids_BT.to(self.device), mask_BT.to(self.device)
        self._install()
        try:
            final_BTH = None
            try:
                out = self.base(input_ids=ids_BT, attention_mask=mask_BT, use_cache=False)
                final_BTH = out.last_hidden_state if self.storage is not None else None
            except _StopForward:
                pass
            aux_BTX = torch.cat([self._captured[i] for i in self.aux_layers], dim=-1)
        finally:
            self._remove()
        result = BatchResult()
        for b, r in enumerate(records):
            t = lengths[b]
            aux_TX = aux_BTX[b, :t]
            sample: dict[str, Any] = {"id": str(r["id"]), "input_ids": list(r["input_ids"]),
                                      "loss_mask": list(r["loss_mask"])}
            bad = _nonfinite_reason(aux_TX, "aux_hidden")
            if final_BTH is not None:
                final_TH = final_BTH[b, :t]
                bad = bad or _nonfinite_reason(final_TH, "final_hidden")
                if not bad and self.storage == "final":
                    sample["final_hidden"] = final_TH.to(self.dtype).cpu()
                elif not bad and self.storage in ("topk", "compact"):
                    ids_TK, logp_TK = self._topk(final_TH)
                    sample["topk_ids"], sample["topk_logprobs"] = ids_TK, logp_TK
            if bad:
                result.quarantined.append({"id": str(r["id"]), "reason": bad})
                continue
            if self.storage == "compact":
                q_TX, scale_TG = quantize_aux(aux_TX)
                sample["aux_fp8"], sample["aux_scale"] = q_TX.cpu(), scale_TG.cpu()
            else:
                sample["aux_hidden"] = aux_TX.to(self.dtype).cpu()
            result.samples.append(sample)
        return result

    def _topk(self, final_TH: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        head = self.model.get_output_embeddings()
        ids, logps = [], []
        for start in range(0, final_TH.shape[0], LOGIT_CHUNK_ROWS):
            logits_CV = head(final_TH[start : start + LOGIT_CHUNK_ROWS]).float()
            logp_CV = torch.log_softmax(logits_CV, dim=-1)
            values, indices = torch.topk(logp_CV, k=min(self.topk, logp_CV.shape[-1]), dim=-1)
            ids.append(indices.to(torch.int32).cpu())
            logps.append(values.to(torch.float16).cpu())
        return torch.cat(ids), torch.cat(logps)

    def extract(self, records: Sequence[dict[str, Any]], batch_tokens: int) -> Iterator[BatchResult]:
        """Run `records` in length-sorted batches (see `plan_batches`), yielding each batch."""
        for batch in plan_batches([len(r["input_ids"]) for r in records], batch_tokens):
            yield self.run_batch([records[i] for i in batch])


def _nonfinite_reason(x: torch.Tensor, name: str) -> str | None:
    if bool(torch.isfinite(x).all()):
        return None
    rows = (~torch.isfinite(x)).any(dim=-1).nonzero().flatten().tolist()
    kinds = "NaN" if bool(torch.isnan(x).any()) else "inf"
    return f"{kinds} in {name} at {len(rows)} position(s), first {rows[:5]}"
