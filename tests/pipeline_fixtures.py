"""Prepared datasets and an old run's outputs, as the pipeline flow finds them on a host."""

from __future__ import annotations

import random
from pathlib import Path

from eyas.io import AtomicJsonlWriter
from eyas.manifest import write_manifest


def make_prepared(workdir: Path, names: list[str], records: int = 1500) -> None:
    """Tokenized datasets with manifests, as phase 2 leaves them."""
    rng = random.Random(0)
    for name in names:
        folder = workdir / "prepared" / name
        with AtomicJsonlWriter(folder / "tokenized_data.jsonl") as w:
            for i in range(records):
                n = rng.randint(20, 400)
                w.write({"id": f"{name}-{i}", "input_ids": [rng.randrange(1000) for _ in range(n)],
                         "loss_mask": [0] * (n // 2) + [1] * (n - n // 2)})
        write_manifest(folder, phase="tokenize", outputs=["tokenized_data.jsonl"], counts={"samples": records})


def make_old_hidden(root: Path, files: int = 400) -> int:
    folder = root / "old-run" / "hidden"
    folder.mkdir(parents=True)
    blob = b"\0" * 65536
    for i in range(files):
        (folder / f"shard-{i:05d}.safetensors").write_bytes(blob)
    return files * len(blob)
