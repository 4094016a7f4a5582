"""Training records for the Kimi replica (its 4,096-token vocabulary) that a drafter can learn."""

from __future__ import annotations

import torch


def replica_records(n: int, seed: int, prefix: str) -> list[dict]:
    """Token sequences of the replica's 4,096-token vocabulary, with repeats a drafter can learn
    (each sample cycles a short random phrase), loss on the second half."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        phrase = torch.randint(100, 4000, (int(torch.randint(3, 7, (1,), generator=g)),),
                               generator=g).tolist()
        ids = (phrase * 20)[:48]
        out.append({"id": f"{prefix}-{i}", "dataset": "toy", "input_ids": ids,
                    "loss_mask": [0] * 24 + [1] * 24})
    return out
