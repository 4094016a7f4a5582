"""Stand-ins for what SGLang 0.5.23 hands eyas's capture hook, for machines without SGLang.

SGLang cannot run here (no GPU; it pins its own torch). These objects are shaped exactly as
SGLang's source passes them to ``LogitsProcessor.forward`` (read from ``srt/models/llama.py``,
``srt/models/deepseek_v2.py``, ``srt/layers/logits_processor.py``,
``srt/layers/vocab_parallel_embedding.py``, ``srt/model_executor/forward_batch_info.py``):

- the call: ``logits_processor(input_ids, hidden_states, lm_head, forward_batch,
  aux_hidden_states)``, all positional, through ``nn.Module.__call__`` so that a hook
  registered with ``register_forward_hook`` (what SGLang's hook manager does) fires;
  by default as Kimi-K2.5's wrapper makes it (``KimiK25ForConditionalGeneration`` ->
  ``general_mm_embed_routine`` calls the language model with ``input_ids=None``, which
  ``DeepseekV2ForCausalLM.forward`` passes on): ``input_ids`` None, the ids in
  ``forward_batch.input_ids``; ``wrapper=False`` passes them positionally (Llama, flat DeepSeek);
- ``input_ids`` [N] and ``hidden_states`` [N, H] (after the final norm) of all requests of a
  forward, concatenated; ``aux_hidden_states`` one packed [N, 3H] tensor (DeepSeek's
  ``AuxHiddenStatePacker``) or a list of three [N, H] (Llama's ``AuxHiddenStateList``);
- ``forward_batch``: ``forward_mode`` (``is_extend()``, ``is_target_verify()``), ``rids``,
  ``extend_seq_lens_cpu``, ``extend_prefix_lens_cpu``, ``input_ids`` (always set, as SGLang's
  ``ForwardBatch.init_new`` sets it);
- ``lm_head``: ``weight`` [rows, H] of this rank's vocabulary shard (padded), ``tp_size``,
  ``shard_indices.org_vocab_start_index`` / ``org_vocab_end_index``.

The states themselves come from a real HF forward of the same target, so what the hook and
the collector produce can be compared with the HF backend's own output.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch

from eyas.layers import hf_hidden_states_index


class StandInMode(enum.Enum):
    """``ForwardMode`` members the hook distinguishes."""

    EXTEND = 1
    DECODE = 2
    TARGET_VERIFY = 5

    def is_extend(self) -> bool:
        return self in (StandInMode.EXTEND, StandInMode.TARGET_VERIFY)

    def is_target_verify(self) -> bool:
        return self is StandInMode.TARGET_VERIFY


@dataclass
class StandInForwardBatch:
    """The ``ForwardBatch`` fields the hook reads."""

    rids: list[str]
    extend_seq_lens_cpu: list[int]
    extend_prefix_lens_cpu: list[int]
    forward_mode: StandInMode = StandInMode.EXTEND
    input_ids: torch.Tensor | None = None


class StandInLMHead(torch.nn.Module):
    """``ParallelLMHead`` of one tensor-parallel rank: its rows of the head, padded."""

    def __init__(self, weight_VH: torch.Tensor, rank: int = 0, world: int = 1, pad_to: int = 8):
        super().__init__()
        vocab = weight_VH.shape[0]
        padded = -(-vocab // (pad_to * world)) * pad_to * world
        per_rank = padded // world
        start = rank * per_rank
        end = min(start + per_rank, vocab)
        rows = torch.zeros(per_rank, weight_VH.shape[1], dtype=weight_VH.dtype)
        if end > start:
            rows[: end - start] = weight_VH[start:end]
        rows[max(end - start, 0):] = 7.0  # padding rows: large logits that must never win
        self.weight = torch.nn.Parameter(rows, requires_grad=False)
        self.tp_size = world
        self.shard_indices = SimpleNamespace(org_vocab_start_index=min(start, vocab),
                                             org_vocab_end_index=max(end, min(start, vocab)))


class StandInLogitsProcessor(torch.nn.Module):
    """``LogitsProcessor``: only its call signature and the attributes the hook reads."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.logit_scale = None
        self.final_logit_softcapping = None

    def forward(self, input_ids, hidden_states, lm_head, forward_batch, aux_hidden_states=None):
        return None


