"""Training data: samples from extraction shards (offline) or from the target itself (online).

Both sources expose the same thing: an ordered list of sample ids and ``load(k)`` returning
sample k as ``input_ids`` [T] long, ``loss_mask`` [T] long, ``aux_hidden`` [T, 3H] and either
``final_hidden`` [T, H] or ``topk_ids`` [T, K] + ``topk_logprobs`` [T, K] -- the per-sample dict
of ``eyas.extract.store.iter_samples``.

- ``OfflineSource`` indexes the verified shards under a folder (``eyas.extract.store``) and reads
  one sample's rows at a time (safetensors slices), so memory holds one batch, never a shard.
- ``OnlineSource`` indexes ``merged/train.jsonl`` by byte offset and runs the target in process
  (``eyas.extract.hf_backend.HFBackend``) on each sample it is asked for -- for targets that fit
  beside the drafter.

``Batches`` walks a source in a seeded permutation per epoch (a global shuffle across shards),
``micro_batch`` samples at a time, rank r of w taking every w-th micro-batch. Its position
(epoch, cursor) is part of a checkpoint, which is what makes resume exact. Offline and online
sources over the same samples give the same batches for the same seed (a test holds this).
With ``prefetch`` a background thread (``Prefetcher``) reads the next micro-batches ahead, in
the same order; storage "compact" can stay in float8 until the device (``Batch.aux_on``).
"""

from __future__ import annotations

import copy
import hashlib
import queue
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
import torch
from safetensors import safe_open

from eyas.errors import DataError
from eyas.extract.store import (
    DATA_NAME,
    SHARD_PREFIX,
    TEACHER_TENSORS,
    dequantize_aux,
    is_shard_complete,
    read_rows,
    read_shard_manifest,
    shard_name,
    verify_shard,
)
from eyas.train.ttt import pad_batch
from eyas.verified import file_sha256

Sample = dict[str, torch.Tensor]


def all_shards_verified(root: Path, *, check_hashes: bool = True) -> list[Path]:
    """Every ``shard-NNNNN`` folder under `root`, sorted, each of which verifies.

    Raises DataError naming the first shard that does not verify (its problem, and that
    ``eyas extract`` redoes it) or that is missing between others (``shard-00001`` absent
    beside 00000 and 00002): training on the shards that remain would silently drop data.
    Interrupted writers' ``.tmp-*`` folders are not shards and are not counted."""
    root = Path(root)
    folders = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(SHARD_PREFIX)
                     ) if root.is_dir() else []
    for index, folder in enumerate(folders):
        if folder.name != shard_name(index):
            raise DataError(f"{shard_name(index)} is missing (found {folder.name} after it); "
                            f"run `eyas extract` to redo it", path=root / shard_name(index))
        problems = verify_shard(folder, check_hashes=check_hashes)
        if problems:
            raise DataError(f"shard {folder.name} does not verify ({problems[0]}): training "
                            f"would drop its samples; run `eyas extract` to redo it",
                            path=folder)
    return folders


