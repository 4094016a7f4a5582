"""A drafter folder for the tiny target (random weights, exported as training exports one) and
a run folder with merged data, for the evaluator's end-to-end and flow tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def export_random_drafter(tiny_target: Path, out: Path, *, seed: int = 1,
                          draft_vocab: int = 2000) -> Path:
    """An exported drafter (SGLang folder) for the tiny target, seeded random weights, its
    manifest carrying a made-up training evaluation (acc_i)."""
    from eyas.extract.target import load_target_embeddings
    from eyas.layers import default_aux_layers
    from eyas.train.export import export_drafter
    from eyas.train.model import Drafter, DrafterConfig
    from eyas.train.vocab import DraftVocab

    cfg = json.loads((tiny_target / "config.json").read_text())
    torch.manual_seed(seed)
    drafter = Drafter(DrafterConfig.from_target(cfg, draft_vocab),
                      load_target_embeddings(tiny_target).float())
    vocab = DraftVocab(torch.arange(draft_vocab), cfg["vocab_size"])
    return export_drafter(out, drafter, vocab, default_aux_layers(cfg["num_hidden_layers"]),
                          target_config=cfg,
                          metrics={"acc": [0.5, 0.4, 0.3], "step": 3, "loss": 1.0,
                                   "simulated_acceptance_length": 0.86, "tokens": 10})
