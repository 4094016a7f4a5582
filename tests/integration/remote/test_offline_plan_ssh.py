"""`tasks.evaluate.offline_plan` with ``evaluate.offline: auto``: the target's size read where it
lives -- here in this process, on a host by its eyas entry point over SSH (the test sshd) -- and
a host that cannot run it does not stop the evaluation (it runs, saying why)."""

from __future__ import annotations

import pytest
import yaml
from support.train_fixtures import recipe

from eyas.config import load_config


def _auto(tmp_path, target):
    path = recipe(tmp_path, "tiny-offline-plan")
    raw = yaml.safe_load(path.read_text())
    raw["target"]["model"] = str(target)
    raw.setdefault("evaluate", {})["offline"] = "auto"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


@pytest.mark.ssh
def test_the_targets_size_is_read_here_or_on_the_host(tmp_path, tiny_target, sshd):
    from tasks.evaluate import offline_plan

    cfg = _auto(tmp_path, tiny_target)
    here = offline_plan(cfg, None)
    there = offline_plan(cfg, sshd.spec())  # the 'host' shares this filesystem
    assert here.run and there.run and here.setting == there.setting == "auto"
    assert here.target_bytes == there.target_bytes and here.target_bytes > 0
    no_eyas = sshd.spec(venv=str(tmp_path / "no-venv"))  # the entry point cannot start there
    failed = offline_plan(cfg, no_eyas)
    assert failed.run and f"could not read the target's size on {no_eyas.login} (" in failed.reason