@torch.no_grad()
def hf_states(model, ids: list[int], aux_layers: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(aux [T, 3H], final [T, H]) of one sequence from an HF forward (float32)."""
    out = model.model(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    aux = torch.cat([out.hidden_states[hf_hidden_states_index(i)][0] for i in aux_layers], -1)
    return aux, out.last_hidden_state[0]


def forward_args(states: dict[str, tuple[torch.Tensor, torch.Tensor]],
                 tokens: dict[str, list[int]], pieces: list[tuple[str, int, int]],
                 lm_head: torch.nn.Module, *, packed: bool = True,
                 mode: StandInMode = StandInMode.EXTEND, wrapper: bool = True) -> tuple:
    """The positional arguments of one forward holding rows ``[start, stop)`` of each
    ``(rid, start, stop)`` in `pieces` (several requests; a later chunk has start > 0);
    `wrapper`: ``input_ids`` None and the ids in ``forward_batch.input_ids``, as Kimi-K2.5's
    multimodal wrapper calls the logits processor."""
    ids, aux, final = [], [], []
    for rid, a, b in pieces:
        ids.append(torch.tensor(tokens[rid][a:b]))
        aux.append(states[rid][0][a:b])
        final.append(states[rid][1][a:b])
    aux_NX = torch.cat(aux)
    h = aux_NX.shape[-1] // 3
    aux_arg = aux_NX if packed else [aux_NX[:, i * h:(i + 1) * h].clone() for i in range(3)]
    batch = StandInForwardBatch(rids=[p[0] for p in pieces],
                                extend_seq_lens_cpu=[b - a for _, a, b in pieces],
                                extend_prefix_lens_cpu=[a for _, a, _ in pieces], forward_mode=mode,
                                input_ids=torch.cat(ids))
    return None if wrapper else batch.input_ids, torch.cat(final), lm_head, batch, aux_arg


@dataclass
class StandInEngine:
    """``sglang.Engine`` for the backend: ``generate(input_ids, sampling_params, rid)`` runs
    the HF model, then calls the logits processor (whose forward hook is eyas's capture hook)
    once per forward, as SGLang's scheduler would: requests packed up to `max_prefill_tokens`
    rows per forward, each prompt split in `chunk` rows when `chunk` is set."""

    model: object
    aux_layers: list[int]
    processor: StandInLogitsProcessor
    lm_head: torch.nn.Module
    packed: bool = True
    wrapper: bool = True
    chunk: int | None = None
    max_prefill_tokens: int = 64
    calls: list = field(default_factory=list)
    shut: bool = False
    server_args: dict = field(default_factory=lambda: {"enable_return_aux_hidden_states": True})
    returned_layers: list[int] | None = None
    """Layers of SGLang's own ``return_hidden_states`` rows (None: `aux_layers`, what it hands
    the logits processor, as SGLang 0.5.23 does); others stand in for a capture that differs."""
    hook: object | None = None
    """The capture hook, flushed before `generate` returns (SGLang's forward writes before the
    request completes; the stand-in hook's writer is a thread)."""

    def generate(self, *, input_ids, sampling_params, rid, return_hidden_states=False):
        assert all(p["max_new_tokens"] == 1 for p in sampling_params)
        if return_hidden_states and not (self.server_args.get("enable_return_hidden_states")
                                         or self.server_args.get("return_hidden_states_mode")
                                         or self.server_args.get(
                                             "enable_return_aux_hidden_states")):
            # SGLang's TokenizerManager refuses it so (aux capture sets the mode "full")
            raise ValueError("The server is not configured to return hidden states. Please "
                             "set `--return-hidden-states-mode last`, ...")
        tokens = dict(zip(rid, input_ids, strict=True))
        states = {r: hf_states(self.model, ids, self.aux_layers) for r, ids in tokens.items()}
        pieces = []
        for r, ids in tokens.items():
            step = self.chunk or len(ids)
            pieces += [(r, a, min(a + step, len(ids))) for a in range(0, len(ids), step)]
        forward: list = []
        for piece in pieces:
            rows = sum(b - a for _, a, b in forward)
            if forward and rows + piece[2] - piece[1] > self.max_prefill_tokens:
                self._forward(states, tokens, forward)
                forward = []
            forward.append(piece)
        if forward:
            self._forward(states, tokens, forward)
        if self.hook is not None:
            self.hook.flush()
        out = [{"output_ids": [0], "meta_info": {"id": r, "finish_reason": {"type": "length"}}}
               for r in rid]
        if return_hidden_states:
            for o, r in zip(out, rid, strict=True):
                o["meta_info"]["hidden_states"] = self._returned_rows(tokens[r], states[r][0])
        return out

    def _returned_rows(self, ids, aux):
        """``meta_info["hidden_states"]`` of one prefill as SGLang 0.5.23 returns it
        (``_append_prefill_hidden_states``): one entry, the packed aux rows [n][3H] as Python
        floats, n the last chunk's tokens (middle chunks are not stored)."""
        if self.returned_layers is not None:
            aux = hf_states(self.model, ids, self.returned_layers)[0]
        last = (len(ids) - 1) // self.chunk * self.chunk if self.chunk else 0
        return [aux[last:].tolist()]

    def get_server_info(self):
        """``Engine.get_server_info()``: the memory figures of ``internal_states[0]`` (SGLang
        0.5.23's ``build_memory_usage``; GB, rank 0)."""
        return {"version": "0.5.23", "internal_states": [{"memory_usage": {
            "weight": 0.004, "kvcache": 0.5, "startup_available": 12.25,
            "token_capacity": 65536, "token_capacity_swa": None, "graph": {}}}]}

    def _forward(self, states, tokens, pieces):
        self.calls.append(list(pieces))
        self.processor(*forward_args(states, tokens, pieces, self.lm_head, packed=self.packed,
                                     wrapper=self.wrapper))

    def shutdown(self):
        self.shut = True
        if self.hook is not None:
            self.hook.close()


def stand_in_sglang(model, *, returned_shift: int = 0, **engine_kw) -> SimpleNamespace:
    """A stand-in ``sglang`` module for `SGLangBackend` (``import_sglang``): ``Engine(**args)``
    runs `model` (the HF target of ``args["model_path"]``), hands its logits processor the
    aux states of the layers SGLang applies from ``return_aux_hidden_state_layer_ids``, with
    eyas's capture hook attached from ``forward_hooks`` (as SGLang's hook manager does);
    `returned_shift` moves the layers of its own ``return_hidden_states`` rows by that much.
    ``engines`` lists the engines made."""
    from eyas.extract.sglang_hook import CaptureHook
    from eyas.layers import from_sglang_ids

    engines: list = []

    def engine(**args):
        layers = from_sglang_ids(args["return_aux_hidden_state_layer_ids"])
        processor = StandInLogitsProcessor(model.lm_head.weight.shape[0])
        hook = CaptureHook(args["forward_hooks"][0]["config"])
        processor.register_forward_hook(hook)
        made = StandInEngine(model, layers, processor, StandInLMHead(model.lm_head.weight),
                             server_args=dict(args), hook=hook,
                             returned_layers=[i + returned_shift for i in layers]
                             if returned_shift else None, **engine_kw)
        engines.append(made)
        return made

    return SimpleNamespace(Engine=engine, engines=engines, __version__="0.5.23")


# -- two-process tensor parallelism over gloo (importable, so that spawn can start it) ----------
def tp_worker(rank: int, world: int, port: int, spool: str, weight_path: str, args_path: str,
              topk: int) -> None:
    """One tensor-parallel rank: its head shard, the same forward as every rank, eyas's hook
    gathering over a real gloo process group; rank 0 writes to `spool`. The forward is called
    as Kimi-K2.5's wrapper calls it (``input_ids`` None, the ids in the forward batch)."""
    import torch.distributed as dist

    from eyas.extract.sglang_hook import CaptureHook, torch_any_failed, torch_gather

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        weight = torch.load(weight_path, weights_only=True)
        saved = torch.load(args_path, weights_only=False)  # written by the test itself
        head = StandInLMHead(weight, rank=rank, world=world)
        processor = StandInLogitsProcessor(weight.shape[0])
        hook = CaptureHook({"spool_dir": spool, "storage": "topk", "topk": topk,
                            "dtype": "bfloat16"}, rank=rank,
                           gather=torch_gather(dist.group.WORLD, world),
                           any_failed=torch_any_failed(dist.group.WORLD))
        processor.register_forward_hook(hook)
        batch = StandInForwardBatch(**saved["batch"], input_ids=saved["input_ids"])
        processor(None, saved["hidden"], head, batch, saved["aux"])
        hook.close()
        assert not hook.failed, Path(spool, f"HOOK_ERROR.rank{rank}").read_text()
    finally:
        dist.destroy_process_group()


FAILURES = ("spool-full", "teacher-oom")
"""How `tp_failing_worker`'s failing rank fails: its spool writes raise "No space left on
device" (rank 0's writer thread), or one chunk of its teacher raises an out-of-memory error
(in the middle of the gathers)."""


def tp_failing_worker(rank: int, world: int, port: int, spool: str, weight_path: str,
                      args_path: str, topk: int, fail_rank: int, failure: str, forwards: int,
                      gloo_timeout_s: float, result_dir: str) -> None:
    """One rank of `world` running `forwards` prefill forwards (the same on every rank) where
    rank `fail_rank` fails as `failure` says during the first; writes what its hook ended as
    to ``<result_dir>/rank<r>.json``. A rank left waiting in a collective would raise after
    `gloo_timeout_s` (gloo's own timeout), caught by the hook and written as its error."""
    import datetime
    import json
    import time

    import torch.distributed as dist

    from eyas.extract import sglang_hook
    from eyas.extract.sglang_hook import CaptureHook, torch_any_failed, torch_gather

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=gloo_timeout_s))
    try:
        torch.set_num_threads(1)
        sglang_hook.LOGIT_CHUNK_ROWS = 4  # several gathers per forward
        if rank == fail_rank and failure == "spool-full":
            def full(*_a, **_k):
                raise OSError(28, "No space left on device")
            sglang_hook.write_chunk = full
        elif rank == fail_rank and failure == "teacher-oom":
            real, calls = sglang_hook.local_topk, []

            def oom(*a, **k):
                calls.append(1)
                if len(calls) == 2:
                    raise torch.OutOfMemoryError("CUDA out of memory (stand-in)")
                return real(*a, **k)
            sglang_hook.local_topk = oom
        weight = torch.load(weight_path, weights_only=True)
        saved = torch.load(args_path, weights_only=False)  # written by the test itself
        head = StandInLMHead(weight, rank=rank, world=world)
        processor = StandInLogitsProcessor(weight.shape[0])
        hook = CaptureHook({"spool_dir": spool, "storage": "topk", "topk": topk,
                            "dtype": "bfloat16"}, rank=rank,
                           gather=torch_gather(dist.group.WORLD, world),
                           any_failed=torch_any_failed(dist.group.WORLD))
        processor.register_forward_hook(hook)
        quiet_after = None
        t0 = time.monotonic()
        for i in range(forwards):
            batch = StandInForwardBatch(**saved["batch"], input_ids=saved["input_ids"])
            processor(None, saved["hidden"], head, batch, saved["aux"])
            hook.flush()  # the writer thread's failure is in before the next forward
            quiet = getattr(hook, "quiet", hook.failed)  # (a hook without `quiet`: failed)
            if quiet and quiet_after is None:
                quiet_after = i
        hook.close()
        Path(result_dir, f"rank{rank}.json").write_text(json.dumps(
            {"quiet": quiet, "failed": hook.failed, "quiet_after": quiet_after,
             "seconds": time.monotonic() - t0}))
        # No rank tears gloo down while another still reads from it (a peer gone mid-collective
        # aborts gloo's reader: SIGABRT, seen once under load).
        dist.barrier()
    finally:
        dist.destroy_process_group()
