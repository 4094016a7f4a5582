"""eyas.evaluate.loadgen: prompts, totals, and real load on a real `transformers serve` of the
tiny target, directly and behind `fault_proxy.FaultProxy` (stalls, dropped connections, 503,
4xx, a run deadline). Every failure case ends with a clean count, never a hang."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import httpx
import orjson
import pytest
from support.fault_proxy import Fault, FaultProxy

from eyas.errors import DataError, EyasError
from eyas.evaluate.loadgen import (
    MARKER,
    Prompt,
    RequestRecord,
    cycle,
    flush_cache,
    load_prompts,
    main,
    parse_results,
    run_load,
    summarize,
)
from eyas.proc import free_port
from eyas.serve import launch_server, served_model_name

QUESTIONS = ["What does a tokenizer do?", "Name a sorting algorithm.", "What is a list?",
             "Why write tests?", "What is a file?", "How do loops end?"]


def _write(path, records):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def _chat_prompts(n: int) -> list[Prompt]:
    return cycle([Prompt(f"q{i}", messages=({"role": "user", "content": q},))
                  for i, q in enumerate(QUESTIONS)], n)


# --------------------------------------------------------------------------- no server


def test_prompts_from_merged_records_stop_before_the_first_supervised_token(tmp_path):
    path = _write(tmp_path / "eval.jsonl", [
        {"id": "a", "input_ids": [5, 6, 7, 8, 9], "loss_mask": [0, 0, 1, 1, 0]},
        {"id": "b", "conversations": [{"from": "system", "value": "Be brief."},
                                       {"from": "human", "value": "Hi"},
                                       {"from": "gpt", "value": "Hello"}]},
        {"id": "c", "input_ids": [1, 2], "loss_mask": [0, 1]},
    ])
    a, b = load_prompts(path, 2)
    assert a == Prompt("a", input_ids=(5, 6))
    assert b.messages == ({"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "Hi"})
    assert len(load_prompts(path, 10)) == 3
    assert [p.id for p in cycle([a, b], 5)] == ["a", "b", "a", "b", "a"]


@pytest.mark.parametrize(("record", "field", "words"), [
    ({"input_ids": [1, 2], "loss_mask": [0, 0]}, "loss_mask", "no supervised token"),
    ({"input_ids": [1, 2], "loss_mask": [1, 1]}, "loss_mask", "no prompt"),
    ({"input_ids": [1, 2], "loss_mask": [0]}, "loss_mask", "same length"),
    ({"messages": [{"role": "assistant", "content": "x"}]}, "messages", "no user turn"),
    ({"text": "free text"}, "input_ids", "expected input_ids"),
])
def test_a_record_without_a_prompt_is_named_by_file_line_and_field(tmp_path, record, field, words):
    path = _write(tmp_path / "eval.jsonl", [{"id": "ok", "input_ids": [1, 2], "loss_mask": [0, 1]},
                                            record])
    with pytest.raises(DataError, match=words) as info:
        load_prompts(path, 5)
    assert (info.value.path, info.value.line, info.value.field) == (str(path), 2, field)


def test_missing_prompts_file_is_a_clean_error(tmp_path, capsys):
    with pytest.raises(DataError, match="file not found"):
        load_prompts(tmp_path / "none.jsonl", 3)
    assert main(["--base-url", "http://127.0.0.1:9", "--prompts", str(tmp_path / "none.jsonl")]) == 2
    assert "file not found" in capsys.readouterr().err


def test_totals_follow_sglang_accept_length_formula():
    recs = [RequestRecord("a", True, 1, 1.0, completion_tokens=30, spec_verify_ct=10),
            RequestRecord("b", True, 2, 1.0, completion_tokens=12, spec_verify_ct=6),
            RequestRecord("c", False, 3, 1.0, error="timeout: no complete answer within 2s"),
            RequestRecord("d", False, 1, 1.0, error="http 400: bad")]
    res = summarize(4, 5, recs, wall_s=2.0)
    assert (res.ok, res.failed, res.not_sent, res.retries) == (2, 2, 1, 3)
    assert res.completion_tokens == 42 and res.output_tok_s == 21.0
    assert res.accept_length == pytest.approx(42 / 16)  # Σ completion / Σ verify, bonus counted
    assert res.errors == {"http 400": 1, "timeout": 1}
    no_spec = [RequestRecord("x", True, 1, 1.0, completion_tokens=5)]
    assert summarize(1, 1, no_spec, wall_s=1.0).accept_length is None


def test_prompts_of_the_wrong_kind_are_refused_before_any_request():
    with pytest.raises(EyasError, match="needs token ids"):
        run_load("http://127.0.0.1:9", _chat_prompts(2), api="generate")
    with pytest.raises(EyasError, match="needs messages"):
        run_load("http://127.0.0.1:9", [Prompt("a", input_ids=(1, 2))], api="chat")


def test_a_server_that_is_not_there_fails_every_request_quickly():
    res = run_load("http://127.0.0.1:9", _chat_prompts(3), api="chat", batch_size=2,
                   max_retries=1, backoff_s=0.01, request_timeout_s=2)
    assert (res.ok, res.failed, res.not_sent) == (0, 3, 0)
    assert res.errors == {"connection": 3} and res.retries == 3


# --------------------------------------------------------------------------- real server


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_target):
    """(proxy, server root, model name): one `transformers serve` of the tiny target."""
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    with launch_server(tiny_target, log_path=log_path, device="cpu") as base_url:
        root = base_url.removesuffix("/v1")
        with FaultProxy(root) as proxy:
            yield proxy, root, served_model_name(tiny_target)


@pytest.fixture
def proxy(served):
    p = served[0]
    p.reset()
    yield p
    p.reset()


def _load(root, model, n, **kw):
    opts = dict(api="chat", model=model, max_tokens=6, request_timeout_s=60, max_retries=2,
                backoff_s=0.05)
    opts.update(kw)
    return run_load(root, _chat_prompts(n), **opts)


@pytest.mark.serve
@pytest.mark.slow  # bears the module's server start-up
@pytest.mark.parametrize("batch_size", [1, 3])
def test_load_on_a_real_server_counts_tokens_per_request(served, batch_size):
    _, root, model = served
    res = _load(root, model, 6, batch_size=batch_size)
    assert (res.ok, res.failed, res.not_sent, res.retries) == (6, 0, 0, 0), res.first_errors
    assert sorted(r.prompt_id for r in res.records) == sorted(p.id for p in _chat_prompts(6))
    for rec in res.records:
        assert 1 <= rec.completion_tokens <= 6 and rec.prompt_tokens > 0 and rec.latency_s > 0
        assert rec.spec_verify_ct is None  # no speculation in transformers serve
    assert res.completion_tokens == sum(r.completion_tokens for r in res.records)
    assert res.output_tok_s == pytest.approx(res.completion_tokens / res.wall_s)
    assert res.accept_length is None and not res.timed_out


@pytest.mark.serve
def test_a_stalled_request_times_out_is_retried_then_counted_failed(served, proxy):
    _, _, model = served
    proxy.add(Fault.slow(60), Fault.slow(60))  # the first request, and its one retry
    # The timeout sits between a real answer (< 1 s unloaded) and the stall.
    res = _load(proxy.base_url.removesuffix("/v1"), model, 3, batch_size=1, max_retries=1,
                request_timeout_s=8)
    assert (res.ok, res.failed) == (2, 1)
    assert res.errors == {"timeout": 1} and res.records[0].attempts == 2
    assert res.wall_s < 59  # bounded by the request timeout, not by the 60 s stall
    assert [s.action for s in proxy.chat_requests()][:2] == ["slow", "slow"]


@pytest.mark.serve
def test_dropped_connections_and_503_are_retried_until_answered(served, proxy):
    _, _, model = served
    proxy.add(Fault.drop(), Fault.status_code(503, retry_after="0"), Fault.drop())
    res = _load(proxy.base_url.removesuffix("/v1"), model, 2, batch_size=1, max_retries=3)
    assert (res.ok, res.failed, res.retries) == (2, 0, 3)
    assert res.records[0].attempts == 4 and res.records[0].completion_tokens >= 1
    actions = [s.action for s in proxy.chat_requests()]
    assert actions == ["drop", "status-503", "drop", "pass", "pass"]


@pytest.mark.serve
def test_a_connection_dropped_every_time_fails_that_request_only(served, proxy):
    _, _, model = served
    proxy.add(Fault.drop(), Fault.drop())
    res = _load(proxy.base_url.removesuffix("/v1"), model, 2, batch_size=1, max_retries=1)
    assert (res.ok, res.failed) == (1, 1) and res.errors == {"connection": 1}
    assert "q0:" in res.first_errors[0]


@pytest.mark.serve
def test_a_client_error_is_not_retried(served, proxy):
    _, _, model = served
    proxy.add(Fault.status_code(400))
    res = _load(proxy.base_url.removesuffix("/v1"), model, 1, batch_size=1, max_retries=3)
    assert (res.ok, res.failed, res.retries) == (0, 1, 0)
    assert res.errors == {"http 400": 1}
    assert len(proxy.chat_requests()) == 1


@pytest.mark.serve
def test_the_run_deadline_cancels_requests_in_flight_and_skips_the_rest(served, proxy):
    _, _, model = served
    proxy.rules.append(lambda body: Fault.slow(60))  # every request stalls
    start = time.monotonic()
    res = _load(proxy.base_url.removesuffix("/v1"), model, 6, batch_size=2, run_timeout_s=2,
                request_timeout_s=50)
    assert time.monotonic() - start < 30  # the 2 s deadline, not the 50 s request timeout
    assert res.timed_out and (res.ok, res.failed, res.not_sent) == (0, 2, 4)
    assert res.errors == {"deadline": 2}


@pytest.mark.serve
def test_the_command_prints_one_result_line_per_batch_size(served, tmp_path, capsys):
    _, root, model = served
    prompts = _write(tmp_path / "p.jsonl", [{"id": f"p{i}", "messages": [
        {"role": "user", "content": q}]} for i, q in enumerate(QUESTIONS[:3])])
    code = main(["--base-url", root, "--prompts", str(prompts), "--api", "chat", "--model", model,
                 "--num-prompts", "4", "--batch-sizes", "1,2", "--warmup", "1",
                 "--max-tokens", "4"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    results = parse_results(out)
    assert [r["batch_size"] for r in results] == [1, 2]
    assert all(r["ok"] == 4 and r["output_tok_s"] > 0 for r in results)
    assert sum(line.startswith(MARKER) for line in out) == 2
    assert any("holds 3 prompts" in line for line in out)  # 4 requests: one prompt repeats


# --------------------------------------------------------------------------- chat templates


def test_records_without_a_prompt_are_skipped_and_reported(tmp_path):
    path = _write(tmp_path / "eval.jsonl", [
        {"id": "none", "input_ids": [1, 2], "loss_mask": [1, 1]},
        {"id": "ok", "input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]},
        {"id": "answer-only", "messages": [{"role": "assistant", "content": "x"}]}])
    skipped = []
    assert [p.id for p in load_prompts(path, 5, on_skip=skipped.append)] == ["ok"]
    assert [(e.line, e.field) for e in skipped] == [(1, "loss_mask"), (3, "messages")]
    assert main(["--base-url", "http://127.0.0.1:9", "--prompts", str(path), "--num-prompts",
                 "1", "--batch-sizes", "1", "--max-retries", "0"]) == 0


@pytest.mark.parametrize("target", ["tiny", "kimi-replica"])
def test_messages_are_rendered_with_the_targets_chat_template(tmp_path, tiny_target, target):
    """MT-Bench / GSM8K / HumanEval-style records become the ids of the target's template with
    its generation prompt (the Kimi replica's ends in <think>, as Kimi-K2.5's does)."""
    from transformers import AutoTokenizer

    from eyas.evaluate.loadgen import chat_renderer

    if target == "tiny":
        folder = tiny_target
    else:
        from eyas.tiny import build_kimi_replica

        folder = build_kimi_replica()
    remote = target != "tiny"
    path = _write(tmp_path / "mtbench.jsonl", [
        {"id": "mt-81", "messages": [{"role": "user", "content": "Write a haiku about tea."}]},
        {"id": "HumanEval/0", "prompt": "def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n"}])
    a, b = load_prompts(path, 5, render=chat_renderer(str(folder), trust_remote_code=remote))
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=remote)
    text = tok.decode(list(a.input_ids))
    assert "Write a haiku about tea." in text and a.messages[0]["role"] == "user"
    assert "Add two numbers." in tok.decode(list(b.input_ids))
    if target == "kimi-replica":
        assert text.endswith("<|im_assistant|>assistant<|im_middle|><think>")
    expected = tok.apply_chat_template(list(a.messages), add_generation_prompt=True,
                                       tokenize=False)
    assert text == expected


# --------------------------------------------------------------------------- SGLang stand-in


@contextlib.contextmanager
def _sglang_standin(tmp_path, *flags, **env):
    """The SGLang stand-in (`sglang_standin/`, SGLang's HTTP shapes: SGLang needs a GPU) on a
    free port of 127.0.0.1; yields its root URL."""
    from support.serving_fixtures import STANDIN

    port = free_port()
    full = {**os.environ, "PYTHONPATH": str(STANDIN), "EYAS_STANDIN_STARTUP_S": "0",
            **{f"EYAS_STANDIN_{k}": str(v) for k, v in env.items()}}
    log = (tmp_path / f"standin-{port}.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", "--model-path",
                             str(tmp_path), "--port", str(port), *flags], env=full,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    root = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(root + "/health_generate", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, \
                (tmp_path / f"standin-{port}.log").read_text()
            time.sleep(0.1)
        yield root
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()


def test_streamed_answers_give_ttft_and_decode_speed_against_sglang_standin(tmp_path):
    """Batch-1 speed as users quote it: a request's decode tokens/s with the prefill (the first
    token) excluded, (t_last - t_first) / (n_last - n_first), and the time to first token apart
    (before: only the run's throughput, prefill included: 21 tokens / 0.6 s = 35 tok/s here)."""
    prompts = [Prompt(f"p{i}", input_ids=(1, 2, 3 + i)) for i in range(2)]
    with _sglang_standin(tmp_path, PREFILL_S=0.2, STEP_S=0.02) as root:
        res = run_load(root, prompts, max_tokens=21, stream=True)
        whole = run_load(root, prompts, max_tokens=21)
    assert res.ok == 2 and res.completion_tokens == 42
    # The stand-in sleeps 0.2 s before the first token and 20 ms per later one; a busy machine
    # only lengthens sleeps, so the checks are bounds that hold however loaded the runner is.
    for r in res.records:
        decode_s = r.latency_s - r.ttft_s
        assert r.ttft_s >= 0.19  # the prefill is in the time to first token ...
        assert decode_s >= 20 * 0.019  # ... and the 20 decode steps are not
        assert r.tpot_s >= 0.019
        # The prefill is not in the decode speed: 20 steps fit in what follows the first token
        # (counted over the whole request, 21 tokens, 20 * latency / 21 would exceed it).
        assert 20 * r.tpot_s <= decode_s + 1e-6
    assert res.ttft_s == pytest.approx(sum(r.ttft_s for r in res.records) / 2)
    assert res.tpot_ms == pytest.approx(1000 * sum(r.tpot_s for r in res.records) / 2)
    assert res.decode_tok_s == pytest.approx(1000 / res.tpot_ms)
    assert res.output_tok_s < res.decode_tok_s  # the prefill weighs on throughput only
    assert (whole.ok, whole.ttft_s, whole.decode_tok_s) == (2, None, None)


def test_streamed_speculative_answers_count_the_tokens_of_each_step_against_sglang_standin(
        tmp_path):
    """A speculative step brings several tokens at once: the decode speed counts tokens, not
    events, and SGLang's accept length comes from the last event (n-gram speculation here)."""
    prompts = [Prompt("p", input_ids=(1, 2, 3))]
    with _sglang_standin(tmp_path, "--speculative-algorithm", "NGRAM", STEP_S=0.03,
                         NGRAM_ACCEPT=1.0) as root:
        res = run_load(root, prompts, max_tokens=31, stream=True)
    # 30 tokens after the first, 3 per step of 30 ms (1 + B / 4 = 1.25 at batch 1); the
    # stand-in reports ceil(31 / 3) verifications.
    assert res.accept_length == pytest.approx(31 / 11)
    _assert_tokens_not_events(res)


def _assert_tokens_not_events(res):
    """Bounds on the stand-in's n-gram decode (10 steps of 3 tokens, >= 30 * 1.25 ms each) that a
    loaded runner cannot break: each token takes at least a third of a step, and 30 tokens' worth
    fit in the time after the first token (counting events, 10, would give 3x that)."""
    (r,) = res.records
    assert r.tpot_s >= 0.95 * 0.030 * 1.25 / 3
    assert 30 * r.tpot_s <= r.latency_s - r.ttft_s + 1e-6
    assert res.tpot_ms == pytest.approx(1000 * r.tpot_s)


def test_incremental_streams_read_as_whole_ones_against_sglang_standin(tmp_path):
    """eyas's servers stream deltas (``--incremental-streaming-output``: each event its new
    ``output_ids``, ``meta_info.completion_tokens`` the running total, as SGLang 0.5.23's
    TokenizerManager sends them); the reader counts the same tokens, speed and accept length as
    from a server that repeats the whole answer in every event."""
    from eyas.evaluate.sglang_server import INCREMENTAL

    prompts = [Prompt("p", input_ids=(1, 2, 3))]
    got = {}
    for mode, flags in (("whole", ()), ("incremental", (INCREMENTAL,))):
        with _sglang_standin(tmp_path, "--speculative-algorithm", "NGRAM", *flags,
                             STEP_S=0.03, NGRAM_ACCEPT=1.0) as root:
            got[mode] = run_load(root, prompts, max_tokens=31, stream=True)
    for res in got.values():
        assert res.ok == 1 and res.completion_tokens == 31
        assert res.accept_length == pytest.approx(31 / 11)
        _assert_tokens_not_events(res)


def test_an_incremental_stream_that_lost_an_event_fails_the_request_against_sglang_standin(
        tmp_path):
    """Deltas that do not add up to the server's own count: an event was lost; the request
    fails naming both counts (a whole-answer reader could not tell)."""
    from eyas.evaluate.sglang_server import INCREMENTAL

    with _sglang_standin(tmp_path, INCREMENTAL, DROP_EVENT=1) as root:
        res = run_load(root, [Prompt("p", input_ids=(1, 2))], max_tokens=8, stream=True,
                       max_retries=0)
    assert res.ok == 0
    assert res.first_errors == ["p: bad answer: the stream's output_ids add up to 7 tokens, "
                                "its meta_info.completion_tokens says 8 (events lost?)"]


def test_an_error_event_mid_stream_fails_the_request_against_sglang_standin(tmp_path):
    """SGLang turns an error during a streamed answer into an ``error`` event (status 200
    already sent): the request fails with its message, without retries."""
    with _sglang_standin(tmp_path, STREAM_ERROR=1) as root:
        res = run_load(root, [Prompt("p", input_ids=(1, 2))], max_tokens=8, stream=True,
                       max_retries=2)
    assert (res.ok, res.failed, res.retries) == (0, 1, 0)
    assert res.first_errors == ["p: error event: stand-in: failed mid-stream"]


def test_repeats_flush_the_prefix_cache_before_each_run_against_sglang_standin(tmp_path,
                                                                             capsys):
    flushes = tmp_path / "flushes.txt"
    prompts = _write(tmp_path / "p.jsonl", [{"id": "a", "input_ids": [1, 2, 3, 4],
                                             "loss_mask": [0, 0, 1, 1]}])
    args = ["--prompts", str(prompts), "--num-prompts", "2", "--batch-sizes", "1,2",
            "--max-tokens", "4", "--repeats", "3", "--flush-cache", "--warmup", "1"]
    with _sglang_standin(tmp_path, STEP_S=0.001, FLUSHES=flushes) as root:
        assert main(["--base-url", root, *args]) == 0
    results = parse_results(capsys.readouterr().out.splitlines())
    assert [(r["batch_size"], r["repeat"]) for r in results] == [
        (b, i) for b in (1, 2) for i in range(3)]
    assert all(r["cache_flushed"] is True and r["ok"] == 2 for r in results)
    assert len(flushes.read_text().splitlines()) == 6  # before each measured run, not warm-up
    with _sglang_standin(tmp_path, STEP_S=0.001, NO_FLUSH=1) as root:
        assert flush_cache(root).startswith("POST /flush_cache answered 404")
        assert main(["--base-url", root, *args[:-5], "--flush-cache"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("note: batch 1, run 1: prefix cache not flushed (POST "
                               "/flush_cache answered 404") for line in out), out
    assert all(r["cache_flushed"] is False for r in parse_results(out))
