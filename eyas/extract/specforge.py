"""Migration to and from SpecForge's offline hidden-state format.

SpecForge's offline pipeline writes one ``torch.save`` file per sample (``*.ckpt``), a dict
``{"input_ids" [T], "loss_mask" [T], "hidden_state" [1, T, H], "aux_hidden_state" [1, T, 3H]}``
(bf16 states; the leading batch axis is sometimes absent). ``hidden_state`` is the target's
last hidden state after the final norm, so it maps to our storage "final".

Safety: a ``torch.save`` file is a pickle, and unpickling an untrusted file can run arbitrary
code. We read them only with ``torch.load(..., weights_only=True)``, which restricts
unpickling to tensors and plain containers and refuses anything else (an error naming the
file). Convert files you did not write yourself only this way.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from eyas.errors import DataError
from eyas.extract.store import iter_samples, read_shard_manifest, shard_name, write_shard

REQUIRED = ("input_ids", "loss_mask", "hidden_state", "aux_hidden_state")


def _natural(path: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def list_specforge_files(root: Path) -> list[Path]:
    """Every ``*.ckpt`` under `root`, in natural order (``data_2`` before ``data_10``)."""
    return sorted(Path(root).rglob("*.ckpt"), key=_natural)


def read_specforge_sample(path: Path) -> dict[str, torch.Tensor]:
    """One SpecForge sample, loaded with ``weights_only=True`` (no code runs while loading).

    Returns ``input_ids`` [T] long, ``loss_mask`` [T] long, ``hidden_state`` [T, H],
    ``aux_hidden_state`` [T, 3H]. Raises DataError naming the file and field on anything else.
    """
    path = Path(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - unpickling errors come in many types
        raise DataError(f"not loadable as a weights-only torch file ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''})", path=path) from None
    if not isinstance(obj, dict):
        raise DataError(f"expected a dict, got {type(obj).__name__}", path=path)
    for key in REQUIRED:
        if key not in obj or not isinstance(obj[key], torch.Tensor):
            raise DataError("missing or not a tensor", path=path, field=key)
    ids = obj["input_ids"].reshape(-1).long()
    mask = obj["loss_mask"].reshape(-1).long()
    hidden = obj["hidden_state"].reshape(-1, obj["hidden_state"].shape[-1])
    aux = obj["aux_hidden_state"].reshape(-1, obj["aux_hidden_state"].shape[-1])
    t, h = len(ids), hidden.shape[-1]
    if len(mask) != t or hidden.shape[0] != t or aux.shape[0] != t:
        raise DataError(f"token counts differ: input_ids {t}, loss_mask {len(mask)}, "
                        f"hidden_state {hidden.shape[0]}, aux_hidden_state {aux.shape[0]}",
                        path=path)
    if aux.shape[-1] != 3 * h:
        raise DataError(f"width {aux.shape[-1]}, expected 3 x {h}", path=path,
                        field="aux_hidden_state")
    return {"input_ids": ids, "loss_mask": mask, "hidden_state": hidden, "aux_hidden_state": aux}


def import_specforge(src: Path, out_root: Path, *, aux_layers: list[int], shard_size: int = 256,
                     target_fingerprint: str = "", dtype: str = "bfloat16") -> list[Path]:
    """Convert a SpecForge folder of ``*.ckpt`` files into eyas shards (storage "final").

    `aux_layers` (eyas numbering) records which layers SpecForge captured -- the files do not
    say. Sample ids are the files' paths relative to `src`. Returns the shard folders.
    """
    src, out_root = Path(src), Path(out_root)
    files = list_specforge_files(src)
    if not files:
        raise DataError("no *.ckpt files (expected SpecForge's offline hidden states)", path=src)
    shards: list[Path] = []
    for index, start in enumerate(range(0, len(files), shard_size)):
        samples = []
        hidden_size = None
        for path in files[start : start + shard_size]:
            s = read_specforge_sample(path)
            h = s["hidden_state"].shape[-1]
            if hidden_size not in (None, h):
                raise DataError(f"hidden size {h} differs from {hidden_size} in the same folder",
                                path=path, field="hidden_state")
            hidden_size = h
            samples.append({"id": str(path.relative_to(src)), "input_ids": s["input_ids"],
                            "loss_mask": s["loss_mask"], "aux_hidden": s["aux_hidden_state"],
                            "final_hidden": s["hidden_state"]})
        shard_dir = out_root / shard_name(index)
        write_shard(shard_dir, samples, storage="final", aux_layers=aux_layers,
                    hidden_size=hidden_size, dtype=dtype, target_fingerprint=target_fingerprint,
                    config={"imported_from": str(src)})
        shards.append(shard_dir)
    return shards


def iter_as_specforge(shard_dir: Path) -> Iterator[dict[str, Any]]:
    """The samples of an eyas shard (storage "final") as SpecForge dicts."""
    if read_shard_manifest(shard_dir)["storage"] != "final":
        raise DataError("only storage 'final' has SpecForge's hidden_state (this shard is topk)",
                        path=shard_dir, field="storage")
    for s in iter_samples(shard_dir):
        yield {"input_ids": s["input_ids"], "loss_mask": s["loss_mask"],
               "hidden_state": s["final_hidden"].unsqueeze(0),
               "aux_hidden_state": s["aux_hidden"].unsqueeze(0)}


def export_specforge(shard_dirs: list[Path], dest: Path) -> list[Path]:
    """Write each sample of `shard_dirs` as ``dest/data_<n>.ckpt`` (SpecForge's layout).

    Each file is written to a temporary name and renamed. Returns the files written.
    Each tensor is copied out of the shard first: the rows read from a shard are views of
    the whole shard's tensor, and ``torch.save`` writes a view's entire storage, so every
    file would hold the whole shard (504 samples once became 30 GB instead of 123 MB).
    """
    from eyas.io import atomic_write

    dest = Path(dest)
    out = []
    n = 0
    for shard in shard_dirs:
        for sample in iter_as_specforge(shard):
            path = dest / f"data_{n}.ckpt"
            own = {key: t.clone(memory_format=torch.contiguous_format) for key, t in sample.items()}
            with atomic_write(path, "wb") as fh:
                torch.save(own, fh)
            out.append(path)
            n += 1
    return out
