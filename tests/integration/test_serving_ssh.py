"""The serving benchmark's orchestration over a real sshd on 127.0.0.1, against a stand-in
server process that speaks SGLang 0.5.23's HTTP shapes (`sglang_standin/`; SGLang itself needs
a GPU): launch, health, sweep, stop, verdict; a server that never becomes healthy or crashes;
a sweep interrupted or killed mid-way (servers stopped, no orphan process)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
from support.serving_fixtures import MAX_TOKENS, REPO, leftovers, make_run, standin_config
from support.sshd_fixtures import EYAS_VENV, sshd  # noqa: F401
from support.terminal import as_in_a_terminal

from eyas.evaluate.serving import ServingError, run_serving_benchmark
from eyas.evaluate.serving_verdict import ROW_KEYS, verdict
from eyas.proc import free_port
from eyas.remote.hosts import SSHHost
from eyas.remote.jobs import list_jobs

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


@pytest.fixture
def run(tmp_path):
    return make_run(tmp_path)


@pytest.fixture
def spec(sshd, tmp_path):  # noqa: F811
    return sshd.spec(data_root=str(tmp_path / "data"), venv=str(EYAS_VENV))


def _bench(spec, cfg, run, lines):
    with SSHHost(spec) as host:
        return run_serving_benchmark(host, cfg, model_path=str(run["model"]),
                                     draft_model_path=str(run["drafter"]),
                                     prompts_path=str(run["prompts"]), say=lines.append)


def _assert_clean(spec, tmp_path):
    with SSHHost(spec) as host:
        jobs = list_jobs(host)
    assert jobs and all(j.state != "running" for j in jobs), jobs
    deadline = time.monotonic() + 10
    while leftovers(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers(str(tmp_path)) == []


def test_sweep_over_ssh_against_standin_with_sglang_http_shapes(spec, run, tmp_path):
    cfg = standin_config(run, free_port())
    lines: list[str] = []
    result = _bench(spec, cfg, run, lines)

    assert [tuple(r) for r in result.rows] == [ROW_KEYS] * 6
    got = {(r["mode"], r["num_steps"], r["batch_size"]): r for r in result.rows}
    assert set(got) == {(m, s, b) for m, s in [("baseline", None), ("eagle3", 3), ("eagle3", 5)]
                        for b in (1, 8)}
    for (mode, steps, _), row in got.items():
        assert row["output_tok_s"] > 0
        if mode == "baseline":
            assert row["accept_length"] is None and row["eagle_topk"] is None
        else:  # the stand-in verifies ceil(24 / (1 + 0.6 * steps)) times per request
            assert (row["eagle_topk"], row["num_draft_tokens"]) == (1, steps + 1)
            assert row["accept_length"] == pytest.approx(
                MAX_TOKENS / math.ceil(MAX_TOKENS / (1 + 0.6 * steps)))
    # The stand-in makes the drafter 2x faster at batch 1 and 0.64x at batch 8.
    assert result.verdict == verdict(result.rows)
    assert result.verdict.startswith("EAGLE-3 beats the baseline at batch 1 by ")
    assert "loses at batch 8" in result.verdict
    assert not result.warnings and result.sglang_version == "0.5.23"

    # Every request carried a held-out prompt (the tokens before the first supervised one).
    sent = [json.loads(x) for x in run["requests"].read_text().splitlines()]
    assert len(sent) == 3 * (1 + 2 * 8)  # per server: one warm-up, 8 per batch size
    held = {tuple(r["input_ids"][: r["loss_mask"].index(1)]) for r in run["held_out"]}
    assert {tuple(b["input_ids"]) for b in sent} == held
    assert all(b["sampling_params"] == {"max_new_tokens": MAX_TOKENS, "temperature": 0.0}
               for b in sent)

    commands = [s.command for s in result.servers]
    assert "--speculative-algorithm" not in commands[0]
    assert "--speculative-num-steps 5 --speculative-eagle-topk 1 " \
           "--speculative-num-draft-tokens 6" in commands[2]
    assert all(f"--host 127.0.0.1 --port {cfg.port}" in c for c in commands)
    assert sum(line.startswith("stopped job sglang-") for line in lines) == 3
    _assert_clean(spec, tmp_path)


def test_a_server_that_never_becomes_healthy_is_stopped_with_its_log_tail(spec, run, tmp_path):
    cfg = standin_config(run, free_port(), startup_timeout_s=4,
                         env={"EYAS_STANDIN_NEVER_HEALTHY": "1"})
    with pytest.raises(ServingError) as info:
        _bench(spec, cfg, run, [])
    text = str(info.value)
    assert "baseline server failed" in text and "did not answer" in text
    assert "/health_generate within 4s (last answer: 503)" in text
    assert "stand-in SGLang:" in text  # the server's own log, quoted
    _assert_clean(spec, tmp_path)


def test_a_crashing_eagle3_setting_is_recorded_and_the_sweep_goes_on(spec, run, tmp_path):
    cfg = standin_config(run, free_port(), batch_sizes=[1], num_prompts=2,
                         env={"EYAS_STANDIN_FAIL_STEPS": "5"})
    result = _bench(spec, cfg, run, [])
    assert [(r["mode"], r["num_steps"]) for r in result.rows] == [("baseline", None),
                                                                  ("eagle3", 3)]
    failed = result.servers[2]
    assert failed.knobs.num_steps == 5 and "ended (exit code 1)" in failed.error
    assert "RuntimeError: the stand-in was told to fail" in failed.error
    assert len(result.warnings) == 1 and "steps 5" in result.warnings[0]
    assert "(1 warning: see the result)" in result.verdict
    _assert_clean(spec, tmp_path)


def test_a_baseline_that_crashes_is_fatal(spec, run, tmp_path):
    cfg = standin_config(run, free_port(), env={"EYAS_STANDIN_EXIT": "3"})
    with pytest.raises(ServingError, match=r"ended \(exit code 3\)"):
        _bench(spec, cfg, run, [])
    _assert_clean(spec, tmp_path)


def test_a_host_without_the_inputs_is_refused_before_any_server(spec, run, tmp_path):
    cfg = standin_config(run, free_port())
    run["prompts"].write_text("")
    (run["drafter"] / "config.json").unlink()
    with pytest.raises(ServingError) as info:
        _bench(spec, cfg, run, [])
    assert "drafter" in str(info.value) and "held-out prompts" in str(info.value)
    with SSHHost(spec) as host:
        assert list_jobs(host) == []


def _driver(spec, cfg, tmp_path):
    return subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "support" / "serving_fixtures.py"),
         spec.model_dump_json(), cfg.model_dump_json(), str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        preexec_fn=as_in_a_terminal)


def _read_until(proc, marker: str, seen: list[str], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    for line in proc.stdout:
        seen.append(line.rstrip("\n"))
        if marker in line:
            return
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise AssertionError(f"no {marker!r} in:\n" + "\n".join(seen[-30:]))


def test_an_interrupted_sweep_stops_its_servers_and_leaves_no_orphan(spec, run, tmp_path):
    # Slow requests: the interrupt lands while the first EAGLE-3 server is under load.
    cfg = standin_config(run, free_port(), num_prompts=16,
                         env={"EYAS_STANDIN_STEP_S": "0.05"})
    proc = _driver(spec, cfg, tmp_path)
    seen: list[str] = []
    _read_until(proc, "eagle3 server healthy", seen)
    assert leftovers(str(run["model"]))  # the server and its child run
    os.kill(proc.pid, signal.SIGINT)  # Ctrl-C, once
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError("one Ctrl-C did not stop the sweep:\n" + out[-3000:]) from None
    seen += out.splitlines()
    assert proc.returncode != 0 and "KeyboardInterrupt" in out
    assert any(line.startswith("stopped job sglang-") and "eagle3" in line for line in seen)
    assert not any(line.startswith("VERDICT") for line in seen)
    _assert_clean(spec, tmp_path)


def test_a_killed_run_leaves_a_server_that_the_next_run_stops_first(spec, run, tmp_path):
    port = free_port()
    proc = _driver(spec, standin_config(run, port), tmp_path)
    _read_until(proc, "baseline server healthy", [])
    proc.kill()  # SIGKILL: no finally, nothing stopped
    proc.wait(timeout=30)
    with SSHHost(spec) as host:
        running = [j.job_id for j in list_jobs(host) if j.state == "running"]
    assert any(j.startswith(f"sglang-{port}-baseline-") for j in running)  # detached: survives

    lines: list[str] = []
    result = _bench(spec, standin_config(run, port, batch_sizes=[1], num_prompts=2,
                                         num_steps=[3]), run, lines)
    assert any("left running by an earlier run" in line and f"sglang-{port}-baseline" in line
               for line in lines)
    assert [r["mode"] for r in result.rows] == ["baseline", "eagle3"]
    _assert_clean(spec, tmp_path)
