"""The evaluate-drafter flow against a host reached over SSH (the test sshd on 127.0.0.1): the
evaluator runs there as a detached job (``python -m eyas.evaluate.run``), report.json comes
back, the HTML page lands in the run's folder on the host, and a serving section attaches there
with the host's own python (``attach-serving``)."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml
from support.evaluate_fixtures import export_random_drafter
from support.sshd_fixtures import EYAS_VENV
from support.train_fixtures import merged_run, recipe

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

SERVING = {"rows": [
    {"mode": "baseline", "batch_size": 1, "num_steps": None, "eagle_topk": None,
     "num_draft_tokens": None, "output_tok_s": 90.0, "accept_length": None},
    {"mode": "eagle3", "batch_size": 1, "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4,
     "output_tok_s": 120.0, "accept_length": 2.0}], "verdict": "beats the baseline at batch 1"}


def test_evaluate_over_ssh_runs_a_detached_job_and_the_report_lands_on_the_host(
        tmp_path, tiny_target, sshd, prefect_client):
    from blocks.gpu_host import GpuHost
    from eyas.manifest import verify_manifest
    from tasks.evaluate import evaluation_report_task

    data_root = sshd.data_root / "evaluate-ssh"
    spec = sshd.spec()
    GpuHost(host=spec.host, port=spec.port, user=spec.user, key_filename=spec.key_filename,
            known_hosts=spec.known_hosts, data_root=str(data_root), venv=str(EYAS_VENV),
            num_gpus=0).save("test-sshd-evaluate", overwrite=True)
    cfg = recipe(tmp_path, "tiny-evaluate-ssh")
    raw = yaml.safe_load(cfg.read_text())
    raw["evaluate"] = {"prompts_per_dataset": 2, "max_new_tokens": 8, "threads": 1,
                       "device": "cpu", "baselines": ["ngram"]}
    cfg.write_text(yaml.safe_dump(raw))
    workdir = merged_run(tmp_path, tiny_target)  # the 'host' shares this filesystem
    export_random_drafter(tiny_target, workdir / "drafter" / "export")

    from flows.evaluate import evaluate_drafter_flow

    result = evaluate_drafter_flow(str(cfg), str(workdir), host_block="test-sshd-evaluate")
    login = f"{spec.user}@127.0.0.1:{sshd.port}"
    out = workdir / "evaluate"
    assert result["host"] == login and result["html"] == str(out / "report.html")
    report = json.loads((out / "report.json").read_text())
    assert result["acceptance_length"] == report["acceptance_length"]
    assert set(report["baselines"]) == {"ngram"} and report["lossless"]["equal"]
    assert (out / "report.html").read_text().count("data:image/png;base64,") == 2
    jobs = list((data_root / ".eyas" / "jobs").iterdir())
    assert len(jobs) == 1 and (jobs[0] / "exit_code").read_text().strip() == "0"
    assert "eyas.evaluate.run" in (jobs[0] / "cmd").read_text()

    # The serving benchmark's rows attach on the host (report.json, page, manifest rewritten).
    from prefect import flow

    @flow
    def attach():
        host = GpuHost.load("test-sshd-evaluate").spec()
        return evaluation_report_task(report, str(workdir), "tiny-evaluate-ssh", "evaluate-ssh",
                                      host, serving=SERVING)

    published = attach()
    assert published["report"]["serving"] == SERVING
    assert json.loads((out / "report.json").read_text())["serving"] == SERVING
    assert (out / "report.html").read_text().count("data:image/png;base64,") == 3
    assert verify_manifest(out) == []


def test_evaluate_flow_runs_the_serving_benchmark_on_the_host(tmp_path, tiny_target, sshd,
                                                              prefect_client):
    """With `evaluate.serving` and a GPU host, the flow runs the serving benchmark there after
    the offline evaluation (against the SGLang stand-in: SGLang needs a GPU), and its rows
    and verdict land in the report."""
    from support.serving_fixtures import standin_config

    from blocks.gpu_host import GpuHost
    from eyas.proc import free_port
    from flows.evaluate import evaluate_drafter_flow

    data_root = sshd.data_root / "evaluate-serving-ssh"
    spec = sshd.spec()
    GpuHost(host=spec.host, port=spec.port, user=spec.user, key_filename=spec.key_filename,
            known_hosts=spec.known_hosts, data_root=str(data_root), venv=str(EYAS_VENV),
            num_gpus=1).save("test-sshd-serving", overwrite=True)
    cfg = recipe(tmp_path, "tiny-serving-ssh")
    raw = yaml.safe_load(cfg.read_text())
    serving = standin_config({"requests": tmp_path / "requests.jsonl"}, free_port(),
                             batch_sizes=[1, 2], num_steps=[3], num_prompts=4)
    raw["evaluate"] = {"prompts_per_dataset": 2, "max_new_tokens": 8, "threads": 1,
                       "device": "cpu", "baselines": ["ngram"],
                       "serving": serving.model_dump(mode="json")}
    cfg.write_text(yaml.safe_dump(raw))
    workdir = merged_run(tmp_path, tiny_target)
    export_random_drafter(tiny_target, workdir / "drafter" / "export")

    result = evaluate_drafter_flow(str(cfg), str(workdir), host_block="test-sshd-serving")
    report = json.loads((workdir / "evaluate" / "report.json").read_text())
    assert result["serving_verdict"] and report["serving"]["verdict"] == result["serving_verdict"]
    modes = {(r["mode"], r["batch_size"]) for r in report["serving"]["rows"]}
    assert modes == {("baseline", 1), ("baseline", 2), ("eagle3", 1), ("eagle3", 2)}
    requests = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert requests, "the stand-in server saw no request"


def test_a_target_too_big_for_the_host_skips_offline_and_serves_over_ssh(tmp_path, sshd,
                                                                        prefect_client):
    """The Kimi-shaped case on a host reached over SSH: the target's size is read there
    (``python -m eyas.evaluate.fit`` with the host's python; no nvidia-smi: its RAM), the
    offline evaluator is skipped, the benchmark runs against the SGLang stand-in, the
    serving-only report and the model card land on the host."""
    from test_flow_evaluate_kimi import kimi_run

    from blocks.gpu_host import GpuHost
    from eyas.manifest import verify_manifest
    from eyas.proc import free_port
    from eyas.slots import pool_dir
    from flows.evaluate import evaluate_drafter_flow
    from tasks.limits import gpu_pool_name

    spec = sshd.spec()
    GpuHost(host=spec.host, port=spec.port, user=spec.user, key_filename=spec.key_filename,
            known_hosts=spec.known_hosts, data_root=str(sshd.data_root / "evaluate-kimi-ssh"),
            venv=str(EYAS_VENV), num_gpus=8).save("test-sshd-kimi", overwrite=True)
    # The session's earlier tests made this loopback host's GPU pool with their own GPU
    # count (an existing pool is the operator's and is never resized): start from none.
    shutil.rmtree(pool_dir(gpu_pool_name(spec)), ignore_errors=True)
    cfg, workdir = kimi_run(tmp_path, free_port(), accept="0.6")
    result = evaluate_drafter_flow(str(cfg), str(workdir), host_block="test-sshd-kimi")
    out = workdir / "evaluate"
    report = json.loads((out / "report.json").read_text())
    assert report["offline"]["run"] is False and "the CPU (RAM)" in report["offline"]["reason"]
    # the recipe's servers: the target alone, SGLang's n-gram speculation, the drafter
    assert [r["mode"] for r in report["serving"]["rows"]] == ["baseline", "ngram", "eagle3"]
    assert not report["accept_check"]["flagged"]  # 24 / ceil(24 / 2.8) = 2.67 vs 2.70 simulated
    assert verify_manifest(out) == [] and "not run:" in (out / "report.html").read_text()
    card = (workdir / "drafter" / "export" / "README.md").read_text()
    assert result["model_card"].endswith("README.md") and "--tp-size 8" in card