class OfflineSource:
    """Every sample of the shards under `root`, in shard order; every one must verify
    (`all_shards_verified`).

    `names` restricts it to those shard folders, every one of which must then be complete
    (how the other processes of a run take the shards its first process verified, without
    hashing terabytes again: see `shared_offline_source`). Raises DataError when there is no
    shard, when a shard does not verify or is missing between others, when a named shard is
    not complete, or when shards disagree on storage, auxiliary layers or hidden size (mixed
    extractions).
    """

    def __init__(self, root: Path, *, check_hashes: bool = True,
                 names: list[str] | None = None) -> None:
        self.root = Path(root)
        if names is None:
            self.shards = all_shards_verified(self.root, check_hashes=check_hashes)
        else:
            self.shards = [self.root / n for n in names]
            for shard in self.shards:
                if not is_shard_complete(shard, check_hashes=check_hashes):
                    raise DataError("shard is not complete here, though the first training "
                                    "process found it verified", path=shard)
        if not self.shards:
            raise DataError("no complete hidden-state shard (run extraction first)", path=self.root)
        self.records = [read_shard_manifest(s) for s in self.shards]
        first = self.records[0]
        for shard, rec in zip(self.shards, self.records, strict=True):
            for key in ("storage", "aux_layers", "hidden_size"):
                if rec[key] != first[key]:
                    raise DataError(
                        f"{key} is {rec[key]!r} here but {first[key]!r} in {self.shards[0].name}",
                        path=shard / "manifest.json",
                        field=key,
                    )
        self.storage: str = first["storage"]
        self.aux_layers: list[int] = list(first["aux_layers"])
        self.hidden_size: int = int(first["hidden_size"])
        self.refs = [(s, j) for s, rec in zip(self.shards, self.records, strict=True)
                     for j in range(rec["num_samples"])]
        self.ids = [sid for rec in self.records for sid in rec["sample_ids"]]
        self._offsets: dict[Path, list[int]] = {}

    def __len__(self) -> int:
        return len(self.refs)

    def identity(self) -> str:
        """Hash of the shards' names and manifests' sample ids and fingerprints."""
        h = hashlib.sha256()
        for shard, rec in zip(self.shards, self.records, strict=True):
            h.update(orjson.dumps([shard.name, rec["sample_ids"], rec["token_counts"],
                                   rec["target_fingerprint"], rec["storage"]]))
        return h.hexdigest()[:16]

    def lengths(self) -> list[int]:
        """Tokens of every sample (from the shard manifests: nothing is read)."""
        return [int(n) for rec in self.records for n in rec["token_counts"]]

    def load(self, k: int, *, dequantize: bool = True) -> Sample:
        """Sample k, reading only its rows (``eyas.extract.store.read_rows``: any storage;
        `dequantize` False leaves storage "compact"'s aux states in float8 + scales)."""
        shard, j = self.refs[k]
        with safe_open(str(shard / DATA_NAME), framework="pt") as fh:
            if shard not in self._offsets:
                self._offsets[shard] = fh.get_tensor("offsets").tolist()
            a, b = self._offsets[shard][j], self._offsets[shard][j + 1]
            return read_rows(fh, self.storage, a, b, dequantize=dequantize)

    def masked_tokens(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(input_ids, loss_mask) of every sample, a shard at a time (for the draft vocab)."""
        for shard in self.shards:
            with safe_open(str(shard / DATA_NAME), framework="pt") as fh:
                yield fh.get_tensor("input_ids").long(), fh.get_tensor("loss_mask").long()


def shared_offline_source(root: Path) -> OfflineSource:
    """`OfflineSource(root)` for every process of a torch.distributed run: the first process
    verifies the shards (their SHA-256), the others take its list (checking manifests and
    sizes only), so that all see the same shards and the data is hashed once, not once per GPU.

    A rank whose first process failed raises DataError too (the same message on each rank).
    """
    import torch.distributed as dist

    from eyas.train.launch import patient_group

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return OfflineSource(root)
    group = patient_group()  # hashing terabytes takes longer than NCCL waits
    found: list[object] = [None]
    if dist.get_rank() == 0:
        try:
            source = OfflineSource(root)
            found = [[s.name for s in source.shards]]
        except DataError as exc:
            found = [{"message": exc.reason, "path": exc.path, "line": exc.line,
                      "field": exc.field}]
    dist.broadcast_object_list(found, src=0, group=group)
    dist.destroy_process_group(group)
    if isinstance(found[0], dict):
        raise DataError(**found[0])
    return source if dist.get_rank() == 0 else OfflineSource(root, check_hashes=False,
                                                             names=found[0])


class OnlineSource:
    """Samples of a merged JSONL file, their hidden states computed by the target on demand.

    `storage`, `aux_layers`, `topk` and `dtype` mean what they mean to extraction, so the
    samples equal the shards extraction would write. The model loads on first use.
    """

    def __init__(
        self,
        jsonl: Path,
        model_dir: Path,
        *,
        storage: str = "final",
        aux_layers: list[int] | None = None,
        topk: int = 32,
        dtype: str = "bfloat16",
        device: str = "auto",
        trust_remote_code: bool = False,
    ) -> None:
        from eyas.extract.target import resolve_aux_layers

        self.path = Path(jsonl)
        self.model_dir = Path(model_dir)
        self.trust_remote_code = trust_remote_code
        self.storage = storage
        self.aux_layers, shape = resolve_aux_layers(self.model_dir, aux_layers)
        self.hidden_size = shape.hidden_size
        self.topk, self.dtype, self.device = topk, dtype, device
        self._backend = None
        self.offsets: list[int] = []
        self.ids: list[str] = []
        self._lengths: list[int] = []
        with open(self.path, "rb") as fh:
            lineno = 0
            while True:
                pos = fh.tell()
                line = fh.readline()
                if not line:
                    break
                lineno += 1
                if not line.strip():
                    continue
                try:
                    obj = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise DataError(f"not JSON ({exc})", path=self.path, line=lineno) from exc
                if "id" not in obj:
                    raise DataError("missing (expected a string id)", path=self.path,
                                    line=lineno, field="id")
                self.offsets.append(pos)
                self.ids.append(str(obj["id"]))
                self._lengths.append(len(obj.get("input_ids") or ()))
        if not self.ids:
            raise DataError("no records", path=self.path)

    def __len__(self) -> int:
        return len(self.ids)

    def lengths(self) -> list[int]:
        """Tokens of every record (its ``input_ids``)."""
        return list(self._lengths)

    def identity(self) -> str:
        """The JSONL file's SHA-256 (first 16 hex digits)."""
        return file_sha256(self.path)[:16]

    def record(self, k: int) -> dict[str, Any]:
        with open(self.path, "rb") as fh:
            fh.seek(self.offsets[k])
            return orjson.loads(fh.readline())

    def _get_backend(self):
        if self._backend is None:
            from eyas.extract.hf_backend import HFBackend

            self._backend = HFBackend(self.model_dir, aux_layers=self.aux_layers,
                                      storage=self.storage, topk=self.topk, dtype=self.dtype,
                                      device=self.device,
                                      trust_remote_code=self.trust_remote_code)
        return self._backend

    def load(self, k: int, *, dequantize: bool = True) -> Sample:
        """Sample k, computed by the target now (aux states as computed, whatever
        `dequantize`). Raises DataError for non-finite states."""
        rec = self.record(k)
        result = self._get_backend().run_batch([rec])
        if result.quarantined:
            raise DataError(result.quarantined[0]["reason"], path=self.path, field=f"id {rec['id']}")
        s = result.samples[0]
        out = {"input_ids": torch.tensor(s["input_ids"], dtype=torch.long),
               "loss_mask": torch.tensor(s["loss_mask"], dtype=torch.long),
               "aux_hidden": s["aux_hidden"]}
        for name in TEACHER_TENSORS[self.storage]:
            out[name] = s[name].long() if name == "topk_ids" else s[name]
        return out

    def masked_tokens(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(input_ids, loss_mask) of every record (no model run)."""
        for k in range(len(self)):
            rec = self.record(k)
            yield torch.tensor(rec["input_ids"]), torch.tensor(rec["loss_mask"])


class MemorySource:
    """Samples already in memory (tests, benchmarks): the same interface as the others."""

    def __init__(self, samples: list[Sample], ids: list[str] | None = None,
                 storage: str = "final") -> None:
        self.samples = samples
        self.ids = ids or [f"s{i}" for i in range(len(samples))]
        self.storage = storage

    def __len__(self) -> int:
        return len(self.samples)

    def identity(self) -> str:
        h = hashlib.sha256()
        for s in self.samples:
            h.update(s["input_ids"].numpy().tobytes() + s["loss_mask"].numpy().tobytes())
        return h.hexdigest()[:16]

    def lengths(self) -> list[int]:
        return [int(s["input_ids"].shape[0]) for s in self.samples]

    def load(self, k: int, *, dequantize: bool = True) -> Sample:
        return self.samples[k]

    def masked_tokens(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for s in self.samples:
            yield s["input_ids"], s["loss_mask"]


Source = OfflineSource | OnlineSource | MemorySource


@dataclass
class Batch:
    """A padded micro-batch (padding: token 0, loss mask 0)."""

    ids: list[str]
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    aux_hidden: torch.Tensor
    """[B, T, 3H]: as loaded -- float8 when `aux_scale` is set (see `aux_on`)."""
    teacher: dict[str, torch.Tensor]
    """``final_hidden`` or ``topk_ids`` + ``topk_logprobs``, padded like the rest."""
    lengths: list[int]
    """Real (unpadded) tokens per row."""
    aux_scale: torch.Tensor | None = None
    """[B, T, 3] float32 scales of float8 `aux_hidden` (storage "compact" read with
    ``dequantize=False``), else None."""
    indices: list[int] | None = None
    """The rows' positions in their source (unique, where `ids` may repeat): the keys of the
    teacher memo (``eyas.train.teacher_memo``); None: not known, no memo."""

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    def aux_on(self, device: torch.device) -> torch.Tensor:
        """`aux_hidden` on `device`, dequantised there (bf16) when it came as float8: a
        quarter of the bytes to copy, and no CPU time spent widening them."""
        aux = self.aux_hidden.to(device, non_blocking=True)
        if self.aux_scale is None:
            return aux
        B, T, X = aux.shape
        scale = self.aux_scale.to(device, non_blocking=True)
        return dequantize_aux(aux.view(B * T, X), scale.view(B * T, -1)).view(B, T, X)

    def pin_memory(self) -> Batch:
        """The batch in page-locked host memory (copies to a GPU then run asynchronously)."""
        return replace(self, input_ids=self.input_ids.pin_memory(),
                       loss_mask=self.loss_mask.pin_memory(),
                       aux_hidden=self.aux_hidden.pin_memory(),
                       teacher={k: v.pin_memory() for k, v in self.teacher.items()},
                       aux_scale=None if self.aux_scale is None else self.aux_scale.pin_memory())


def collate(samples: list[Sample], ids: list[str], max_len: int | None,
            indices: list[int] | None = None) -> Batch:
    """Truncate each sample to `max_len` tokens and pad them into one batch (`indices`: the
    samples' positions in their source, ``Batch.indices``)."""
    cut = [{k: v[:max_len] if max_len else v for k, v in s.items()} for s in samples]
    quantised = "aux_fp8" in cut[0]
    aux = "aux_fp8" if quantised else "aux_hidden"
    teacher_names = [k for k in cut[0]
                     if k not in ("input_ids", "loss_mask", "aux_hidden", "aux_fp8", "aux_scale")]
    return Batch(
        ids=ids,
        input_ids=pad_batch([s["input_ids"] for s in cut]),
        loss_mask=pad_batch([s["loss_mask"] for s in cut]),
        aux_hidden=pad_batch([s[aux] for s in cut]),
        teacher={k: pad_batch([s[k] for s in cut]) for k in teacher_names},
        lengths=[int(s["input_ids"].shape[0]) for s in cut],
        aux_scale=pad_batch([s["aux_scale"] for s in cut]) if quantised else None,
        indices=None if indices is None else list(indices),
    )


class Batches:
    """Micro-batches of a source in a seeded order; resumable from ``state_dict()``.

    Epoch e visits samples in ``randperm(len(source), seed + e)``; micro-batch m of the
    global stream holds permutation entries ``[m·b, (m+1)·b)`` (the last of an epoch may be
    short); rank r of w yields global micro-batches r, r+w, r+2w, ...

    An optimizer step takes P = w · `accum` consecutive global micro-batches (every rank's
    `accum` micro-batches). With ``group_batches`` g > 1 the permutation is cut into runs of
    g steps (g·P·b samples); each run is sorted by length (truncated to `max_len`, longest
    first, ties in permutation order) and cut into its g steps, whose order within the run is
    then shuffled (seeded by seed + e too). The samples of one step -- every rank's -- then
    have similar lengths: less padding inside a micro-batch, and no rank waits at the step's
    gradient all-reduce for another's much longer sample. Within a step, the ranks' k-th
    micro-batches alternate direction (rank 0 longest for even k, shortest for odd k) so that
    accumulated work evens out too. A step that straddles two epochs is left as it falls (the
    next epoch's runs start after it). The same samples every epoch, still a function of
    (seed, epoch, P) only -- so resume stays exact, and any split of P into processes and
    `accum` gives every step the same samples.

    Loading: with `prefetch` n > 0 a background thread reads and collates this rank's next
    micro-batches, at most n ahead of the training thread, in the same order (the position
    in ``state_dict()`` is what was taken, never what was read ahead); with `pin_memory` it
    puts them in page-locked memory (for a CUDA device). With `dequantize` False, storage
    "compact" batches keep their aux states in float8 + scales for ``Batch.aux_on`` to widen
    on the device.
    """

    def __init__(self, source: Source, *, micro_batch: int, seed: int,
                 max_len: int | None = None, rank: int = 0, world: int = 1,
                 shuffle: bool = True, group_batches: int = 1, accum: int = 1,
                 prefetch: int = 0, pin_memory: bool = False, dequantize: bool = True) -> None:
        self.source, self.micro_batch, self.seed = source, micro_batch, seed
        self.max_len, self.rank, self.world, self.shuffle = max_len, rank, world, shuffle
        self.group_batches, self.accum = group_batches, accum
        self.prefetch, self.pin_memory, self.dequantize = prefetch, pin_memory, dequantize
        self._lengths: list[int] | None = None
        self.epoch = 0
        self.cursor = 0  # global micro-batches consumed in this epoch
        self._order: torch.Tensor | None = None
        self._reader: Prefetcher | None = None

    @property
    def per_epoch(self) -> int:
        return -(-len(self.source) // self.micro_batch)

    def order(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(len(self.source))
        g = torch.Generator().manual_seed(self.seed + epoch)
        perm = torch.randperm(len(self.source), generator=g)
        if self.group_batches <= 1:
            return perm
        if self._lengths is None:
            cap = self.max_len or 2**62
            self._lengths = [min(n, cap) for n in self.source.lengths()]
        w, b = self.world, self.micro_batch
        step = w * self.accum * b  # samples of one optimizer step, all ranks
        # Micro-batches of a step the previous epochs left unfinished: this epoch's first
        # `head` samples complete it, and its own steps start after them.
        unfinished = (epoch * self.per_epoch) % (w * self.accum)
        head = ((w * self.accum - unfinished) % (w * self.accum)) * b
        out = perm[:head].tolist()
        run = self.group_batches * step
        for start in range(head, len(perm), run):
            part = perm[start : start + run].tolist()
            part.sort(key=lambda k: -self._lengths[k])  # stable: ties keep permutation order
            steps = [self._balanced(part[i : i + step]) for i in range(0, len(part), step)]
            for j in torch.randperm(len(steps), generator=g).tolist():
                out.extend(steps[j])
        return torch.tensor(out, dtype=torch.long)

    def _balanced(self, samples: list[int]) -> list[int]:
        """One step's samples, longest first, as global micro-batches whose ranks alternate
        direction with each accumulated micro-batch (no rank always the longest)."""
        w, b = self.world, self.micro_batch
        if w == 1 or self.accum == 1:
            return samples
        batches = [samples[i : i + b] for i in range(0, len(samples), b)]
        out: list[int] = []
        for k in range(0, len(batches), w):
            chunk = batches[k : k + w]
            for mb in (chunk[::-1] if (k // w) % 2 else chunk):
                out.extend(mb)
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.close()  # what it read ahead follows the old position
        self.epoch, self.cursor, self.seed = state["epoch"], state["cursor"], state["seed"]
        self._order = None

    def next_global(self) -> list[int]:
        """Sample indices of the next global micro-batch (advancing the position)."""
        if self.cursor >= self.per_epoch:
            self.epoch, self.cursor, self._order = self.epoch + 1, 0, None
        if self._order is None:
            self._order = self.order(self.epoch)
        m = self.cursor
        self.cursor += 1
        return self._order[m * self.micro_batch : (m + 1) * self.micro_batch].tolist()

    def next_indices(self) -> list[int]:
        """Sample indices of this rank's next micro-batch (advancing past the other ranks')."""
        mine: list[int] = []
        for r in range(self.world):
            picked = self.next_global()
            if r == self.rank:
                mine = picked
        return mine

    def load(self, ks: list[int]) -> Batch:
        """Samples `ks` read and collated (pinned with `pin_memory`)."""
        batch = collate([self.source.load(k, dequantize=self.dequantize) for k in ks],
                        [self.source.ids[k] for k in ks], self.max_len, ks)
        return batch.pin_memory() if self.pin_memory else batch

    def __next__(self) -> Batch:
        """This rank's next micro-batch (skipping the other ranks' ones)."""
        if self.prefetch <= 0:
            return self.load(self.next_indices())
        if self._reader is None:
            self._reader = Prefetcher(self)
            # a Batches dropped without close() stops its thread too (the thread holds a copy)
            weakref.finalize(self, self._reader.stop.set)
        batch, (self.epoch, self.cursor) = self._reader.get()
        self._order = None
        return batch

    def close(self) -> None:
        """Stop the background reader, if any (a later ``next`` starts a new one from the
        position taken so far)."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def __iter__(self) -> Batches:
        return self

    def one_pass(self) -> Iterator[Batch]:
        """Every sample once, in order, this rank's share (for evaluation); no state change."""
        n = len(self.source)
        for m, start in enumerate(range(0, n, self.micro_batch)):
            if m % self.world != self.rank:
                continue
            yield self.load(list(range(start, min(n, start + self.micro_batch))))


class Prefetcher:
    """A thread that reads `batches`' next micro-batches ahead into a bounded queue.

    It walks a copy of the position, so the batches come in exactly the order ``next`` would
    read them; each comes with the position after it (``(epoch, cursor)``), which the
    consumer takes as its own. An error while reading is raised by the ``get`` that would
    have returned that batch.
    """

    def __init__(self, batches: Batches) -> None:
        self.planner = copy.copy(batches)
        self.planner.prefetch, self.planner._reader, self.planner._order = 0, None, None
        self.queue: queue.Queue = queue.Queue(maxsize=max(1, batches.prefetch))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="eyas-prefetch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        p = self.planner
        while not self.stop.is_set():
            try:
                item: tuple = (p.load(p.next_indices()), (p.epoch, p.cursor))
            except Exception as exc:  # noqa: BLE001 -- raised by the consumer's get
                item = (exc, None)
            while not self.stop.is_set():
                try:
                    self.queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if item[1] is None:
                return

    def get(self) -> tuple[Batch, tuple[int, int]]:
        while True:
            try:
                batch, position = self.queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self.thread.is_alive():
                    raise RuntimeError("the data prefetch thread ended without a batch") from None
        if position is None:
            raise batch
        return batch, position

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
