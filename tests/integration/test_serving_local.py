"""The serving benchmark on this machine as the host (`LocalHost`: the same jobs, no SSH)
against the SGLang stand-in: failed requests are counted and warned about, never hidden."""

from __future__ import annotations

import sys

import pytest
from support.serving_fixtures import leftovers, make_run, standin_config

from eyas.evaluate.serving import run_serving_benchmark
from eyas.proc import free_port
from eyas.remote.hosts import HostSpec, LocalHost

pytestmark = pytest.mark.slow


def _bench(tmp_path, **overrides):
    run = make_run(tmp_path)
    host = LocalHost(HostSpec(kind="local", known_hosts=None, data_root=str(tmp_path / "data"),
                              python=sys.executable))
    cfg = standin_config(run, free_port(), batch_sizes=[1], num_prompts=4, warmup_requests=0,
                         max_retries=0, **overrides)
    result = run_serving_benchmark(host, cfg, model_path=str(run["model"]),
                                   draft_model_path=str(run["drafter"]),
                                   prompts_path=str(run["prompts"]), say=lambda _: None)
    assert leftovers(str(tmp_path)) == []
    return result


def test_failed_requests_leave_the_row_and_a_warning(tmp_path):
    result = _bench(tmp_path, num_steps=[3], env={"EYAS_STANDIN_500_EVERY": "4"})
    assert [r["mode"] for r in result.rows] == ["baseline", "eagle3"]
    assert result.warnings == [
        "baseline, batch 1: 1 of 4 requests failed and 0 were not sent (http 500: 1)",
        "steps 3 / topk 1 / 4 draft tokens, batch 1: 1 of 4 requests failed and 0 were not "
        "sent (http 500: 1)"]
    assert result.verdict.endswith("(2 warnings: see the result)")
    loads = [s.results[0] for s in result.servers]
    assert all((x["ok"], x["failed"]) == (3, 1) for x in loads)


def test_a_setting_whose_every_request_fails_gets_no_row(tmp_path):
    result = _bench(tmp_path, num_steps=[3, 5], env={"EYAS_STANDIN_500_STEPS": "5"})
    assert [(r["mode"], r["num_steps"]) for r in result.rows] == [("baseline", None),
                                                                  ("eagle3", 3)]
    (warning,) = result.warnings
    assert warning.startswith("steps 5 / topk 1 / 6 draft tokens, batch 1: no request succeeded")
    assert "http 500" in warning


def test_a_messages_prompt_file_is_rendered_with_the_targets_template(tmp_path, tiny_target):
    """MT-Bench-style records reach SGLang's /generate (the stand-in) as the token ids of the
    target's chat template with its generation prompt; a record without a prompt is skipped
    and named in the warnings, and the baseline does not fail."""
    import json

    from transformers import AutoTokenizer

    run = make_run(tmp_path)
    mtbench = tmp_path / "mt_bench.jsonl"
    records = [{"id": "81", "messages": [{"role": "user", "content": "Compose a travel blog."}]},
               {"id": "broken", "messages": [{"role": "assistant", "content": "no question"}]},
               {"id": "82", "messages": [{"role": "user", "content": "Draft an email."}]}]
    mtbench.write_text("".join(json.dumps(r) + "\n" for r in records))
    host = LocalHost(HostSpec(kind="local", known_hosts=None, data_root=str(tmp_path / "data"),
                              python=sys.executable))
    cfg = standin_config(run, free_port(), batch_sizes=[1], num_prompts=2, warmup_requests=0,
                         num_steps=[3], prompts=str(mtbench))
    result = run_serving_benchmark(host, cfg, model_path=str(tiny_target),
                                   draft_model_path=str(run["drafter"]),
                                   prompts_path=str(mtbench), say=lambda _: None)
    assert [r["mode"] for r in result.rows] == ["baseline", "eagle3"]
    assert any("skipped 1 record" in w and "mt_bench.jsonl:2" in w for w in result.warnings)
    tok = AutoTokenizer.from_pretrained(tiny_target)
    expected = [tok.apply_chat_template([records[i]["messages"][0]], add_generation_prompt=True,
                                        tokenize=True) for i in (0, 2)]
    expected = [list(e["input_ids"]) if hasattr(e, "keys") else list(e) for e in expected]
    sent = [json.loads(line)["input_ids"] for line in run["requests"].read_text().splitlines()]
    assert sent == expected * 2  # baseline, then EAGLE-3: the same two prompts
class _StopFails(LocalHost):
    """This machine, where stopping a job fails (the network, say) once `broken` is set."""

    broken = False

    def run(self, cmd, **kw):
        if self.broken and "/cancelled;" in cmd:
            from eyas.errors import RemoteError

            raise RemoteError("local: the network went away")
        return super().run(cmd, **kw)


def test_an_interrupt_stops_the_sweep_even_when_stopping_its_server_fails(tmp_path):
    """Ctrl-C during an EAGLE-3 server's turn, and its server cannot be stopped: the interrupt
    goes on up (before, the failure to stop was raised in its place, caught as that setting's
    failure, and the sweep went on to the next server)."""
    from eyas.remote.jobs import cancel, running_jobs

    run = make_run(tmp_path)
    spec = HostSpec(kind="local", known_hosts=None, data_root=str(tmp_path / "data"),
                    python=sys.executable)
    host = _StopFails(spec)
    cfg = standin_config(run, free_port(), batch_sizes=[1], num_prompts=2, warmup_requests=0)
    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        if line.startswith("eagle3 server healthy"):
            host.broken = True
            raise KeyboardInterrupt  # as Ctrl-C would, here

    try:
        with pytest.raises(KeyboardInterrupt):
            run_serving_benchmark(host, cfg, model_path=str(run["model"]),
                                  draft_model_path=str(run["drafter"]),
                                  prompts_path=str(run["prompts"]), say=say)
        assert any("could not stop" in line for line in said), said
        assert sum(line.startswith("starting eagle3 server") for line in said) == 1, said
    finally:
        plain = LocalHost(spec)
        for job_id in running_jobs(plain):
            cancel(plain, job_id, grace=3)
    assert leftovers(str(tmp_path)) == []


