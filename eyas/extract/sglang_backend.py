"""SGLang backend (GPU hosts): the target prefilled by SGLang's offline engine, its states
captured as tensors by a forward hook.

SGLang pins its own torch and transformers, so it lives in its own environment on the GPU
host (eyas's ``sglang`` extra, which pins ``sglang==0.5.23``, installed there by
`eyas.remote.ship` from this checkout: eyas is not on a package index), never in the
control plane's. This module imports SGLang only when the engine starts (an ImportError or
another SGLang version becomes an EyasError that says what to install where).

How the engine is used (read from SGLang 0.5.23's sources; the version is pinned because the
capture flags, the hook interface and the logits processor's call shape are internal and
change between releases):

- ``--enable-return-aux-hidden-states`` with ``--speculative-algorithm EAGLE3`` turns on the
  model class's EAGLE-3 aux capture on the target *without* a draft model (the algorithm only
  names the capture convention and SGLang resets it). ``--return-aux-hidden-state-layer-ids``
  gets the eyas layers translated for the model family (`eyas.layers.to_sglang_ids`:
  DeepSeek/Kimi add 1 only when the first id is 1, Llama always). SGLang cannot capture the
  last decoder layer (nothing follows it), so ``L - 1`` is refused here.
- ``--forward-hooks`` attaches `eyas.extract.sglang_hook.capture_hook` to the model's
  ``logits_processor``, which receives every token's aux states, the final-norm hidden state
  and the LM head. The hook computes the top-K teacher on the GPU (gathered over the
  tensor-parallel ranks), and TP rank 0 writes each request's rows as safetensors into a
  spool folder keyed by request id (`eyas.extract.sglang_spool`). Nothing crosses SGLang's
  processes as Python lists: requests carry no ``return_hidden_states`` and no logprobs
  (preflight alone asks for one prompt's, to compare: `SGLangBackend.engine_aux_rows`).
  Storage "final" works too (the hook sees the post-norm state).
- Requests: one ``Engine.generate`` call per length-sorted batch, token ids in, one new token
  (``max_new_tokens=1``, greedy; the prefill is the work, the token is discarded), request
  ids ``eyas-<uuid>`` so that the hook knows eyas's requests. After the call returns, eyas
  waits for the spool files of the batch, checks that the hook saw the record's tokens, builds
  the samples exactly as the HF backend does and deletes the files -- while the engine already
  runs the next batch's call (`SGLangBackend.extract`, ``overlap``: one call at a time, the
  same shards byte for byte; ``benchmarks/extract_overlap.py`` measures the gain).
- Each ``Engine.generate`` call runs in a daemon thread and is given ``engine_timeout_s``
  (``extract.engine_timeout_s``): a call that has not returned by then (a rank stuck in a
  collective, an NCCL P2P hang) raises `EngineTimeout`, which ends the engine job (not only
  the shard, even with ``--keep-going``); closing the backend then shuts the engine down,
  which kills its scheduler processes, and the blocked thread dies with the job. The capture
  hook's own failures never hang the engine: its ranks stop together
  (`eyas.extract.sglang_hook`).
- ``language_model_only`` is passed exactly for the architectures SGLang accepts it for
  (`eyas.sglang_args.runs_language_model_only`: SGLang's own
  ``LANGUAGE_MODEL_ONLY_ARCHITECTURES``; any other model makes ``handle_language_model_only``
  refuse to start). Kimi-K2.5's folder (``KimiK25ForConditionalGeneration``) is not among
  them in 0.5.23: SGLang runs the multimodal wrapper whole, vision tower and image processor
  (built from the folder's own code) loaded, and calls the language model through
  ``general_mm_embed_routine`` with ``input_ids=None`` in every case (with or without the
  flag); the hook reads the token ids from ``forward_batch.input_ids``.
- Radix cache off (a cached prefix would skip rows), CUDA graphs off (hooks do not run inside
  a replayed graph), chunked prefill off by default (one forward per prompt; chunks are
  assembled too, `chunked_prefill_size`).

STATUS: the hook and the collector are tested without a GPU against stand-in tensors shaped
as SGLang 0.5.23's logits processor receives them (including a real two-process gloo
tensor-parallel gather), and the engine flags against SGLang's own argument parser. The
engine itself has NOT run on a GPU in this project yet (``scripts/gpu_check.sh sglang``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eyas.errors import ConfigError, EyasError
from eyas.extract.hf_backend import BatchResult, _nonfinite_reason, plan_batches
from eyas.extract.sglang_hook import HOOK_FACTORY, TARGET_MODULES
from eyas.extract.sglang_spool import RID_PREFIX, remove_request, wait_for_requests
from eyas.layers import check_sglang_capturable
from eyas.proc import pid_alive
from eyas.sglang_args import check_engine_args, runs_language_model_only
from eyas.sglang_version import SGLANG_VERSION, check_sglang_version  # noqa: F401

STORAGES = ("final", "topk", "compact", None)
INSTALL_HINT = (
    f"install it in its own environment on a GPU host: `ship(host, extras=['sglang'], "
    f"venv=...)` (eyas.remote.ship) from the control machine, or `pip install "
    f"'<eyas checkout>[sglang]'` there (sglang=={SGLANG_VERSION}; it pins its own torch, so "
    f"never into the control plane's environment), or use extract.backend: hf"
)
SPOOL_PREFIX = "eyas-spool-"


@dataclass
class _Call:
    """One ``Engine.generate`` call in flight: its batch, request ids, start time, thread and
    result box (``out`` or ``error``)."""

    records: list[dict[str, Any]]
    rids: list[str]
    started: float
    thread: Any = None
    box: dict[str, Any] = field(default_factory=dict)
    timed_out: bool = False


class EngineTimeout(EyasError):
    """An ``Engine.generate`` call did not return within ``extract.engine_timeout_s``."""


class NoHiddenStates(EyasError):
    """A request with ``return_hidden_states`` got none back, or rows of another width."""


@dataclass(frozen=True)
class SGLangPlan:
    """Engine keyword arguments (``sglang.Engine(**server_args)`` / ``ServerArgs(**...)``),
    the layer ids given to SGLang and the per-request sampling parameters."""

    server_args: dict[str, Any]
    sglang_layer_ids: list[int]
    sampling_params: dict[str, Any] = field(default_factory=lambda: {"max_new_tokens": 1,
                                                                      "temperature": 0.0})

    def cli_args(self) -> list[str]:
        """The same settings as ``python -m sglang.launch_server`` flags (lists as several
        values after one flag, as SGLang's parser takes them; ``forward_hooks`` and mappings
        as JSON)."""
        out: list[str] = []
        for key, value in self.server_args.items():
            flag = "--" + key.replace("_", "-")
            if key == "forward_hooks" or isinstance(value, dict):
                out.extend([flag, json.dumps(value)])
            elif value is True:
                out.append(flag)
            elif value is False or value is None:
                continue
            elif isinstance(value, (list, tuple)):
                out.extend([flag, *(str(v) for v in value)])
            else:
                out.extend([flag, str(value)])
        return out


def hook_spec(spool_dir: Path, *, storage: str | None, topk: int, dtype: str) -> dict[str, Any]:
    """The ``--forward-hooks`` entry that attaches eyas's capture hook to the logits processor."""
    return {"name": "eyas-capture", "target_modules": list(TARGET_MODULES),
            "hook_factory": HOOK_FACTORY,
            "config": {"spool_dir": str(spool_dir), "storage": storage, "topk": topk,
                       "dtype": dtype, "num_aux": 3}}


