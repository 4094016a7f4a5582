"""SGLang backend (GPU hosts): the target prefilled by SGLang's offline engine.

SGLang pins its own torch and transformers, so it lives in its own environment on the GPU
host (``pip install 'eyas[sglang]'`` there), never in the control plane's. This module
imports SGLang only inside `SGLangBackend` (an ImportError becomes an EyasError that says
what to install where).

How the engine is used (read from SGLang 0.5.23's sources; eyas requires that version or
later because the capture-only flag below is recent):

- ``--enable-return-aux-hidden-states`` with ``--speculative-algorithm EAGLE3`` turns on the
  model class's EAGLE-3 aux capture on the target *without* a draft model (the algorithm
  only names the capture convention and SGLang resets it). ``--return-aux-hidden-state-layer-ids``
  takes the layers in eyas numbering (output of layer i; SGLang adds 1 internally). SGLang
  cannot capture the last decoder layer (nothing follows it), so ``L - 1`` is refused here.
- A request with ``return_hidden_states=True`` then gets, in ``meta_info["hidden_states"]``,
  the three aux states concatenated in layer order, one row of ``3H`` floats per prompt
  token (a nested Python list: one entry per prefill forward, plus one row per decode step).
  Chunked prefill is switched off so that one forward covers the whole prompt.
- The post-norm final state is *not* in the response when aux capture is on (SGLang keeps
  it for in-process consumers only). So storage "final" is not offered by this backend. The
  teacher for "topk"/"compact" comes from SGLang's own logprobs instead: with
  ``return_logprob=True, logprob_start_len=0, top_logprobs_num=K``, ``input_top_logprobs[t]``
  holds the top-K of the distribution computed at position ``t - 1`` (entry 0 is None) and
  ``output_top_logprobs[0]`` that of the last prompt position. Greedy sampling
  (temperature 0) makes them plain ``log_softmax`` of the logits, as the HF backend computes.
- Each request asks for one new token (``max_new_tokens=1``): the prefill is the work, the
  token is discarded. Radix cache and CUDA graphs serve reuse and decoding, which
  extraction never does; they are off.

STATUS: argument building and the conversion of SGLang's response structures into eyas
samples are tested here without a GPU (the conversion against stand-in responses shaped as
the SGLang source builds them). Starting the real engine is written but has NOT run on a GPU
in this project yet (test ``test_engine_aux_equals_hf_backend`` is marked ``gpu``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eyas.errors import ConfigError, EyasError
from eyas.extract.hf_backend import BatchResult, _nonfinite_reason, plan_batches
from eyas.extract.store import DTYPES, quantize_aux
from eyas.layers import to_sglang_ids, validate_layers

MIN_SGLANG_VERSION = "0.5.23"
TEACHER_STORAGES = ("topk", "compact")
INSTALL_HINT = (
    f"install it in its own environment on a GPU host: `pip install 'eyas[sglang]'` "
    f"(SGLang >= {MIN_SGLANG_VERSION}; it pins its own torch, so never into the control "
    f"plane's environment), or use extract.backend: hf"
)


@dataclass(frozen=True)
class SGLangPlan:
    """Engine keyword arguments (``sglang.Engine(**server_args)`` / ``ServerArgs(**...)``),
    the aux layer ids they capture (SGLang numbering = eyas numbering) and the per-request
    sampling parameters."""

    server_args: dict[str, Any]
    eagle3_layer_ids: list[int]
    sampling_params: dict[str, Any] = field(default_factory=lambda: {"max_new_tokens": 1,
                                                                      "temperature": 0.0})

    def cli_args(self) -> list[str]:
        """The same settings as ``python -m sglang.launch_server`` flags (lists as several
        values after one flag, as SGLang's parser takes them)."""
        out: list[str] = []
        for key, value in self.server_args.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                out.append(flag)
            elif value is False or value is None:
                continue
            elif isinstance(value, (list, tuple)):
                out.extend([flag, *(str(v) for v in value)])
            else:
                out.extend([flag, str(value)])
        return out


def build_sglang_plan(
    model_dir: Path,
    *,
    aux_layers: list[int],
    tp_size: int = 1,
    context_length: int | None = None,
    mem_fraction_static: float = 0.85,
    dtype: str = "bfloat16",
    trust_remote_code: bool = False,
    max_running_requests: int | None = None,
) -> SGLangPlan:
    """The SGLang engine settings for extracting `aux_layers` (eyas numbering) from a target.

    See the module docstring for what each capture flag does.
    """
    ids = to_sglang_ids(aux_layers)
    args: dict[str, Any] = {
        "model_path": str(model_dir),
        "tp_size": tp_size,
        "dtype": dtype,
        "mem_fraction_static": mem_fraction_static,
        "trust_remote_code": trust_remote_code,
        "skip_tokenizer_init": True,  # we send token ids, never text
        "enable_return_hidden_states": True,
        "enable_return_aux_hidden_states": True,
        "speculative_algorithm": "EAGLE3",  # names the capture convention only; no draft
        "return_aux_hidden_state_layer_ids": ids,
        "chunked_prefill_size": -1,  # one forward per prompt: every row comes back at once
        "disable_radix_cache": True,  # every sample is prefilled once; nothing to reuse
        "disable_prefill_cuda_graph": True,
        "disable_decode_cuda_graph": True,  # graphs serve decoding, which extraction never does
    }
    if context_length is not None:
        args["context_length"] = context_length
    if max_running_requests is not None:
        args["max_running_requests"] = max_running_requests
    return SGLangPlan(server_args=args, eagle3_layer_ids=ids)


def sglang_available() -> bool:
    """True when SGLang imports in this environment."""
    try:
        import sglang  # noqa: F401
    except ImportError:
        return False
    return True


def import_sglang() -> Any:
    """The ``sglang`` module, or EyasError saying how to install it (and where)."""
    try:
        import sglang
    except ImportError as exc:
        raise EyasError(f"the SGLang backend needs SGLang, which does not import here "
                        f"({exc}); {INSTALL_HINT}") from exc
    return sglang


def check_sglang_layers(aux_layers: Sequence[int], num_layers: int) -> list[int]:
    """`validate_layers`, plus SGLang's limit: the last decoder layer cannot be captured
    (SGLang captures a layer's output as the next layer's input). Raises ConfigError."""
    ids = validate_layers(list(aux_layers), num_layers)
    if ids[-1] >= num_layers - 1:
        raise ConfigError(
            f"layer {ids[-1]} is the last of {num_layers} decoder layers; SGLang captures the "
            f"output of layer i at the input of layer i + 1, so it can capture 0..{num_layers - 2} "
            f"only (use the hf backend for the last layer's output)",
            where="extract.aux_layers",
        )
    return ids


def request_kwargs(records: Sequence[dict[str, Any]], plan: SGLangPlan, storage: str | None,
                   topk: int) -> dict[str, Any]:
    """Keyword arguments of one ``Engine.generate`` call for `records` (token ids in, one
    request per record, in order)."""
    kwargs: dict[str, Any] = {
        "input_ids": [list(r["input_ids"]) for r in records],
        "sampling_params": [dict(plan.sampling_params) for _ in records],
        "return_hidden_states": True,
    }
    if storage in TEACHER_STORAGES:
        kwargs.update(return_logprob=True, logprob_start_len=0, top_logprobs_num=topk)
    return kwargs


def _hidden_rows(hidden: Any, record_id: str) -> list[list[float]]:
    """Flatten ``meta_info["hidden_states"]``: prefill entries are lists of rows, decode
    entries single rows."""
    if not isinstance(hidden, list) or not hidden:
        raise EyasError(f"sample {record_id}: SGLang returned no hidden states (is the engine "
                        f"started with enable_return_hidden_states?)")
    rows: list[list[float]] = []
    for entry in hidden:
        if entry and isinstance(entry[0], list):
            rows.extend(entry)
        else:
            rows.append(entry)
    return rows


def _teacher(meta: dict[str, Any], t: int, topk: int, record_id: str) -> tuple[list, list]:
    """Top-K (ids, logprobs) per position, re-aligned so that row t is the distribution
    computed at position t (the prediction of token t + 1), as the HF backend stores it."""
    inputs, outputs = meta.get("input_top_logprobs"), meta.get("output_top_logprobs")
    if not isinstance(inputs, list) or len(inputs) != t or not outputs:
        got = len(inputs) if isinstance(inputs, list) else inputs
        raise EyasError(f"sample {record_id}: expected {t} input_top_logprobs entries (the first "
                        f"None) and one output_top_logprobs entry, got {got} and "
                        f"{len(outputs) if outputs else outputs} (logprob_start_len must be 0)")
    per_position = [*inputs[1:], outputs[0]]
    ids, logps = [], []
    for pos, entries in enumerate(per_position):
        if not entries or len(entries) < topk:
            raise EyasError(f"sample {record_id}: position {pos} has "
                            f"{len(entries) if entries else 0} top logprobs, expected {topk}")
        logps.append([float(e[0]) for e in entries[:topk]])
        ids.append([int(e[1]) for e in entries[:topk]])
    return ids, logps


def convert_output(record: dict[str, Any], output: dict[str, Any], *, storage: str | None,
                   topk: int, hidden_size: int, dtype: str = "bfloat16") -> dict[str, Any]:
    """One SGLang ``generate`` result -> the sample the HF backend would produce.

    Returns ``{"sample": {...}}`` or ``{"quarantined": {"id", "reason"}}`` (NaN/inf in the aux
    states or the teacher). The sample has ``id``, ``input_ids``, ``loss_mask`` and
    ``aux_hidden`` [T, 3H] in `dtype` (for "compact" ``aux_fp8`` + ``aux_scale`` instead),
    plus ``topk_ids`` [T, K] int32 / ``topk_logprobs`` [T, K] float16 for "topk"/"compact".
    Raises EyasError when the response is not shaped as expected (names the sample and what
    differs: too few rows, rows of H instead of 3H, missing logprobs).
    """
    sid = str(record["id"])
    t = len(record["input_ids"])
    meta = output.get("meta_info", {})
    rows = _hidden_rows(meta.get("hidden_states"), sid)
    if len(rows) < t:
        raise EyasError(f"sample {sid}: SGLang returned {len(rows)} hidden-state rows for "
                        f"{t} prompt tokens (chunked prefill on? it must be -1)")
    width = len(rows[0])
    if width != 3 * hidden_size:
        raise EyasError(f"sample {sid}: hidden-state rows have {width} values, expected "
                        f"3 x {hidden_size} (aux capture off? the engine needs "
                        f"enable_return_aux_hidden_states and speculative_algorithm EAGLE3)")
    aux_TX = torch.tensor(rows[:t], dtype=torch.float32)
    sample: dict[str, Any] = {"id": sid, "input_ids": list(record["input_ids"]),
                              "loss_mask": list(record["loss_mask"])}
    bad = _nonfinite_reason(aux_TX, "aux_hidden")
    if storage in TEACHER_STORAGES and not bad:
        ids, logps = _teacher(meta, t, topk, sid)
        logp_TK = torch.tensor(logps, dtype=torch.float32)
        bad = _nonfinite_reason(logp_TK, "topk_logprobs")
        sample["topk_ids"] = torch.tensor(ids, dtype=torch.int32)
        sample["topk_logprobs"] = logp_TK.to(torch.float16)
    if bad:
        return {"quarantined": {"id": sid, "reason": bad}}
    if storage == "compact":
        sample["aux_fp8"], sample["aux_scale"] = quantize_aux(aux_TX.to(torch.bfloat16))
    else:
        sample["aux_hidden"] = aux_TX.to(DTYPES[dtype])
    return {"sample": sample}


class SGLangBackend:
    """Runs the target in SGLang's offline engine; same interface as `HFBackend`.

    `storage` is "topk", "compact" or None (aux states only); "final" raises ConfigError
    (SGLang does not return the post-norm state with aux capture on; see the module
    docstring). The engine starts on the first batch and stops with `close()` (or ``with``).
    """

    def __init__(
        self,
        model_dir: Path,
        *,
        aux_layers: Sequence[int],
        storage: str | None = "topk",
        topk: int = 32,
        dtype: str = "bfloat16",
        tp_size: int = 1,
        context_length: int | None = None,
        mem_fraction_static: float = 0.85,
        trust_remote_code: bool = False,
    ) -> None:
        from eyas.extract.target import target_shape

        if storage == "final":
            raise ConfigError(
                "storage 'final' needs the target's post-norm last hidden state, which SGLang's "
                "engine does not return while it captures aux states; use storage 'topk' or "
                "'compact' (teacher from SGLang's own top-K logprobs) or extract.backend: hf",
                where="extract.storage",
            )
        shape = target_shape(Path(model_dir))
        self.aux_layers = check_sglang_layers(aux_layers, shape.num_layers)
        self.hidden_size = shape.hidden_size
        self.storage, self.topk, self.dtype = storage, topk, dtype
        self.plan = build_sglang_plan(
            Path(model_dir), aux_layers=self.aux_layers, tp_size=tp_size,
            context_length=context_length, mem_fraction_static=mem_fraction_static,
            trust_remote_code=trust_remote_code,
        )
        self._engine: Any = None

    def _start(self) -> Any:
        if self._engine is None:
            sglang = import_sglang()
            self._engine = sglang.Engine(**self.plan.server_args)
        return self._engine

    def run_batch(self, records: Sequence[dict[str, Any]]) -> BatchResult:
        """Extract one batch (records with ``id``, ``input_ids``, ``loss_mask``): one engine
        call, results converted by `convert_output`, in the batch's order."""
        engine = self._start()
        outputs = engine.generate(**request_kwargs(records, self.plan, self.storage, self.topk))
        if isinstance(outputs, dict):
            outputs = [outputs]
        if len(outputs) != len(records):
            raise EyasError(f"SGLang returned {len(outputs)} results for {len(records)} requests")
        result = BatchResult()
        for record, output in zip(records, outputs, strict=True):
            converted = convert_output(record, output, storage=self.storage, topk=self.topk,
                                       hidden_size=self.hidden_size, dtype=self.dtype)
            if "sample" in converted:
                result.samples.append(converted["sample"])
            else:
                result.quarantined.append(converted["quarantined"])
        return result

    def extract(self, records: Sequence[dict[str, Any]], batch_tokens: int) -> Iterator[BatchResult]:
        """Run `records` in length-sorted batches (`plan_batches`), yielding each batch."""
        for batch in plan_batches([len(r["input_ids"]) for r in records], batch_tokens):
            yield self.run_batch([records[i] for i in batch])

    def close(self) -> None:
        """Shut the engine down (frees the GPUs); safe to call twice."""
        if self._engine is not None:
            engine, self._engine = self._engine, None
            engine.shutdown()

    def __enter__(self) -> SGLangBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
