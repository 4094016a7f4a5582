"""The eyas-pipeline flow on this machine: merge and deletion run at the same time."""

from __future__ import annotations

import threading

import pytest
import yaml
from support.flow_states import task_runs
from support.pipeline_fixtures import make_old_hidden, make_prepared

pytestmark = pytest.mark.slow


def test_merge_and_clean_run_at_the_same_time_then_status_rechecked(tmp_path, prefect_client,
                                                                   monkeypatch):

    import eyas.prepare.phases
    import tasks.remote
    from flows.pipeline import run_pipeline

    # A rendezvous: the merge and the deletion each wait there for the other. Run one after
    # the other, the first would wait in vain and fail; run at the same time, both pass.
    both_running = threading.Barrier(2, timeout=120)

    def meeting(fn):
        def wrapper(*args, **kwargs):
            both_running.wait()
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(eyas.prepare.phases, "merge_phase", meeting(eyas.prepare.phases.merge_phase))
    monkeypatch.setattr(tasks.remote, "execute_clean", meeting(tasks.remote.execute_clean))

    data_root = tmp_path / "data"
    workdir = data_root / "run2"
    names = ["a", "b", "c"]
    make_prepared(workdir, names, records=300)
    old_bytes = make_old_hidden(data_root)
    cfg = tmp_path / "p.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": "overlap", "target": {"model": "unused"},
        "datasets": [{"name": n, "source": "unused.jsonl", "regenerate": False} for n in names],
        "merge": {"max_seq_len": 256, "eval_fraction": 0.05},
    }))

    state = run_pipeline(str(cfg), str(workdir), data_root=str(data_root), phases=["merge"],
                         clean_paths=[str(data_root / "old-run" / "hidden")], confirm_clean=True,
                         return_state=True)
    assert state.is_completed(), state.message
    assert not both_running.broken
    result = state.result()
    assert result["clean"]["bytes_freed"] >= old_bytes
    assert not (data_root / "old-run" / "hidden").exists()
    assert (workdir / "merged" / "train.jsonl").exists()
    assert result["status_before"]["next_phase"] != result["status_after"]["next_phase"]  # merged now

    # The second probe waited for both (wait_for): it started after each had finished.
    runs = task_runs(prefect_client, state)
    by = {tr.name.split("-")[0]: tr for tr in runs if tr.name.startswith(("merge", "clean"))}
    statuses = sorted((tr for tr in runs if tr.name.startswith("probe-status")), key=lambda t: t.start_time)
    assert len(statuses) == 2
    assert statuses[1].start_time >= max(by["merge"].end_time, by["clean"].end_time)


def test_clean_refuses_paths_outside_the_data_root(tmp_path, prefect_client):
    from flows.pipeline import run_pipeline

    data_root = tmp_path / "data"
    workdir = data_root / "run"
    make_prepared(workdir, ["a"], records=50)
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    cfg = tmp_path / "p.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": "guard", "target": {"model": "unused"},
        "datasets": [{"name": "a", "source": "unused.jsonl", "regenerate": False}],
    }))
    state = run_pipeline(str(cfg), str(workdir), data_root=str(data_root), phases=["merge"],
                         clean_paths=[str(outside)], confirm_clean=True, return_state=True)
    assert state.is_failed()
    assert "outside" in state.message
    assert (outside / "keep.txt").read_text() == "mine"
