"""The prepare-data flow end to end, under a real (temporary) Prefect server.

Phase 1 talks to a real `transformers serve` on 127.0.0.1 serving the tiny target.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from support.flow_states import task_states
from support.paths import REPO

from eyas.io import iter_jsonl, read_json
from eyas.manifest import read_manifest, verify_manifest

pytestmark = [pytest.mark.slow, pytest.mark.serve]


def small_recipe(tmp_path: Path, *, limit: int = 10, **merge) -> Path:
    raw = yaml.safe_load((REPO / "recipes" / "tiny-demo.yaml").read_text())
    for ds in raw["datasets"]:
        ds["limit"] = limit
    raw["generation"]["max_tokens"] = 16
    raw["merge"].update(merge)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_prepare_flow_end_to_end_then_cached_rerun(tmp_path, tiny_target, prefect_client):
    from flows.prepare import prepare_data

    recipe = small_recipe(tmp_path)
    workdir = tmp_path / "run"
    state = prepare_data(str(recipe), str(workdir), return_state=True)
    assert state.is_completed(), state.message
    stats = state.result()

    # Phase 1: real answers from the real server.
    answers = [o for _, o in iter_jsonl(workdir / "generated" / "demo_chat" / "responses.jsonl")]
    assert len(answers) == 10 and len({a["id"] for a in answers}) == 10
    assert all(a["conversations"][-1]["role"] == "assistant" for a in answers)
    assert len({a["conversations"][-1]["content"] for a in answers}) > 1
    # Phase 2: every dataset prepared, each verified by its manifest.
    for name in ("demo_chat", "demo_sharegpt", "demo_reasoning", "demo_long"):
        folder = workdir / "prepared" / name
        assert verify_manifest(folder) == [], name
        assert read_json(folder / "stats.json")["samples"] == 10
    # Phase 3: merged, shuffled, split; stats and manifest agree with the files.
    merged = workdir / "merged"
    assert verify_manifest(merged) == []
    train = [o for _, o in iter_jsonl(merged / "train.jsonl")]
    evals = [o for _, o in iter_jsonl(merged / "eval.jsonl")]
    assert len(train) + len(evals) == stats["records"] == read_json(merged / "stats.json")["records"]
    assert all(len(o["input_ids"]) == len(o["loss_mask"]) <= 1024 for o in train)
    assert (workdir / "reports" / "composition.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    first = task_states(prefect_client, state.state_details.flow_run_id)
    assert first["merge"] == "Completed"

    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    arts = prefect_client.read_artifacts(
        artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["tiny-demo-datasets", "tiny-demo-summary"]))
    )
    assert {a.type for a in arts} >= {"table", "markdown"}
    assert any("demo_long" in str(a.data) for a in arts if a.type == "table")
    # Answers the server cut at max_tokens (16 here) are counted in phase 1's manifest, the
    # dataset's statistics and the summary artifact, which says what was done with them.
    cut = sum("length" in a["finish_reasons"] for a in answers)
    assert read_manifest(workdir / "generated" / "demo_chat")["counts"]["cut_answers"] == cut
    chat_stats = read_json(workdir / "prepared" / "demo_chat" / "stats.json")
    assert chat_stats["cut_answers"] == cut and chat_stats["cut_answer_share"] == cut / 10
    table = next(str(a.data) for a in arts if a.type == "table")
    assert "cut_share" in table and "reject_reasons" in table  # per dataset, in the table
    summary_md = next(str(a.data) for a in arts if a.type == "markdown")
    line = (f"demo_chat: {cut} of 10 samples ({cut / 10:.1%}) hold an answer cut at max_tokens"
            " — kept, closing")
    assert (line in summary_md) == (cut > 0), summary_md

    # A rerun with unchanged inputs and config: nothing is redone.
    before = (merged / "train.jsonl").stat().st_mtime_ns
    state2 = prepare_data(str(recipe), str(workdir), return_state=True)
    assert state2.is_completed(), state2.message
    second = task_states(prefect_client, state2.state_details.flow_run_id)
    assert second["merge"] == "Cached"
    assert all(v == "Cached" for k, v in second.items()
               if k.startswith(("tokenize", "generate"))), second
    assert (merged / "train.jsonl").stat().st_mtime_ns == before

    # Outputs removed behind Prefect's back are rebuilt, not reported as cached.
    (workdir / "prepared" / "demo_long" / "tokenized_data.jsonl").unlink()
    state3 = prepare_data(str(recipe), str(workdir), return_state=True)
    assert state3.is_completed(), state3.message
    third = task_states(prefect_client, state3.state_details.flow_run_id)
    assert third["tokenize-demo_long"] == "Completed"
    assert verify_manifest(workdir / "prepared" / "demo_long") == []


def test_prepare_flow_bad_record_names_file_and_line(tmp_path, tiny_target, prefect_client):
    from flows.prepare import prepare_data

    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"id": "a", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n'
        '{"id": "b", "messages": [{"role": "user", "content": 5}]}\n'
    )
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "name": "bad-input", "target": {"model": "eyas:tiny"},
        "datasets": [{"name": "broken", "source": str(bad), "regenerate": False}],
    }))
    state = prepare_data(str(recipe), str(tmp_path / "run"), return_state=True)
    assert state.is_failed()
    assert f"{bad}:2" in state.message and "content" in state.message
    assert not (tmp_path / "run" / "prepared" / "broken" / "tokenized_data.jsonl").exists()
