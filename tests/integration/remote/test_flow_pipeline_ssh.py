"""The eyas-pipeline flow against a GPU host reached over SSH (the test sshd on 127.0.0.1):
the merge runs there as a detached job while an old run's outputs are deleted. The host's
probe Python cannot import eyas (as on a real host): the merge must run with the Python of the
host's eyas venv."""

from __future__ import annotations

import pytest
import yaml
from support.flow_states import task_states
from support.pipeline_fixtures import make_old_hidden, make_prepared

from eyas.io import iter_jsonl
from eyas.manifest import verify_manifest

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def test_pipeline_over_ssh_merges_on_the_host_and_cleans(tmp_path, sshd, prefect_client):
    from blocks.gpu_host import GpuHost
    from flows.pipeline import run_pipeline

    data_root = sshd.data_root / "pipeline"
    workdir = data_root / "run2"
    make_prepared(workdir, ["a", "b"], records=300)
    make_old_hidden(data_root, files=20)
    GpuHost(**sshd.spec(data_root=str(data_root), num_gpus=1).model_dump()).save(
        "test-sshd", overwrite=True)
    cfg = tmp_path / "p.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": "ssh", "target": {"model": "unused"},
        "datasets": [{"name": n, "source": "unused.jsonl", "regenerate": False} for n in ("a", "b")],
        "merge": {"max_seq_len": 128},
    }))
    state = run_pipeline(str(cfg), str(workdir), host_block="test-sshd", phases=["merge"],
                         clean_paths=[str(data_root / "old-run")], confirm_clean=True, return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    merged = result["merge"]
    assert merged["records"] > 0 and merged["records"] + merged["dropped_unsupervised"] == 600
    assert verify_manifest(workdir / "merged") == []
    assert all(len(o["input_ids"]) <= 128 for _, o in iter_jsonl(workdir / "merged" / "train.jsonl"))
    assert not (data_root / "old-run").exists() and result["clean"]["bytes_freed"] > 0
    # The remote job's folder records what ran.
    jobs = sorted((data_root / ".eyas" / "jobs").iterdir())
    assert any(j.name.startswith("merge") and (j / "exit_code").read_text().strip() == "0" for j in jobs)

    # Rerun: the merge on the host is Cached (checked there); with merged/ moved away it runs
    # again, and the probe before it says so.
    again = run_pipeline(str(cfg), str(workdir), host_block="test-sshd", phases=["merge"],
                         return_state=True)
    assert task_states(prefect_client, again)["merge-on-host"] == "Cached"
    (workdir / "merged").rename(workdir / "merged-away")
    third = run_pipeline(str(cfg), str(workdir), host_block="test-sshd", phases=["merge"],
                         return_state=True)
    assert third.is_completed(), third.message
    assert task_states(prefect_client, third)["merge-on-host"] == "Completed"
    assert third.result()["status_before"]["next_phase"] == "merge"
    assert verify_manifest(workdir / "merged") == []