def build_sglang_plan(
    model_dir: Path,
    *,
    aux_layers: Sequence[int],
    num_layers: int,
    architecture: str | None,
    spool_dir: Path,
    storage: str | None = "topk",
    topk: int = 32,
    dtype: str = "bfloat16",
    tp_size: int = 1,
    context_length: int | None = None,
    mem_fraction_static: float = 0.85,
    trust_remote_code: bool = False,
    max_running_requests: int | None = None,
    chunked_prefill_size: int = -1,
    engine_args: dict[str, Any] | None = None,
) -> SGLangPlan:
    """The SGLang engine settings for extracting `aux_layers` (eyas numbering) of a target of
    `num_layers` layers and HF class `architecture` into `spool_dir`.

    `dtype` is the hook's storage dtype only: the engine computes in the model's own dtype
    (SGLang's ``dtype`` "auto") unless `engine_args` names one. `engine_args`
    (``extract.engine_args``) are added last and replace the defaults here
    (`mem_fraction_static`, `chunked_prefill_size`, ...); the capture's own arguments cannot be
    given there (`eyas.sglang_args.check_engine_args`).

    Raises ConfigError when SGLang cannot capture those layers (`check_sglang_capturable`) or
    for an engine argument that SGLang 0.5.23 does not have or that eyas sets itself.
    See the module docstring for what each flag does.
    """
    ids = check_sglang_capturable(aux_layers, num_layers, architecture)
    extra = check_engine_args(engine_args or {})
    args: dict[str, Any] = {
        "model_path": str(model_dir),
        "tp_size": tp_size,
        # no "dtype": the storage dtype is the hook's; the engine runs the model's own
        "mem_fraction_static": mem_fraction_static,
        "trust_remote_code": trust_remote_code,
        "skip_tokenizer_init": True,  # we send token ids, never text
        "enable_return_aux_hidden_states": True,
        "speculative_algorithm": "EAGLE3",  # names the capture convention only; no draft
        "return_aux_hidden_state_layer_ids": ids,
        "forward_hooks": [hook_spec(spool_dir, storage=storage, topk=topk, dtype=dtype)],
        "chunked_prefill_size": chunked_prefill_size,
        "disable_radix_cache": True,  # a cached prefix would skip its rows
        "disable_prefill_cuda_graph": True,  # hooks do not run inside a replayed graph
        "disable_decode_cuda_graph": True,  # graphs serve decoding, which extraction never does
    }
    if runs_language_model_only(architecture):
        args["language_model_only"] = True
    if context_length is not None:
        args["context_length"] = context_length
    if max_running_requests is not None:
        args["max_running_requests"] = max_running_requests
    args.update(extra)
    return SGLangPlan(server_args=args, sglang_layer_ids=ids)


