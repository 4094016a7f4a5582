"""One overfit-gate run on the tiny target per test process (about a minute of CPU), shared by
the gate's tests and `eyas check-export`'s: the drafter (with EAGLE-3.1's ``fc_norm``, so that
its weights can be dropped on purpose) memorises the tiny target's greedy answers to two
prompts, and the offline evaluator measures it. Treat the folders as read-only (a judged copy
rewrites only evaluate/); copy an export to break it."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

DRAFT_TOKENS = 3
SAMPLES = 2


@dataclass(frozen=True)
class GateRun:
    target: Path
    merged: Path
    work: Path
    """The gate's folder: hidden/ (its shards), drafter/ (vocab/, export/), gate.json."""
    result: object
    """The `GateResult` of the clean export."""

    @property
    def export(self) -> Path:
        return self.work / "drafter" / "export"


@functools.lru_cache(maxsize=1)
def tiny_gate_run() -> GateRun:
    import torch

    from eyas.evaluate import overfit
    from eyas.extract.config import ExtractConfig
    from eyas.tiny import build_tiny_target
    from eyas.train.config import TrainConfig
    from eyas.train.tiny_data import tiny_records, write_jsonl

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="eyas-gate-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    target = build_tiny_target()
    merged = write_jsonl(root / "train.jsonl", tiny_records(target, 4))
    result = overfit.run_gate(
        work=root / "gate", model_dir=target, merged=merged,
        extract_cfg=ExtractConfig(device="cpu"),
        train_cfg=TrainConfig(device="cpu", draft_vocab_size=4100, fc_norm=True),
        draft_tokens=DRAFT_TOKENS, samples=SAMPLES, say=lambda _m: None)
    return GateRun(target, merged, root / "gate", result)
