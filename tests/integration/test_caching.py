"""tasks.caching: a cached result only while the output still holds, under a real Prefect
server (the session's test harness): deleted, corrupted, made from other inputs or settings,
or by other code -> the task runs again, and the next run is Cached again."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from eyas.io import write_json
from eyas.manifest import output_state, write_manifest, write_stamp


def make_output(folder: Path, inputs: dict[str, Path], settings: dict) -> None:
    """What a phase leaves: a data file, then a manifest recording inputs and settings."""
    folder.mkdir(parents=True, exist_ok=True)
    text = "".join(p.read_text() for p in inputs.values())
    (folder / "data.txt").write_text(text.upper() + json.dumps(settings))
    write_manifest(folder, phase="test", inputs=inputs, outputs=["data.txt"], config=settings)


# -- eyas.manifest.output_state ---------------------------------------------------------------
def test_output_state_names_what_does_not_hold(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("abc")
    out = tmp_path / "out"
    assert output_state(out, {"in": src}, {"k": 1})["problems"][0].endswith(
        "(output missing or interrupted)")
    make_output(out, {"in": src}, {"k": 1})
    state = output_state(out, {"in": src}, {"k": 1})
    assert state["problems"] == [] and set(state["inputs"]) == {"in"}
    assert "other settings" in output_state(out, {"in": src}, {"k": 2})["problems"][0]
    src.write_text("abd")
    assert "other inputs (in)" in output_state(out, {"in": src}, {"k": 1})["problems"][0]
    src.unlink()
    assert output_state(out, {"in": src}, {"k": 1})["inputs"] is None
    src.write_text("abc")
    (out / "data.txt").write_text("ABX{\"k\": 1}")  # same size, other bytes
    assert "checksum" in output_state(out, {"in": src}, {"k": 1})["problems"][0]


def test_output_state_with_a_stamp_and_patterns(tmp_path):
    shards = tmp_path / "hidden"
    for i in range(2):
        write_json(shards / f"shard-{i:05d}" / "manifest.json", {"i": i})
    out = tmp_path / "export"
    make_output(out, {}, {})
    stamp = tmp_path / "trained_from.json"
    inputs = {"train": f"{shards}/shard-*/manifest.json"}
    assert "other settings" in output_state(out, inputs, {"lr": 1}, stamp)["problems"][0]
    write_stamp(stamp, inputs, {"lr": 1})
    state = output_state(out, inputs, {"lr": 1}, stamp)
    assert state["problems"] == []
    assert sorted(state["inputs"]) == ["train/shard-00000/manifest.json",
                                       "train/shard-00001/manifest.json"]
    write_json(shards / "shard-00002" / "manifest.json", {"i": 2})  # a new shard: other data
    assert "other inputs" in output_state(out, inputs, {"lr": 1}, stamp)["problems"][0]


def test_manifest_command_runs_where_a_host_would(tmp_path):
    from eyas.manifest import command

    src = tmp_path / "in.txt"
    src.write_text("abc")
    out = tmp_path / "out"
    make_output(out, {"in": src}, {"k": 1})
    res = subprocess.run(command(sys.executable, "state", str(out), {"in": str(src)}, {"k": 1}),
                         shell=True, capture_output=True, text=True, check=True)
    assert json.loads(res.stdout.splitlines()[-1]) == output_state(out, {"in": src}, {"k": 1})


# -- VerifiedOutput under Prefect ------------------------------------------------------------
@pytest.fixture
def cached_flow(tmp_path, prefect_harness):
    """A flow running one cached task that makes `out` from `src` with `settings`."""
    from prefect import flow, task

    from tasks.caching import Output, VerifiedOutput

    src, out = tmp_path / "in.txt", tmp_path / "out"
    src.write_text("hello")
    calls = []

    def output(p):
        return Output(str(out), {"src": str(src)}, p["settings"])

    @task(name=f"make-{uuid.uuid4().hex[:6]}", persist_result=True,
          cache_policy=VerifiedOutput(output=output))
    def make(settings: dict) -> str:
        calls.append(settings)
        make_output(out, {"src": src}, settings)
        return (out / "data.txt").read_text()

    @flow(name="cached-flow")
    def run(settings: dict) -> str:
        fut = make.submit(settings)
        fut.wait()
        return fut.state.name

    def go(settings=None):
        return run({"k": 1} if settings is None else settings)

    return go, make, src, out, calls


def test_hit_only_while_the_output_holds(cached_flow):
    go, make, src, out, calls = cached_flow
    first = go()
    assert first == "Completed" and len(calls) == 1
    assert go() == "Cached" and len(calls) == 1

    (out / "data.txt").unlink()                       # output deleted
    assert go() == "Completed" and len(calls) == 2
    assert go() == "Cached"

    (out / "data.txt").write_text("x" * (out / "data.txt").stat().st_size)  # corrupted
    assert go() == "Completed" and len(calls) == 3
    assert go() == "Cached"

    assert go({"k": 2}) == "Completed" and len(calls) == 4   # settings changed
    assert go({"k": 2}) == "Cached"

    src.write_text("hello, again")                    # an input changed
    assert go({"k": 2}) == "Completed" and len(calls) == 5
    assert go({"k": 2}) == "Cached"


def test_changed_code_invalidates(cached_flow, monkeypatch):
    go, make, src, out, calls = cached_flow
    go()
    assert go() == "Cached"
    monkeypatch.setattr(make, "source_code", make.source_code + "\n# changed\n")
    assert go() == "Completed" and len(calls) == 2
    assert go() == "Cached"


def test_a_missing_input_means_no_cache(cached_flow):
    go, make, src, out, calls = cached_flow
    go()
    src.unlink()
    assert go() == "Failed"  # ran and said what is missing, not reported Cached
