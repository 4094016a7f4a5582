"""eyas.evaluate.job: the evaluation's settings built once, its paths as the machine running it
reads them, and a missing drafter refused before any job starts. The job itself runs in the
flow tests (tests/integration/test_flow_evaluate.py, the stop drill) here and over SSH
(tests/integration/remote/test_flow_evaluate_ssh.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from support.paths import REPO

from eyas.config import PipelineConfig, load_config
from eyas.errors import DataError
from eyas.evaluate.job import EvaluateJob, drafter_of
from eyas.remote.hosts import HostSpec, LocalHost


def _recipe(tmp_path: Path, **evaluate) -> Path:
    raw = yaml.safe_load((REPO / "recipes" / "tiny-demo.yaml").read_text())
    raw["evaluate"].update(evaluate)
    raw["target"]["chat_template"] = "templates/chat.jinja"
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "chat.jinja").write_text("{{ messages }}")
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_here_the_recipes_paths_are_resolved_and_on_a_host_taken_as_written(tmp_path):
    """A recipe whose paths are still relative (`load_config` resolves them; a flow run from
    the UI may not): here against the recipe's folder, on a host as written."""
    raw = yaml.safe_load(_recipe(tmp_path, prompt_files=["prompts.jsonl"],
                                 drafter="mine/export").read_text())
    cfg = PipelineConfig.model_validate(raw).model_copy(update={"source_dir": tmp_path})
    here = EvaluateJob.of(cfg, "/runs/a", "/models/t", local=True)
    there = EvaluateJob.of(cfg, "/runs/a", "/models/t", local=False)
    assert here.cfg.prompt_files == [str(tmp_path / "prompts.jsonl")]
    assert there.cfg.prompt_files == ["prompts.jsonl"]
    assert here.drafter == str(tmp_path / "mine" / "export") == drafter_of(cfg, "/runs/a",
                                                                             local=True)
    assert there.drafter == "mine/export"
    assert here.chat_template == str(tmp_path / "templates" / "chat.jinja")
    assert there.chat_template == "templates/chat.jinja"
    # The recipe as given is untouched: the cache keys it as written.
    assert cfg.evaluate.prompt_files == ["prompts.jsonl"]


def test_the_command_and_its_settings(tmp_path):
    cfg = load_config(_recipe(tmp_path))
    job = EvaluateJob.of(cfg, "/runs/a b", "/models/t", local=False)
    assert job.drafter == "/runs/a b/drafter/export"  # the run's export
    argv = shlex.split(job.command("/venv/bin/python"))
    assert argv[:3] == ["/venv/bin/python", "-m", "eyas.evaluate.run"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--model"] == "/models/t" and flags["--drafter"] == "/runs/a b/drafter/export"
    assert flags["--out"] == "/runs/a b/evaluate"
    assert flags["--config"] == "/runs/a b/.eyas/evaluate.yaml"
    assert flags["--run-name"] == cfg.name
    assert job.prefix == "evaluate-" + cfg.name
    settings = job.settings()
    assert "drafter" not in settings and "serving" not in settings
    assert settings["prompt_files"] == ["eyas:demo/eval_prompts.jsonl"]
    assert settings["draft_tokens"] == cfg.evaluate.draft_tokens


def test_a_missing_drafter_is_refused_before_any_job_starts(tmp_path):
    cfg = load_config(_recipe(tmp_path))
    job = EvaluateJob.of(cfg, tmp_path / "run", "/models/t", local=True)
    with LocalHost(HostSpec.local(data_root=str(tmp_path))) as host, \
            pytest.raises(DataError, match="no trained drafter"):
        job.run(host, say=print)
    assert not (tmp_path / "run").exists()  # no settings file, no job folder