def test_ngram_baseline_repeats_and_flushes_against_sglang_standin(tmp_path):
    """The sweep serves SGLang's n-gram speculation beside the baseline and EAGLE-3, measures
    each point 3 times after emptying the prefix cache, gives rows with their spread, a
    per-request decode speed and TTFT, a verdict against both, and the draft and verification
    costs read from the served figures."""
    flushes = tmp_path / "flushes.txt"
    result = _bench(tmp_path, num_steps=[3, 5], repeats=3, ngram=True,
                    env={"EYAS_STANDIN_FLUSHES": str(flushes), "EYAS_STANDIN_PREFILL_S": "0.05"})
    assert [s.mode for s in result.servers] == ["baseline", "ngram", "eagle3", "eagle3"]
    assert "--speculative-algorithm NGRAM" in result.servers[1].command
    assert "--speculative-draft-model-path" not in result.servers[1].command
    assert len(flushes.read_text().splitlines()) == 4 * 3  # servers x batch sizes x repeats
    assert all(len(s.results) == 3 and all(r["cache_flushed"] for r in s.results)
               for s in result.servers)
    rows = {(r["mode"], r["num_steps"]): r for r in result.rows}
    assert set(rows) == {("baseline", None), ("ngram", None), ("eagle3", 3), ("eagle3", 5)}
    for r in rows.values():
        assert r["repeats"] == 3 and r["output_tok_s_min"] <= r["output_tok_s"] \
            <= r["output_tok_s_max"]
        assert r["decode_tok_s_min"] <= r["decode_tok_s"] <= r["decode_tok_s_max"]
        # A prefill of 50 ms; a loaded runner only lengthens it (the bound above is loose).
        assert 0.045 <= r["ttft_s"] < 0.5
    assert rows[("ngram", None)]["accept_length"] > 1
    # Steps of 30 ms: the baseline decodes at most ~33 tok/s per request at batch 1.
    assert 1000 / 30 / 3 < rows[("baseline", None)]["decode_tok_s"] <= 1.05 * 1000 / 30
    (comp,) = result.comparisons
    assert comp["metric"] == "decode_tok_s" and comp["repeats"] == 3
    assert [c["reference"] for c in result.ngram_comparisons] == ["ngram"]
    assert "SGLang's n-gram speculation" in result.verdict
    costs = result.draft_cost_measured
    # The stand-in's EAGLE-3 cycle costs 2 steps (60 ms) whatever the number of draft steps.
    assert 0.95 * 30 <= costs["target_step_ms"] < 3 * 30
    assert costs["verify_ms"] == pytest.approx(2 * costs["target_step_ms"], rel=0.25)
    assert abs(costs["draft_step_ms"]) < 0.3 * costs["target_step_ms"]
    assert costs["method"].startswith("fit")
    assert result.to_dict()["draft_cost_measured"] == costs


def _fake_nvidia_smi(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n"
                   "case \"$1\" in\n"
                   "  --query-gpu=*) printf '0, GPU-aaa, NVIDIA RTX PRO 6000, 90000, 97887\\n"
                   "1, GPU-bbb, NVIDIA RTX PRO 6000, 12, 97887\\n' ;;\n"
                   "  --query-compute-apps=*) printf 'GPU-aaa, 4242, python3, 89990\\n' ;;\n"
                   "esac\n")
    smi.chmod(0o755)
    return str(smi)


def test_a_busy_gpu_stops_the_benchmark_before_its_server_starts(tmp_path):
    """GPU memory is checked free before each server starts (nvidia-smi on the host, a fake
    one here: SGLang's GPU stand-in): a busy GPU is named with what holds it and nothing is
    started; the free GPU of CUDA_VISIBLE_DEVICES passes."""
    from eyas.evaluate.serving import ServingError

    run = make_run(tmp_path)
    host = LocalHost(HostSpec(kind="local", known_hosts=None, data_root=str(tmp_path / "data"),
                              python=sys.executable))
    said: list[str] = []
    cfg = standin_config(run, free_port(), batch_sizes=[1], num_prompts=2, warmup_requests=0,
                         num_steps=[3], nvidia_smi=_fake_nvidia_smi(tmp_path),
                         gpu_free_wait_s=0)
    with pytest.raises(ServingError) as info:
        run_serving_benchmark(host, cfg, model_path=str(run["model"]),
                              draft_model_path=str(run["drafter"]),
                              prompts_path=str(run["prompts"]), say=said.append)
    assert ("GPU 0 (NVIDIA RTX PRO 6000): 90000 of 97887 MiB in use by pid 4242 python3 "
            "(89990 MiB)") in str(info.value)
    assert "serving.gpu_busy_mib = 2048" in str(info.value)
    assert not any(line.startswith("starting") for line in said)
    assert not run["requests"].exists()

    env = {**cfg.server_env, "CUDA_VISIBLE_DEVICES": "1"}
    result = run_serving_benchmark(host, cfg.model_copy(update={"server_env": env}),
                                   model_path=str(run["model"]),
                                   draft_model_path=str(run["drafter"]),
                                   prompts_path=str(run["prompts"]), say=said.append)
    assert [r["mode"] for r in result.rows] == ["baseline", "eagle3"]
    assert said.count("GPUs [1] free") == 2
    assert leftovers(str(tmp_path)) == []