def sglang_available() -> bool:
    """True when SGLang imports in this environment."""
    try:
        import sglang  # noqa: F401
    except ImportError:
        return False
    return True


def import_sglang() -> Any:
    """The ``sglang`` module, or EyasError saying how to install it (and where) or that its
    version is not the pinned one."""
    try:
        import sglang
    except ImportError as exc:
        raise EyasError(f"the SGLang backend needs SGLang, which does not import here "
                        f"({exc}); {INSTALL_HINT}") from exc
    check_sglang_version(getattr(sglang, "__version__", "unknown"))
    return sglang


def new_rids(n: int) -> list[str]:
    """Fresh request ids the capture hook recognises as eyas's own."""
    return [f"{RID_PREFIX}{uuid.uuid4().hex}" for _ in range(n)]


def request_kwargs(records: Sequence[dict[str, Any]], rids: Sequence[str],
                   plan: SGLangPlan) -> dict[str, Any]:
    """Keyword arguments of one ``Engine.generate`` call: token ids in, one request per record,
    in order, named `rids`; nothing returned but one token (the hook has the states)."""
    return {
        "input_ids": [list(r["input_ids"]) for r in records],
        "sampling_params": [dict(plan.sampling_params) for _ in records],
        "rid": list(rids),
    }


def returned_aux_rows(output: dict[str, Any], *, width: int) -> torch.Tensor:
    """SGLang's own aux rows of one request made with ``return_hidden_states=True``, as
    float32 [n, `width`].

    SGLang 0.5.23 (``BatchResultProcessor._append_prefill_hidden_states``, then
    ``TokenizerManager`` -> ``meta_info["hidden_states"]``): with aux capture on, the logits
    processor stores ``pack_aux_hidden_states`` of the forward's aux states, [N, 3H] in the
    engine's dtype; each request's prefill appends its rows as nested lists of Python floats
    (``.cpu().tolist()``), so ``meta_info["hidden_states"][0]`` is ``[n][3H]``. n is every
    prompt token without chunked prefill, only the last chunk's tokens with it (middle chunks
    are not stored); decode steps would append one row each (never here: one new token).

    Raises NoHiddenStates when the output has no hidden states (engine started without
    ``enable_return_hidden_states``?) or rows of another width.
    """
    states = (output.get("meta_info") or {}).get("hidden_states")
    if not states:
        raise NoHiddenStates("SGLang returned no hidden states for a request with "
                        "return_hidden_states=True (engine started without "
                        "enable_return_hidden_states?)")
    first = states[0]
    rows = torch.tensor(first if first and isinstance(first[0], list) else [first],
                        dtype=torch.float32)
    if rows.ndim != 2 or rows.shape[1] != width:
        raise NoHiddenStates(f"SGLang returned hidden states of shape {tuple(rows.shape)}, expected "
                        f"rows of {width} (3 aux layers x hidden size): aux capture off?")
    return rows


