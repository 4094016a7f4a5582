"""The capture hook that runs INSIDE SGLang: tensors to safetensors, no Python lists.

SGLang 0.5.23 attaches forward hooks given by ``--forward-hooks`` (a JSON list of
``{"name", "target_modules", "hook_factory", "config"}``; ``srt/model_executor/hook_manager.py``)
after loading the model, in every tensor-parallel scheduler process. eyas attaches
`capture_hook` to the model's ``logits_processor``. SGLang's DeepSeek-V2/V3 (Kimi-K2.5 through
``kimi_k25.py``) and Llama classes call it positionally as
``logits_processor(input_ids, hidden_states, lm_head, forward_batch, aux_hidden_states)``:

- ``input_ids`` [N]: the tokens of the forward (all requests concatenated). Under Kimi-K2.5's
  multimodal wrapper (``KimiK25ForConditionalGeneration``) this argument is ``None``: the wrapper
  runs ``general_mm_embed_routine`` (``srt/managers/mm_utils.py``), which calls the language
  model with ``input_ids=None`` and embeddings, and ``DeepseekV2ForCausalLM.forward`` hands that
  ``None`` on. The hook then reads the same ids from ``forward_batch.input_ids`` (``ForwardBatch``
  in ``srt/model_executor/forward_batch_info.py``);
- ``hidden_states`` [N, H]: the last decoder layer's output after the final norm, every token
  (what storage "final" stores);
- ``lm_head``: the vocabulary-parallel head (``weight`` [V/tp (+ padding), H] on each rank,
  ``shard_indices`` saying which token ids its rows hold);
- ``forward_batch``: ``forward_mode``, ``rids``, ``extend_seq_lens_cpu`` (rows per request),
  ``extend_prefix_lens_cpu`` (the first row's position in its prompt; >0 for later chunks);
- ``aux_hidden_states``: the captured layers as one packed [N, 3H] tensor (DeepSeek's
  ``AuxHiddenStatePacker``) or a list of three [N, H] (Llama), in layer order.

For every prefill forward the hook computes the teacher on every rank (storage "topk" and
"compact": each rank's top-K over its vocabulary rows plus its log-sum-exp, gathered over
the tensor-parallel group, merged into the global top-K log-probabilities) and TP rank 0
moves the rows to the CPU once and hands them to a writer thread that writes one file per
request (`eyas.extract.sglang_spool`). Requests not named by eyas (``RID_PREFIX``) and
non-prefill forwards are ignored. A failure is written to the spool (``HOOK_ERROR.rank<r>``),
where eyas's collector reports it, and the hook stops capturing; nothing raises inside SGLang.

Ranks fail together, never one alone. With the head split over R ranks, every rank joins the
teacher's all-gathers; a rank that stopped on its own (rank 0's spool disk full, an out-of-memory
while quantising) would skip the next prefill's gathers while the others wait in them: an NCCL
deadlock holding every GPU. So each prefill forward runs the same collectives on every rank, in
the same order, whatever failed where:

1. a failure flag all-reduced (MAX) over the group *before* the teacher: each rank's flag says
   "I failed earlier (also asynchronously, in the writer thread) or this forward's rows do not
   line up here"; when any rank's flag is set, every rank goes quiet together and no gather is
   started;
2. the teacher's gathers: a rank whose own part fails inside them (out of memory in a chunk's
   logits) keeps joining each chunk's gather with placeholder rows, so the others never wait;
3. the flag all-reduced again after the teacher; a failure there stops every rank together.

What rank 0 does after that (CPU copies, quantising, the writer thread) has no collective; a
failure there is seen by every rank at step 1 of the next prefill. A rank that went quiet
because another failed writes ``HOOK_ERROR.rank<r>`` naming that, so the collector raises on
whichever file it reads first. Chosen over "a failed rank keeps computing with dummy data
forever": the flag costs two one-element all-reduces per prefill forward (microseconds against
a prefill of thousands of tokens, plus reading the flag back, a sync at the end of the forward)
and leaves no rank running on after a failure. It relies on every rank seeing the same forwards
(SGLang's scheduler hands each rank the same batch), so all take the same steps. Storage
"final" and aux-only run no collective in the hook: there a failure stays with its rank, and
only rank 0's matters (it alone writes).

Symbols: N tokens of a forward, H hidden size, X = 3H, V vocabulary rows of this rank, K top-k,
R tensor-parallel ranks, C rows of one logits chunk.
"""

from __future__ import annotations

