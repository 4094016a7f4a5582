"""Merged-format records (``{"id", "dataset", "input_ids", "loss_mask"}``) from the tiny
target's own Q&A conversations, and their extraction shards: small real training data for the
tests, the benchmark and demos. Not used by a real run."""

from __future__ import annotations

from pathlib import Path

import orjson


def tiny_records(model_dir: Path, n: int, *, heldout: bool = False, offset: int = 0) -> list[dict]:
    """`n` chat-rendered Q&A records of the tiny target (held-out questions if `heldout`)."""
    from transformers import AutoTokenizer

    from eyas.tiny.model import encode_with_assistant_mask
    from eyas.tiny.qa import split_qa, training_messages

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    train, held = split_qa()
    items = (held if heldout else train)[offset : offset + n]
    out = []
    for qa in items:
        ids, mask = encode_with_assistant_mask(tok, training_messages(qa))
        out.append({"id": f"{'eval' if heldout else 'train'}-{qa.name}", "dataset": "tiny",
                    "input_ids": ids, "loss_mask": mask})
    return out


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def extract_shards(model_dir: Path, jsonl: Path, out: Path, *, storage: str,
                   shard_size: int = 8) -> Path:
    """Run F's extraction (eyas.extract) on `jsonl` into `out` (CPU, float32 compute)."""
    from eyas.extract.config import ExtractConfig
    from eyas.extract.run import extract

    cfg = ExtractConfig(storage=storage, shard_size=shard_size, device="cpu", topk=16)
    extract(jsonl, out, model_dir=model_dir, cfg=cfg)
    return out