def sample_from_spool(record: dict[str, Any], tensors: dict[str, torch.Tensor], *,
                      storage: str | None, hidden_size: int, topk: int) -> dict[str, Any]:
    """One request's collected tensors -> ``{"sample": ...}`` as the HF backend builds it, or
    ``{"quarantined": {"id", "reason"}}`` for NaN/inf states.

    Raises EyasError when the tensors do not have the storage's names and widths (names the
    sample, what was found and what was expected).
    """
    sid = str(record["id"])
    t = len(record["input_ids"])
    want = {"aux_fp8": (t, 3 * hidden_size), "aux_scale": (t, 3)} if storage == "compact" \
        else {"aux_hidden": (t, 3 * hidden_size)}
    if storage == "final":
        want["final_hidden"] = (t, hidden_size)
    elif storage in ("topk", "compact"):
        want.update(topk_ids=(t, topk), topk_logprobs=(t, topk))
    got = {k: tuple(v.shape) for k, v in tensors.items() if k != "input_ids"}
    if got != want:
        raise EyasError(f"sample {sid}: the capture hook wrote {got}, expected {want} (storage "
                        f"{storage!r}, hidden size {hidden_size}, K {topk}; engine started with "
                        f"other settings?)")
    sample: dict[str, Any] = {"id": sid, "input_ids": list(record["input_ids"]),
                              "loss_mask": list(record["loss_mask"])}
    # "compact": a NaN/inf row has a non-finite scale (its max magnitude), so the float8
    # values need no scan of their own
    checks = [(name, tensors[name]) for name in
              ("aux_hidden", "aux_scale", "final_hidden", "topk_logprobs") if name in tensors]
    for name, value in checks:
        # one float32 sum is finite when every value is (hidden states are far from
        # overflowing it); only a non-finite sum pays for the row-by-row report
        if torch.isfinite(value.sum(dtype=torch.float32)):
            continue
        bad = _nonfinite_reason(value, name)
        if bad:
            return {"quarantined": {"id": sid, "reason": bad}}
    sample.update({k: v for k, v in tensors.items() if k != "input_ids"})
    return {"sample": sample}