import queue
import threading
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from eyas.extract.sglang_spool import RID_PREFIX, write_chunk, write_error
from eyas.extract.store import DTYPES, quantize_aux

HOOK_FACTORY = "eyas.extract.sglang_hook:capture_hook"
TARGET_MODULES = ["logits_processor", "*.logits_processor"]
"""``logits_processor`` of Llama/DeepSeek classes; ``language_model.logits_processor`` of
Kimi-K2.5's wrapper."""
LOGIT_CHUNK_ROWS = 512
WRITE_QUEUE = 4  # batches waiting for the writer before the forward blocks

Gather = Callable[[torch.Tensor], torch.Tensor]
"""``x`` [...] on every rank -> [R, ...]: every rank's ``x`` in rank order."""
AnyFailed = Callable[[bool, torch.device], bool]
"""``(this rank failed?, device)`` on every rank -> True when any rank's flag is set."""


# -- the teacher over a vocabulary split across ranks --------------------------------------------
def local_topk(hidden_CH: torch.Tensor, weight_VH: torch.Tensor, *, valid_rows: int, first_id: int,
               k: int, logit_scale: float | None = None, softcap: float | None = None,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One rank's part of the teacher: logits over its head rows, their top-K and log-sum-exp.

    `weight_VH` holds token ids ``first_id .. first_id + valid_rows - 1`` in its first
    `valid_rows` rows; later rows are padding and never chosen. Returns (values [C, K] float32,
    global token ids [C, K] int64, log-sum-exp [C] float32); slots past `valid_rows` hold -inf
    and id -1.
    """
    logits_CV = (hidden_CH.to(weight_VH.dtype) @ weight_VH.T).float()
    if logit_scale is not None:
        logits_CV = logits_CV * logit_scale
    if softcap is not None:
        logits_CV = torch.tanh(logits_CV / softcap) * softcap
    logits_CV = logits_CV[:, :valid_rows]
    lse_C = torch.logsumexp(logits_CV, dim=-1)
    kk = min(k, valid_rows)
    values_CK, idx_CK = torch.topk(logits_CV, kk, dim=-1)
    if kk < k:
        pad = k - kk
        values_CK = torch.cat([values_CK, values_CK.new_full((values_CK.shape[0], pad),
                                                             float("-inf"))], -1)
        idx_CK = torch.cat([idx_CK, idx_CK.new_full((idx_CK.shape[0], pad), -1 - first_id)], -1)
    return values_CK, idx_CK + first_id, lse_C


def merge_topk(values_RCK: torch.Tensor, ids_RCK: torch.Tensor, lse_RC: torch.Tensor,
               k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global top-K of the ranks' parts: (ids [C, K] int32, log-probabilities [C, K] float32).

    ``log p = logit - logsumexp_r(lse_r)``: the softmax over the whole vocabulary, exactly as
    if one rank had held all of it.
    """
    r, c, kk = values_RCK.shape
    values_CY = values_RCK.permute(1, 0, 2).reshape(c, r * kk)
    ids_CY = ids_RCK.permute(1, 0, 2).reshape(c, r * kk)
    total_C1 = torch.logsumexp(lse_RC.float(), dim=0).unsqueeze(-1)
    top_CK, pos_CK = torch.topk(values_CY, k, dim=-1)
    return ids_CY.gather(-1, pos_CK).to(torch.int32), top_CK - total_C1


def head_shard(lm_head: Any, vocab_size: int) -> tuple[torch.Tensor, int, int, bool]:
    """(weight [V, H], first token id, valid rows, sharded?) of SGLang's head on this rank.

    Reads ``VocabParallelEmbedding.shard_indices`` (``org_vocab_start_index`` /
    ``org_vocab_end_index``) and ``tp_size``; a head without them holds the whole vocabulary.
    """
    weight = getattr(lm_head, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.is_floating_point():
        raise RuntimeError(f"lm_head {type(lm_head).__name__} has no 2-D floating-point weight "
                           f"(quantised head?); the capture hook needs the plain head")
    indices = getattr(lm_head, "shard_indices", None)
    if indices is None:
        return weight, 0, min(vocab_size, weight.shape[0]), False
    first = int(indices.org_vocab_start_index)
    valid = int(indices.org_vocab_end_index) - first
    return weight, first, valid, int(getattr(lm_head, "tp_size", 1)) > 1


def teacher_topk(hidden_NH: torch.Tensor, lm_head: Any, *, vocab_size: int, k: int,
                 gather: Gather | None, logit_scale: float | None = None,
                 softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-K ids [N, K] int32 and log-probabilities [N, K] float32 of every row, a few hundred
    rows at a time, gathering the ranks' parts when the head is split (every rank must call
    this with the same rows)."""
    weight, first, valid, sharded = head_shard(lm_head, vocab_size)
    if sharded and gather is None:
        raise RuntimeError("the head is split over tensor-parallel ranks but no gather was given")
    ids, logps = [], []
    error: Exception | None = None
    for start in range(0, hidden_NH.shape[0], LOGIT_CHUNK_ROWS):
        hidden_CH = hidden_NH[start : start + LOGIT_CHUNK_ROWS]
        if error is None:
            try:
                values, idx, lse = local_topk(hidden_CH, weight, valid_rows=valid,
                                              first_id=first, k=k, logit_scale=logit_scale,
                                              softcap=softcap)
            except Exception as exc:  # noqa: BLE001 - re-raised once the gathers are done
                if not sharded:
                    raise
                error = exc
        if error is not None:  # keep joining the gathers: the other ranks wait in them
            values, idx, lse = _placeholder(hidden_CH.shape[0], k, hidden_NH.device)
        if sharded:
            values, idx, lse = gather(values), gather(idx), gather(lse)
        else:
            values, idx, lse = values[None], idx[None], lse[None]
        if error is None:
            i, lp = merge_topk(values, idx, lse, k)
            ids.append(i)
            logps.append(lp)
    if error is not None:
        raise error
    return torch.cat(ids), torch.cat(logps)


def _placeholder(rows: int, k: int, device: torch.device,
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A failed rank's part of one chunk's gathers: the shapes and dtypes `local_topk` returns."""
    return (torch.full((rows, k), float("-inf"), device=device),
            torch.full((rows, k), -1, dtype=torch.int64, device=device),
            torch.full((rows,), float("-inf"), device=device))


def torch_gather(group: Any, world_size: int) -> Gather:
    """A `Gather` over a ``torch.distributed`` process group (NCCL in SGLang, gloo in tests)."""
    import torch.distributed as dist

    def gather(x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = [torch.empty_like(x) for _ in range(world_size)]
        dist.all_gather(out, x, group=group)
        return torch.stack(out)

    return gather


def torch_any_failed(group: Any) -> AnyFailed:
    """An `AnyFailed` over a ``torch.distributed`` process group: one all-reduce (MAX) of a
    one-element tensor on `device` (a CUDA tensor for NCCL, CPU for gloo)."""
    import torch.distributed as dist

    def any_failed(failed: bool, device: torch.device) -> bool:
        flag = torch.tensor([1 if failed else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        return bool(flag.item())

    return any_failed


# -- the hook ------------------------------------------------------------------------------------
class _Rows:
    """One prefill forward's rows, checked: what the teacher and the spool need."""

    def __init__(self, input_ids_N, hidden_NH, lm_head, aux_NX, rids, lens, starts):
        self.input_ids_N, self.hidden_NH, self.lm_head, self.aux_NX = (input_ids_N, hidden_NH,
                                                                       lm_head, aux_NX)
        self.rids, self.lens, self.starts = rids, lens, starts


_FAILED = object()  # this rank's part of a step failed (its error is already written)
PEER_FAILED = ("stopped together with the other tensor-parallel ranks: another rank's capture "
               "hook failed (its HOOK_ERROR file says why)")


class CaptureHook:
    """``module.register_forward_hook`` callable writing each prefill's rows to the spool.

    `config` (the JSON ``config`` of the ``--forward-hooks`` entry): ``spool_dir``,
    ``storage`` ("final" | "topk" | "compact" | None = aux only), ``topk``, ``dtype``
    (storage dtype of "final"/"topk"), ``num_aux`` (3). `rank` is this process's
    tensor-parallel rank (only rank 0 writes); `gather` is used when the head is split;
    `any_failed` (given with `gather`) makes a failure on one rank stop every rank together
    (module docstring). `failed`: this rank failed; `quiet`: the hook captures nothing more.
    """

    def __init__(self, config: dict[str, Any], *, rank: int = 0, gather: Gather | None = None,
                 any_failed: AnyFailed | None = None):
        self.spool = Path(config["spool_dir"])
        self.storage = config.get("storage")
        self.topk = int(config.get("topk") or 0)
        self.dtype = DTYPES[config.get("dtype") or "bfloat16"]
        self.num_aux = int(config.get("num_aux", 3))
        self.rank = rank
        self.gather = gather
        self.any_failed = any_failed
        self.failed = False
        self.quiet = False
        self.module_id: int | None = None
        self._queue: queue.Queue | None = None
        self._writer: threading.Thread | None = None

    # The hook never raises into SGLang: a failure is recorded for the collector and the
    # hook goes quiet (a raise would take the scheduler process down with it).
    def __call__(self, module: Any, args: Sequence[Any], output: Any) -> None:
        together = self.any_failed is not None and self.storage in ("topk", "compact")
        if self.quiet or (self.failed and not together):
            return  # (a failed rank that gathers with others must still reach step 1)
        rows = self._step(lambda: self._rows(module, args))
        if rows is None:
            return  # not a prefill forward: no collective on any rank
        device = _device_of(args)
        # 1. before the teacher's gathers: did any rank fail, now or earlier?
        if together and self._stop_together(rows is _FAILED, device):
            return
        if rows is _FAILED:
            self.quiet = True
            return
        teacher = None
        if self.storage in ("topk", "compact"):
            teacher = self._step(lambda: self._teacher(module, rows))
            # 2. after them: a rank whose part failed has still joined every gather
            if together and self._stop_together(teacher is _FAILED, device):
                return
            if teacher is _FAILED:
                self.quiet = True
                return
        if self.rank != 0:
            return
        # 3. rank 0 alone, no collective: the other ranks hear of a failure at step 1 next time
        if self._step(lambda: self._write(rows, teacher)) is _FAILED:
            self.quiet = True

    def _step(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - every failure must reach the collector
            self._fail(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}")
            return _FAILED

    def _stop_together(self, failed_here: bool, device: torch.device) -> bool:
        """All-reduce this rank's failure flag; True (and quiet) when any rank's is set."""
        assert self.any_failed is not None
        if not self.any_failed(self.failed or failed_here, device):
            return False
        self.quiet = True
        if not self.failed:
            self._fail(PEER_FAILED)
        return True

    def _fail(self, message: str) -> None:
        self.failed = True
        try:
            write_error(self.spool, self.rank, message)
        except OSError:
            pass

    def _rows(self, module: Any, args: Sequence[Any]) -> _Rows | None:
        """The checked rows of a prefill forward; None for any other forward."""
        if len(args) < 5:
            raise RuntimeError(
                f"logits_processor was called with {len(args)} positional arguments; expected "
                f"(input_ids, hidden_states, lm_head, forward_batch, aux_hidden_states) as "
                f"SGLang 0.5.23's Llama and DeepSeek classes pass them")
        input_ids_N, hidden_NH, lm_head, batch, aux = args[:5]
        mode = batch.forward_mode
        if not mode.is_extend() or mode.is_target_verify():
            return None  # decode, idle, verify: no prompt rows to capture
        if self.module_id is None:
            self.module_id = id(module)
        elif self.module_id != id(module):
            raise RuntimeError("the hook is attached to two modules (target_modules matched "
                               "more than one logits_processor); rows would be written twice")
        if input_ids_N is None:  # Kimi-K2.5's wrapper: the language model ran on embeddings
            input_ids_N = getattr(batch, "input_ids", None)
            if input_ids_N is None:
                raise RuntimeError("logits_processor got input_ids=None (a multimodal wrapper "
                                   "such as KimiK25ForConditionalGeneration) and forward_batch "
                                   "carries no input_ids either")
        if batch.extend_seq_lens_cpu is None or batch.extend_prefix_lens_cpu is None:
            raise RuntimeError("forward_batch carries no extend_seq_lens_cpu / "
                               "extend_prefix_lens_cpu (a GPU-only batch layout eyas does not "
                               "read)")
        rids = list(batch.rids or [])
        lens = [int(n) for n in batch.extend_seq_lens_cpu]
        starts = [int(s) for s in batch.extend_prefix_lens_cpu]
        if aux is None:
            raise RuntimeError("no aux hidden states reached the logits processor (engine "
                               "started without enable_return_aux_hidden_states?)")
        aux_NX = aux if isinstance(aux, torch.Tensor) else torch.cat(list(aux), dim=-1)
        n, h = hidden_NH.shape[0], hidden_NH.shape[-1]
        if not (len(rids) == len(lens) == len(starts)):
            raise RuntimeError(f"forward batch has {len(rids)} rids, {len(lens)} lengths, "
                               f"{len(starts)} prefix lengths")
        if sum(lens) != n or input_ids_N.shape[0] != n or aux_NX.shape != (n, self.num_aux * h):
            raise RuntimeError(
                f"rows do not line up: requests hold {sum(lens)} tokens, input_ids "
                f"{tuple(input_ids_N.shape)}, hidden_states {tuple(hidden_NH.shape)}, aux "
                f"{tuple(aux_NX.shape)} (expected [{n}, {self.num_aux} x {h}]); sequence-"
                f"parallel layernorm and DP attention are not supported")
        return _Rows(input_ids_N, hidden_NH, lm_head, aux_NX, rids, lens, starts)

    def _teacher(self, module: Any, rows: _Rows) -> tuple[torch.Tensor, torch.Tensor]:
        vocab = int(getattr(module, "vocab_size", 0) or rows.lm_head.weight.shape[0])
        return teacher_topk(
            rows.hidden_NH, rows.lm_head, vocab_size=vocab, k=self.topk, gather=self.gather,
            logit_scale=getattr(module, "logit_scale", None),
            softcap=getattr(module, "final_logit_softcapping", None))

    def _write(self, rows: _Rows, teacher: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        tensors = {"input_ids": rows.input_ids_N.to(torch.int32)}
        if self.storage == "compact":
            tensors["aux_fp8"], tensors["aux_scale"] = quantize_aux(rows.aux_NX,
                                                                    groups=self.num_aux)
        else:
            tensors["aux_hidden"] = rows.aux_NX.to(self.dtype)
        if self.storage == "final":
            tensors["final_hidden"] = rows.hidden_NH.to(self.dtype)
        elif teacher is not None:
            tensors["topk_ids"] = teacher[0]
            tensors["topk_logprobs"] = teacher[1].to(torch.float16)
        cpu = {k: v.to("cpu") for k, v in tensors.items()}  # one copy per tensor per forward
        jobs, row = [], 0
        for rid, length, start in zip(rows.rids, rows.lens, rows.starts, strict=True):
            if str(rid).startswith(RID_PREFIX):
                jobs.append((str(rid), start, {k: v[row : row + length] for k, v in cpu.items()}))
            row += length
        if jobs:
            self._submit(jobs)

    # -- writer thread: the forward only waits when WRITE_QUEUE batches are pending ---------------
    def _submit(self, jobs: list[tuple[str, int, dict[str, torch.Tensor]]]) -> None:
        if self._writer is None:
            self._queue = queue.Queue(maxsize=WRITE_QUEUE)
            self._writer = threading.Thread(target=self._write_loop, name="eyas-spool-writer",
                                            daemon=True)
            self._writer.start()
        self._queue.put(jobs)

    def _write_loop(self) -> None:
        assert self._queue is not None
        while True:
            jobs = self._queue.get()
            if jobs is None:
                return
            try:
                for rid, start, tensors in jobs:
                    write_chunk(self.spool, rid, start, tensors)
            except Exception as exc:  # noqa: BLE001 - the collector must hear of it
                self._fail(f"writing the spool failed: {type(exc).__name__}: {exc}")
            finally:
                self._queue.task_done()

    def flush(self) -> None:
        """Wait until every submitted chunk is written (tests; SGLang never calls it)."""
        if self._queue is not None:
            self._queue.join()

    def close(self) -> None:
        """Flush and stop the writer thread."""
        if self._queue is not None and self._writer is not None:
            self._queue.put(None)
            self._writer.join()
            self._queue, self._writer = None, None


def _device_of(args: Sequence[Any]) -> torch.device:
    """Where this rank's collectives run: the device of the forward's hidden states."""
    for arg in list(args[1:2]) + list(args):
        if isinstance(arg, torch.Tensor):
            return arg.device
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
        else torch.device("cpu")


def capture_hook(config: dict[str, Any]) -> CaptureHook:
    """SGLang's ``hook_factory`` (``--forward-hooks``): a `CaptureHook` for this process's
    tensor-parallel rank, gathering over SGLang's tensor-parallel group.

    Runs in SGLang's scheduler processes, where SGLang's distributed state is set up; checks
    that the SGLang there is the version eyas was written against.
    """
    import sglang
    from sglang.srt.distributed import get_tp_group

    from eyas.sglang_version import check_sglang_version

    check_sglang_version(getattr(sglang, "__version__", "unknown"))
    group = get_tp_group()
    world = int(group.world_size)
    gather = torch_gather(group.device_group, world) if world > 1 else None
    any_failed = torch_any_failed(group.device_group) if world > 1 else None
    return CaptureHook(config, rank=int(group.rank_in_group), gather=gather,
                       any_failed=any_failed)
