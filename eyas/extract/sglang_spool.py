"""The spool between SGLang's capture hook and eyas: one safetensors file per request chunk.

The hook (`eyas.extract.sglang_hook`, inside SGLang's tensor-parallel rank 0) writes, for
every prefill forward and every request in it, the rows of that request the forward computed::

    <spool>/<rid>.<start:09d>.safetensors     rows [start, start + n) of request <rid>

holding ``input_ids`` [n] int32 (what the model saw, checked against the record), the aux
states (``aux_hidden`` [n, 3H] in the storage dtype, or ``aux_fp8`` [n, 3H] + ``aux_scale``
[n, 3] for storage "compact") and the teacher of the storage (``final_hidden`` [n, H], or
``topk_ids`` [n, K] int32 + ``topk_logprobs`` [n, K] float16). One forward usually holds a
whole prompt (start 0); with chunked prefill a prompt arrives in several chunks. Each file is
written under a temporary name and renamed, so a reader never sees half of one. A hook that
fails writes ``HOOK_ERROR.rank<r>`` with the reason instead of raising inside SGLang.

`collect_request` (in eyas's process) assembles a request's chunks into the sample the HF
backend would produce, or says it is not complete yet; `wait_for_requests` polls until all
requests of a batch are complete, a hook error appears, or a timeout passes.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eyas.errors import EyasError

SUFFIX = ".safetensors"
ERROR_PREFIX = "HOOK_ERROR"
RID_PREFIX = "eyas-"
"""Only requests whose id starts with this are captured (eyas names its own requests)."""


def chunk_path(spool: Path, rid: str, start: int) -> Path:
    """Where rows ``[start, ...)`` of request `rid` go."""
    return Path(spool) / f"{rid}.{int(start):09d}{SUFFIX}"


def write_chunk(spool: Path, rid: str, start: int, tensors: dict[str, torch.Tensor]) -> Path:
    """Write one chunk atomically (temporary name, then rename); returns its path."""
    path = chunk_path(spool, rid, start)
    tmp = path.with_name(f".tmp-{path.name}-{uuid.uuid4().hex[:8]}")
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp),
                  metadata={"rid": rid, "start": str(int(start))})
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def write_error(spool: Path, rank: int, message: str) -> None:
    """Record a hook failure where the collector looks (one file per rank)."""
    path = Path(spool) / f"{ERROR_PREFIX}.rank{rank}"
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(message + "\n", encoding="utf-8")
    os.replace(tmp, path)


def hook_errors(spool: Path) -> list[str]:
    """The failures hooks recorded in `spool`, one string per rank, sorted."""
    return [f"{p.name}: {p.read_text(encoding='utf-8').strip()}"
            for p in sorted(Path(spool).glob(f"{ERROR_PREFIX}.rank*"))]


def _chunks(spool: Path, rid: str, names: Sequence[str] | None = None) -> list[tuple[int, Path]]:
    """(start, path) of every chunk of `rid`, sorted; `names` = a listing of `spool` already made."""
    names = os.listdir(spool) if names is None else names
    out = []
    for name in names:
        if name.startswith(rid + ".") and name.endswith(SUFFIX):
            start = name[len(rid) + 1 : -len(SUFFIX)]
            if start.isdigit():
                out.append((int(start), Path(spool) / name))
    return sorted(out)


def collect_request(spool: Path, rid: str, input_ids: Sequence[int], *,
                    names: Sequence[str] | None = None) -> dict[str, torch.Tensor] | None:
    """The tensors of request `rid` (rows ``0..T-1`` for its ``T = len(input_ids)`` tokens),
    concatenated over its chunks; None while the chunks written so far do not cover them.

    Returns ``input_ids`` [T] int32 plus the aux and teacher tensors the hook wrote (see the
    module docstring). Rows past T (a decode step) are dropped. `names` is a listing of
    `spool` to use instead of reading it again. Raises EyasError when the chunks overlap or
    their ``input_ids`` differ from `input_ids` (the hook saw another request under this id)
    or their tensors disagree.
    """
    t = len(input_ids)
    pieces: list[dict[str, torch.Tensor]] = []
    covered = 0
    for start, path in _chunks(spool, rid, names):
        if start >= t:
            continue
        if start != covered:
            if start > covered:
                return None  # a chunk before this one is not written yet
            raise EyasError(f"request {rid}: chunk at row {start} overlaps rows already covered "
                            f"(0..{covered - 1}) in {spool} (radix cache on?)")
        with safe_open(str(path), framework="pt") as fh:
            piece = {name: fh.get_tensor(name) for name in fh.keys()}
        n = min(int(piece["input_ids"].shape[0]), t - start)
        pieces.append({k: v[:n] for k, v in piece.items()})
        covered += n
        if covered >= t:
            break
    if covered < t:
        return None
    names = sorted(pieces[0])
    if any(sorted(p) != names for p in pieces):
        raise EyasError(f"request {rid}: its chunks hold different tensors ({spool})")
    out = {name: torch.cat([p[name] for p in pieces], 0) for name in names}
    want = torch.as_tensor(list(input_ids), dtype=torch.int32)
    if not torch.equal(out["input_ids"].to(torch.int32), want):
        bad = int((out["input_ids"].to(torch.int32) != want).nonzero()[0, 0])
        raise EyasError(f"request {rid}: the capture hook saw token {int(out['input_ids'][bad])} "
                        f"at position {bad}, the record has {int(want[bad])} (requests mixed up?)")
    return out


def remove_request(spool: Path, rid: str) -> None:
    """Delete every chunk of request `rid`."""
    for _, path in _chunks(spool, rid):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def wait_for_requests(spool: Path, requests: dict[str, Sequence[int]], *, timeout_s: float,
                      poll_s: float = 0.02) -> dict[str, dict[str, torch.Tensor]]:
    """`collect_request` for every ``rid -> input_ids`` of `requests`, waiting for the hook's
    writer to finish; returns ``rid -> tensors``.

    Raises EyasError when a hook recorded an error (its text included) or when `timeout_s`
    passes with requests still incomplete (names them and the spool).
    """
    done: dict[str, dict[str, torch.Tensor]] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        names = os.listdir(spool)  # one listing per round, not one per request
        if any(name.startswith(ERROR_PREFIX) for name in names):
            raise EyasError("SGLang's capture hook failed: " + " | ".join(hook_errors(spool)))
        for rid, ids in requests.items():
            if rid not in done:
                got = collect_request(spool, rid, ids, names=names)
                if got is not None:
                    done[rid] = got
        if len(done) == len(requests):
            return done
        if time.monotonic() > deadline:
            missing = sorted(set(requests) - set(done))
            raise EyasError(
                f"SGLang's capture hook wrote no complete rows for {len(missing)} request(s) "
                f"(first {missing[:3]}) within {timeout_s:.0f} s in {spool}: is the hook "
                f"registered (forward_hooks) and are CUDA graphs off for prefill?")
        time.sleep(poll_s)

