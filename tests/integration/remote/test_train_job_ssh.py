"""`eyas.train.job.TrainJob`: what a training reads and runs, and its one `run` on a host over
SSH (the test sshd), where a refused configuration or data is a ConfigError (exit 2: a retry
cannot help) with training's own error line, not a failed job to retry."""

from __future__ import annotations

import pytest
from support.train_fixtures import merged_run, recipe

from eyas.config import load_config
from eyas.errors import ConfigError
from eyas.remote.hosts import SSHHost
from eyas.train.job import TrainJob


def test_a_training_reads_its_data_and_the_targets_config(tmp_path):
    cfg = load_config(recipe(tmp_path, "tiny-job", processes=2))
    job = TrainJob.of(cfg, tmp_path / "run", "offline", "/models/target", 2)
    hidden = tmp_path / "run" / "hidden"
    assert job.inputs() == {"train": f"{hidden}/train/shard-*/manifest.json",
                            "eval": f"{hidden}/eval/shard-*/manifest.json",
                            "target_config": "/models/target/config.json"}
    argv = job.argv("python3")
    assert argv[argv.index("--config") + 1] == str(tmp_path / "run" / ".eyas" / "train.yaml")
    assert argv[argv.index("--processes") + 1] == "2"
    assert "--die-with-parent" in job.argv("python3", die_with_parent=True)
    online = TrainJob.of(cfg, tmp_path / "run", "online", "/models/target", 1)
    assert online.inputs()["train"] == str(tmp_path / "run" / "merged" / "train.jsonl")


@pytest.mark.ssh
def test_a_refused_training_on_a_host_is_a_config_error(tmp_path, tiny_target, sshd):
    cfg = load_config(recipe(tmp_path, "tiny-job-refused"))
    workdir = merged_run(tmp_path, tiny_target)  # merged records, but no extraction's shards
    job = TrainJob.of(cfg, workdir, "offline", str(tiny_target), 1)
    said: list[str] = []
    with SSHHost(sshd.spec(data_root=str(sshd.data_root / "train-job"))) as host, \
            pytest.raises(ConfigError, match=r"refused its configuration or data:\n.*error") as exc:
        job.run(host, say=said.append)
    assert "no complete hidden-state shard (run extraction first)" in str(exc.value)
    assert "recipe 'tiny-job-refused', train" in str(exc.value) and any(line.startswith("started job train-tiny-job-refused-")
                                             for line in said)
    assert (workdir / ".eyas" / "train.yaml").is_file()  # the settings it was given, on the host
