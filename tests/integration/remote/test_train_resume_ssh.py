"""`eyas.train.resume` over SSH: the claim reads, moves and verifies through the host (its
eyas interpreter checks the export's manifest there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.paths import REPO

from eyas.layout import RunLayout
from eyas.manifest import write_manifest
from eyas.remote.hosts import connect
from eyas.train.resume import claim, verifies

pytestmark = [pytest.mark.ssh]

DATA = {"train": "a" * 64}


def test_a_finished_drafter_is_found_over_ssh_and_a_damaged_export_is_not(tmp_path, sshd):
    from eyas.config import load_config

    cfg = load_config(REPO / "recipes" / "tiny-demo.yaml")
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": 2})})
    run = RunLayout(tmp_path / "run")  # the 'host' shares this filesystem
    with connect(sshd.spec()) as h:
        assert claim(h, cfg, run.workdir, "offline", DATA, 1).finished is None
        run.checkpoint.mkdir()
        run.export.mkdir()
        (run.export / "model.safetensors").write_bytes(b"weights")
        write_manifest(run.export, phase="export", outputs=[run.export / "model.safetensors"])
        run.history.write_text(json.dumps([{"kind": "train", "step": 1}, {"kind": "train", "step": 2}]))
        assert verifies(h, str(run.export))
        found = claim(h, cfg, run.workdir, "offline", DATA, 1)
        assert found.finished is not None and found.finished["status"] == "complete"
        (run.export / "model.safetensors").write_bytes(b"damaged")
        assert not verifies(h, str(run.export))
        assert claim(h, cfg, run.workdir, "offline", DATA, 1).finished is None
        moved = claim(h, cfg, run.workdir, "online", DATA, 1)
    assert moved.moved_aside is not None and (Path(moved.moved_aside) / "checkpoint").is_dir()