def clean_stale_spools(root: Path) -> list[Path]:
    """Delete spool folders under `root` left by processes that no longer run; returns them."""
    removed = []
    root = Path(root)
    if not root.is_dir():
        return removed
    for path in sorted(root.glob(f"{SPOOL_PREFIX}*")):
        m = re.fullmatch(rf"{SPOOL_PREFIX}(\d+)-[0-9a-f]+", path.name)
        if m and path.is_dir() and not pid_alive(int(m.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


class SGLangBackend:
    """Runs the target in SGLang's offline engine; same interface as `HFBackend`.

    `storage` is "final", "topk", "compact" or None (aux states only). `spool_root` is the
    folder that receives the hook's files (a spool folder of this process is made inside it
    and removed by `close()`; leftovers of dead processes are removed at start); None = the
    system's temporary folder. `engine_args` (``extract.engine_args``) adds or replaces engine
    arguments (e.g. ``attention_backend``; see `build_sglang_plan`). `dtype` is the storage
    dtype; the engine computes in the model's own. The engine starts on the first batch and
    stops with `close()` (or ``with``). Raises ConfigError at construction when SGLang cannot
    capture the layers or for an engine argument it does not have or that eyas sets.
    `engine_timeout_s` bounds each engine call (`EngineTimeout`). `overlap` (default) reads
    and checks batch k while the engine runs batch k+1 (`extract`); False runs them one after
    the other (same shards, byte for byte).
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
        spool_root: Path | None = None,
        chunked_prefill_size: int = -1,
        collect_timeout_s: float = 600.0,
        engine_args: dict[str, Any] | None = None,
        engine_timeout_s: float = 1800.0,
        overlap: bool = True,
    ) -> None:
        from eyas.extract.target import target_shape

        if storage not in STORAGES:
            raise ConfigError(f"unknown storage {storage!r}", where="extract.storage")
        shape = target_shape(Path(model_dir))
        self.aux_layers = list(aux_layers)
        self.hidden_size = shape.hidden_size
        self.storage, self.topk, self.dtype = storage, topk, dtype
        import tempfile

        self.spool_root = Path(spool_root) if spool_root is not None else Path(tempfile.gettempdir())
        self.spool = self.spool_root / f"{SPOOL_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.collect_timeout_s = collect_timeout_s
        self.engine_timeout_s = engine_timeout_s
        self.overlap = overlap
        self.plan = build_sglang_plan(
            Path(model_dir), aux_layers=self.aux_layers, num_layers=shape.num_layers,
            architecture=shape.architecture, spool_dir=self.spool, storage=storage, topk=topk,
            dtype=dtype, tp_size=tp_size, context_length=context_length,
            mem_fraction_static=mem_fraction_static, trust_remote_code=trust_remote_code,
            chunked_prefill_size=chunked_prefill_size, engine_args=engine_args,
        )
        self._engine: Any = None

    def _start(self) -> Any:
        if self._engine is None:
            sglang = import_sglang()
            clean_stale_spools(self.spool_root)
            self.spool.mkdir(parents=True, exist_ok=True)
            self._engine = sglang.Engine(**self.plan.server_args)
        return self._engine

    def run_batch(self, records: Sequence[dict[str, Any]]) -> BatchResult:
        """Extract one batch (records with ``id``, ``input_ids``, ``loss_mask``): one engine
        call, then the spool files of its requests, in the batch's order."""
        call = self._submit(records)
        return self._collect(call, self._wait(call))

    def _submit(self, records: Sequence[dict[str, Any]]) -> _Call:
        """Start the engine call of one batch (the engine started first if need be); returns
        at once."""
        engine = self._start()
        rids = new_rids(len(records))
        return self._start_call(engine, request_kwargs(records, rids, self.plan), records, rids)

    def _collect(self, call: _Call, outputs: Any) -> BatchResult:
        """The batch of a finished `call`: SGLang's answers checked, then the hook's spool files
        read, checked and converted (`sample_from_spool`), in the batch's order, and deleted."""
        records, rids = call.records, call.rids
        if isinstance(outputs, dict):
            outputs = [outputs]
        try:
            if len(outputs) != len(records):
                raise EyasError(f"SGLang returned {len(outputs)} results for {len(records)} "
                                f"requests")
            for record, output in zip(records, outputs, strict=True):
                reason = (output.get("meta_info") or {}).get("finish_reason") or {}
                if isinstance(reason, dict) and reason.get("type") == "abort":
                    raise EyasError(f"sample {record['id']}: SGLang aborted the request "
                                    f"({reason.get('message', 'no message')})")
            collected = wait_for_requests(
                self.spool, {rid: r["input_ids"] for rid, r in zip(rids, records, strict=True)},
                timeout_s=self.collect_timeout_s)
            result = BatchResult()
            for rid, record in zip(rids, records, strict=True):
                converted = sample_from_spool(record, collected[rid], storage=self.storage,
                                              hidden_size=self.hidden_size, topk=self.topk)
                if "sample" in converted:
                    result.samples.append(converted["sample"])
                else:
                    result.quarantined.append(converted["quarantined"])
        finally:
            for rid in rids:
                remove_request(self.spool, rid)
        return result

    def engine_aux_rows(self, input_ids: Sequence[int]) -> torch.Tensor:
        """SGLang's own aux rows for one prompt (`returned_aux_rows`): the engine (started here
        if need be) prefills `input_ids` once more with ``return_hidden_states=True``, which
        needs an engine started with ``enable_return_hidden_states`` (preflight's only). The
        request id is not eyas's (``RID_PREFIX``), so the capture hook writes nothing for it."""
        engine = self._start()
        kwargs = {"input_ids": [list(input_ids)],
                  "sampling_params": [dict(self.plan.sampling_params)],
                  "rid": [f"preflight-{uuid.uuid4().hex}"], "return_hidden_states": True}
        outputs = self._generate(engine, kwargs)
        output = outputs[0] if isinstance(outputs, list) else outputs
        return returned_aux_rows(output, width=3 * self.hidden_size)

    def memory_usage(self) -> dict[str, Any] | None:
        """The started engine's memory as SGLang reports it (``Engine.get_server_info()``,
        ``internal_states[0]["memory_usage"]``: ``weight``, ``kvcache``, ``startup_available``
        in GB, ``token_capacity``; rank 0's GPU, measured when the scheduler started), or None
        when the engine is not started or does not say."""
        if self._engine is None:
            return None
        try:
            states = self._engine.get_server_info().get("internal_states") or [{}]
        except Exception:  # noqa: BLE001 - a figure, never a failure
            return None
        memory = states[0].get("memory_usage") if isinstance(states[0], dict) else None
        return memory if isinstance(memory, dict) else None

    def _generate(self, engine: Any, kwargs: dict[str, Any]) -> Any:
        """``engine.generate(**kwargs)``, waited for `engine_timeout_s` (`_wait`)."""
        return self._wait(self._start_call(engine, kwargs, (), kwargs.get("rid") or []))

    def _start_call(self, engine: Any, kwargs: dict[str, Any], records: Sequence[dict[str, Any]],
                    rids: Sequence[str]) -> _Call:
        """``engine.generate(**kwargs)`` in a daemon thread, started now; one call at a time
        (`Engine.generate` runs its own event loop: never two at once)."""
        import threading

        call = _Call(list(records), list(rids), time.monotonic())

        def run() -> None:
            try:
                call.box["out"] = engine.generate(**kwargs)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                call.box["error"] = exc

        call.thread = threading.Thread(target=run, name="eyas-sglang-generate", daemon=True)
        call.thread.start()
        return call

    def _wait(self, call: _Call) -> Any:
        """The answer of `call`; EngineTimeout when it has not returned `engine_timeout_s`
        after it started (the caller's ``close()`` shuts the engine down; the thread dies with
        the process); the call's own error re-raised."""
        call.thread.join(max(0.0, call.started + self.engine_timeout_s - time.monotonic()))
        if call.thread.is_alive():
            call.timed_out = True
            raise EngineTimeout(
                f"SGLang's engine did not answer a batch of {len(call.rids)} requests within "
                f"{self.engine_timeout_s:.0f} s (extract.engine_timeout_s): a tensor-parallel "
                f"rank is probably stuck in a collective (NCCL; on RTX PRO 6000 hosts try "
                f"NCCL_P2P_DISABLE=1) or the engine died; the engine job stops here and the "
                f"engine is shut down. Spool: {self.spool}")
        if "error" in call.box:
            raise call.box["error"]
        return call.box["out"]

    def extract(self, records: Sequence[dict[str, Any]], batch_tokens: int) -> Iterator[BatchResult]:
        """Run `records` in length-sorted batches (`plan_batches`), yielding each batch.

        With `overlap` (the default) the engine call of batch k+1 starts as soon as batch k's
        has returned, and batch k is then read from the spool, checked and handed to the
        caller (who accumulates it into the shard) while the engine prefills k+1: the GPUs do
        not wait on the disk. The engine still runs one call at a time, the batches come in
        the same order with the same contents (the shard is byte-identical to the sequential
        path, `overlap=False`), each call keeps its `engine_timeout_s` from its own start, and
        the spool holds at most two batches. When a batch fails (or the caller stops
        iterating) with a call in flight, that call is waited for and its files deleted
        before the error goes on, so the next shard never finds the engine busy."""
        batches = [[records[i] for i in b]
                   for b in plan_batches([len(r["input_ids"]) for r in records], batch_tokens)]
        if not self.overlap:
            for batch in batches:
                yield self.run_batch(batch)
            return
        pending: _Call | None = None
        try:
            for batch in batches:
                if pending is None:
                    pending = self._submit(batch)
                    continue
                outputs = self._wait(pending)
                done, pending = pending, None
                pending = self._submit(batch)  # the engine works on k+1 ...
                yield self._collect(done, outputs)  # ... while k is read and checked
            if pending is not None:
                done, pending = pending, None
                yield self._collect(done, self._wait(done))
        finally:
            if pending is not None and not pending.timed_out:
                try:
                    self._wait(pending)
                except EngineTimeout:
                    raise
                except Exception:  # noqa: BLE001 - the error already on its way says what failed
                    pass
                finally:
                    for rid in pending.rids:
                        remove_request(self.spool, rid)

    def close(self) -> None:
        """Shut the engine down (frees the GPUs) and remove the spool; safe to call twice."""
        if self._engine is not None:
            engine, self._engine = self._engine, None
            engine.shutdown()
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.spool)

    def __enter__(self) -> SGLangBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
