"""`eyas preflight` end to end on the tiny demo (the `preflight` flow, its table artifact, the
JSON line last, the cached GO), a NO-GO naming its fix, and the pipeline that runs preflight
first on a GPU host (over a real sshd) and stops there on NO-GO."""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest
import yaml
from support.paths import REPO
from support.preflight_fixtures import tiny_run
from support.sshd_fixtures import sshd  # noqa: F401

from eyas.cli import main
from eyas.preflight.run import CHECKS


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def _eyas(*argv: str) -> tuple[int, str]:
    """`eyas` in this process: (exit code, what it printed). Not capsys: Prefect's console
    log handler outlives a test and must not hold a test's closed stream."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    return code, out.getvalue()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_eyas_preflight_runs_every_check_and_prints_the_json_last(tmp_path, tiny_target,
                                                                 prefect_client):
    recipe, workdir = tiny_run(tmp_path, tiny_target)
    code, out = _eyas("preflight", "--config", str(recipe), "--workdir", str(workdir))
    assert code == 0, out
    rep = _last_json(out)
    assert rep["ok"] is True, out
    assert [c["name"] for c in rep["checks"]] == list(CHECKS)
    for c in rep["checks"]:
        assert c["ok"] and set(c) >= {"name", "ok", "seconds", "detail"}
    assert rep["eta"]["extract_s"] > 0 and rep["eta"]["train_s"] > 0
    gate = {c["name"]: c for c in rep["checks"]}["overfit"]
    assert gate["figure"].startswith("accept length") and "offline evaluator" in gate["detail"]
    assert "SGLang's loading of the export not checked" in gate["partial"]
    assert "preflight: GO" in out
    art = prefect_client.read_latest_artifacts()
    table = [a for a in art if a.key == "preflight-tiny-demo"]
    assert table and "GO" in str(table[0].data) and "serving" in str(table[0].data)
    report = workdir / "preflight" / "report.json"
    made = report.stat().st_mtime_ns
    # The same host, recipe and code: the GO comes back from the cache, nothing rerun.
    code, out = _eyas("preflight", "--config", str(recipe), "--workdir", str(workdir), "--json")
    assert code == 0 and _last_json(out)["ok"] is True
    assert report.stat().st_mtime_ns == made


@pytest.mark.timeout(600)
def test_a_missing_target_is_a_no_go_naming_the_fix(tmp_path, tiny_target, prefect_client):
    recipe, workdir = tiny_run(tmp_path, tiny_target)
    raw = yaml.safe_load(recipe.read_text())
    raw["target"]["model"] = str(tmp_path / "models" / "gone")
    recipe.write_text(yaml.safe_dump(raw))
    code, out = _eyas("preflight", "--config", str(recipe), "--workdir", str(workdir))
    assert code == 1, out
    rep = _last_json(out)
    by = {c["name"]: c for c in rep["checks"]}
    assert rep["ok"] is False and list(by) == list(CHECKS)
    assert "does not exist on this host" in by["capture"]["detail"]
    assert "set target.model" in by["capture"]["fix"]
    assert not by["training"]["ok"] and not by["serving"]["ok"]
    assert "preflight: NO-GO" in out
    assert not (workdir / "preflight" / "manifest.json").exists()  # a NO-GO is never cached


@pytest.mark.ssh
@pytest.mark.timeout(900)
def test_the_pipeline_runs_preflight_first_on_a_host_and_stops_on_no_go(
        tmp_path, tiny_target, prefect_client, sshd):  # noqa: F811
    """On the host (a real sshd) preflight runs as a detached job; the host block's gpu_env
    reaches it (here: PYTHONPATH, so the job imports this checkout). A NO-GO (the target is
    not on the host) stops the pipeline before training."""
    from blocks.gpu_host import GpuHost
    from eyas.preflight.result import PreflightFailed
    from flows.pipeline import run_pipeline

    recipe, _ = tiny_run(tmp_path, tiny_target)
    _, workdir = tiny_run(sshd.data_root / "preflight-test", tiny_target)  # merged, on the host
    raw = yaml.safe_load(recipe.read_text())
    raw["target"]["model"] = str(sshd.data_root / "models" / "not-there")
    recipe.write_text(yaml.safe_dump(raw))
    spec = sshd.spec(gpu_env={"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")]).rstrip(os.pathsep)})
    GpuHost(**spec.model_dump()).save("preflight-host", overwrite=True)
    with pytest.raises(PreflightFailed, match="capture: target folder .*not-there"):
        run_pipeline(str(recipe), str(workdir), host_block="preflight-host", phases=["train"])
    rep = json.loads((workdir / "preflight" / "report.json").read_text())
    assert rep["ok"] is False and [c["name"] for c in rep["checks"]] == list(CHECKS)
    assert not (workdir / "drafter").exists()  # training never started
