"""Phase 1 (eyas.prepare.generate) against a real `transformers serve` behind a fault-injecting proxy.

The pure helpers (Retry-After parsing, backoff, torn-line repair, input checks) are tested
without a server; everything else talks HTTP to one real server on 127.0.0.1 serving the
tiny target (conftest's `tiny_target`), through `fault_proxy.FaultProxy`, which injects
429/500/4xx, dropped connections and slow answers, and records what the client really sent.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import signal
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
from support.fault_proxy import Fault, FaultProxy
from support.paths import REPO

from eyas import stopping
from eyas.config import GenerationConfig
from eyas.conversation import Conversation, Message
from eyas.errors import DataError
from eyas.manifest import read_manifest, verify_manifest
from eyas.prepare.generate import (
    EARLY_STOP_REJECTS,
    FAILED_NAME,
    REJECTS_NAME,
    GenerationIncomplete,
    GenProgress,
    RequestRejected,
    ServerOutputError,
    backoff_delay,
    generate_dataset,
    parse_retry_after,
    repair_torn_tail,
    run_generation,
)
from eyas.serve import launch_server, served_model_name

API_KEY = "sk-eyas-test-5ecret-0042"


# --------------------------------------------------------------------------- helpers


def _conv(sid: str, *, turns: int = 1, system: bool = False) -> Conversation:
    msgs = [Message("system", "You are terse.")] if system else []
    for t in range(turns):
        msgs.append(Message("user", f"{sid}: question {t} about python code"))
        msgs.append(Message("assistant", f"old answer {t} that must be replaced"))
    return Conversation(id=sid, messages=msgs)


def _sid(seen_body: dict) -> str:
    """The sample id a request was for (prompts start with ``<id>:``)."""
    first_user = next(m for m in seen_body["messages"] if m["role"] == "user")
    return first_user["content"].split(":", 1)[0]


def _cfg(**kw) -> GenerationConfig:
    base = dict(concurrency=2, max_tokens=16, max_retries=3, backoff_s=0.05, max_backoff_s=5.0,
                timeout_s=30.0)
    base.update(kw)
    return GenerationConfig(**base)


def _records(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


# --------------------------------------------------------------------------- pure helpers


def test_parse_retry_after_seconds_and_http_date():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 1.5 ") == 1.5
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 7, usegmt=True)
    assert parse_retry_after(date, now=now) == pytest.approx(7.0, abs=1.0)
    past = email.utils.formatdate(now - 100, usegmt=True)
    assert parse_retry_after(past, now=now) == 0.0


def test_backoff_grows_is_capped_and_honours_retry_after():
    cfg = GenerationConfig(backoff_s=1.0, max_backoff_s=10.0)
    rng = random.Random(0)
    for attempt in range(8):
        d = backoff_delay(attempt, cfg, None, rng)
        base = min(10.0, 2.0 ** attempt)
        assert 0.5 * base <= d <= base
    assert 4.0 <= backoff_delay(0, cfg, 4.0, rng) <= 4.4
    assert backoff_delay(0, cfg, 3600.0, rng) == 10.0  # capped at max_backoff_s


def test_repair_torn_tail_cuts_partial_last_line(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_bytes(b'{"id": "a"}\n{"id": "b"}\n{"id": "c", "conv')
    assert repair_torn_tail(p) == len(b'{"id": "c", "conv')
    assert p.read_bytes() == b'{"id": "a"}\n{"id": "b"}\n'
    assert repair_torn_tail(p) == 0
    q = tmp_path / "one.jsonl"
    q.write_bytes(b'{"id": "only", "tor')
    repair_torn_tail(q)
    assert q.read_bytes() == b""


def test_conversation_without_user_turn_is_a_data_error(tmp_path):
    convs = [_conv("s0"), Conversation("s1", [Message("system", "hi"), Message("assistant", "x")])]
    with pytest.raises(DataError, match=r"s1.*no user turn") as info:
        # Port 9 (discard) is never contacted: the input is checked before any request.
        run_generation(convs, tmp_path / "out.jsonl", _cfg(), model="m",
                       base_url="http://127.0.0.1:9/v1", progress_bar=False)
    assert info.value.line == 2 and info.value.field == "conversations"
    assert not (tmp_path / "out.jsonl").exists()


def test_empty_input_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="no conversations"):
        run_generation([], tmp_path / "o.jsonl", _cfg(), model="m",
                       base_url="http://127.0.0.1:9/v1", progress_bar=False)


def test_repeated_sample_id_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="appears twice"):
        run_generation([_conv("a"), _conv("a")], tmp_path / "o.jsonl", _cfg(), model="m",
                       base_url="http://127.0.0.1:9/v1", progress_bar=False)


def test_corrupt_complete_line_in_output_is_reported(tmp_path):
    out = tmp_path / "o.jsonl"
    out.write_bytes(b'{"id": "a"}\nnot json\n')
    with pytest.raises(DataError, match=r"o.jsonl:2"):
        run_generation([_conv("a")], out, _cfg(), model="m", base_url="http://127.0.0.1:9/v1",
                       progress_bar=False)


# --------------------------------------------------------------------------- real server


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_target):
    """(proxy, model name): one real server of the tiny target for the module, behind a proxy."""
    model_dir = tiny_target
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    with launch_server(model_dir, log_path=log_path, device="cpu") as base_url:
        upstream = base_url.removesuffix("/v1")
        with FaultProxy(upstream) as proxy:
            yield proxy, served_model_name(model_dir)


@pytest.fixture
def proxy(served):
    p, _ = served
    p.reset()
    yield p
    p.reset()


@pytest.fixture
def model(served):
    return served[1]


def _gen(convs, out, proxy, model, cfg=None, **kw):
    return run_generation(convs, out, cfg or _cfg(), model=model, api_key=API_KEY,
                          base_url=proxy.base_url, progress_bar=False, **kw)


@pytest.mark.serve
@pytest.mark.slow  # bears the module's server start-up
def test_answers_are_written_multi_turn_regenerated_and_manifested(tmp_path, proxy, model, caplog):
    caplog.set_level(logging.DEBUG)
    out = tmp_path / "generated" / "ds" / "responses.jsonl"
    convs = [_conv("s0"), _conv("s1", turns=2, system=True), _conv("s2")]
    progress: list[GenProgress] = []
    stats = _gen(convs, out, proxy, model, on_progress=progress.append)

    assert stats.samples_done == 3 and stats.failures == 0 and stats.samples_skipped == 0
    assert stats.requests == 4 and stats.retries == 0  # s1 has two user turns
    assert stats.prompt_tokens > 0 and stats.completion_tokens > 0
    assert progress[0] == GenProgress(0, 3) and progress[-1] == GenProgress(3, 3)

    recs = _records(out)
    assert [r["id"] for r in recs] == ["s0", "s1", "s2"]  # input order after the final rewrite
    multi = recs[1]
    roles = [m["role"] for m in multi["conversations"]]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    assert all("old answer" not in m["content"] for m in multi["conversations"])
    assert len(multi["finish_reasons"]) == 2 and multi["finish_reason"] in ("length", "stop")
    assert multi["usage"]["completion_tokens"] > 0

    # The second turn's request carried the model's own first answer, not the old one.
    s1_reqs = [s.body for s in proxy.chat_requests() if _sid(s.body) == "s1"]
    assert len(s1_reqs) == 2
    second = s1_reqs[1]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert second[2]["content"] == multi["conversations"][2]["content"]
    assert s1_reqs[0]["model"] == model and s1_reqs[0]["max_tokens"] == 16

    manifest = read_manifest(out.parent)
    assert manifest["phase"] == "generate" and manifest["counts"]["samples"] == 3
    assert verify_manifest(out.parent) == []

    # The key went in the Authorization header only, and nowhere on disk or in the logs.
    assert {s.authorization for s in proxy.chat_requests()} == {f"Bearer {API_KEY}"}
    for f in out.parent.rglob("*"):
        if f.is_file():
            assert API_KEY not in f.read_text(errors="replace"), f
    assert API_KEY not in caplog.text

    # Everything done: a rerun sends nothing and leaves the file alone.
    before = len(proxy.chat_requests())
    again = _gen(convs, out, proxy, model)
    assert again.requests == 0 and again.samples_skipped == 3 and again.samples_done == 0
    assert len(proxy.chat_requests()) == before

    # A smaller input (a lower `limit`): no request, the extra record leaves the final file.
    fewer = _gen(convs[:2], out, proxy, model)
    assert fewer.requests == 0 and len(proxy.chat_requests()) == before
    assert [r["id"] for r in _records(out)] == ["s0", "s1"]
    assert read_manifest(out.parent)["counts"]["samples"] == 2
    assert verify_manifest(out.parent) == []


@pytest.mark.serve
def test_429_waits_at_least_retry_after(tmp_path, proxy, model):
    proxy.add(Fault.status_code(429, retry_after="1"))
    stats = _gen([_conv("a")], tmp_path / "o.jsonl", proxy, model, _cfg(concurrency=1))
    seen = proxy.chat_requests()
    assert [s.action for s in seen] == ["status-429", "pass"]
    assert seen[1].t - seen[0].t >= 1.0
    assert stats.retries == 1 and stats.samples_done == 1


@pytest.mark.serve
def test_500_and_dropped_connection_are_retried(tmp_path, proxy, model):
    proxy.add(Fault.status_code(500), Fault.drop(), Fault.status_code(503))
    out = tmp_path / "o.jsonl"
    stats = _gen([_conv("a")], out, proxy, model, _cfg(concurrency=1))
    assert [s.action for s in proxy.chat_requests()] == ["status-500", "drop", "status-503", "pass"]
    assert stats.retries == 3 and stats.requests == 4
    assert [r["id"] for r in _records(out)] == ["a"]


@pytest.mark.serve
def test_slow_answer_times_out_and_is_retried(tmp_path, proxy, model):
    proxy.add(Fault.slow(6.0))
    out = tmp_path / "o.jsonl"
    stats = _gen([_conv("a")], out, proxy, model, _cfg(concurrency=1, timeout_s=3.0))
    actions = [s.action for s in proxy.chat_requests()]
    assert actions[0] == "slow" and actions[-1] == "pass"
    assert stats.retries >= 1 and stats.samples_done == 1
    # The retry was sent before the slow answer could have come (the client timed out).
    seen = proxy.chat_requests()
    assert seen[1].t - seen[0].t < 6.0


@pytest.mark.serve
def test_401_stops_at_once_names_the_key_variable_not_the_key(tmp_path, proxy, model, caplog):
    caplog.set_level(logging.DEBUG)
    echo = {"error": {"message": f"Incorrect API key provided: {API_KEY}"}}
    proxy.rules.append(lambda body: Fault.status_code(401, body=echo))
    out = tmp_path / "o.jsonl"
    with pytest.raises(RequestRejected) as info:
        _gen([_conv("a"), _conv("b"), _conv("c")], out, proxy, model, _cfg(concurrency=1))
    err = info.value
    assert err.status == 401 and err.sample_id == "a"
    assert "HTTP 401" in str(err) and "'a'" in str(err) and "EYAS_API_KEY" in str(err)
    assert "Incorrect API key provided" in str(err)
    assert API_KEY not in str(err) and API_KEY not in caplog.text
    assert len(proxy.chat_requests()) == 1  # not retried, and the run stopped
    assert read_manifest(tmp_path) is None


@pytest.mark.serve
def test_400_fails_that_sample_without_retry_others_finish(tmp_path, proxy, model):
    proxy.rules.append(lambda body: Fault.status_code(
        400, body={"detail": "prompt too long"}) if _sid(body) == "b" else None)
    out = tmp_path / "o.jsonl"
    with pytest.raises(GenerationIncomplete, match=r"1 of 3 samples failed") as info:
        _gen([_conv("a"), _conv("b"), _conv("c")], out, proxy, model)
    assert info.value.stats.failures == 1 and info.value.stats.samples_done == 2
    assert [_sid(s.body) for s in proxy.chat_requests()].count("b") == 1
    failed = _records(tmp_path / FAILED_NAME)
    assert [f["id"] for f in failed] == ["b"]
    assert "HTTP 400" in failed[0]["error"] and "prompt too long" in failed[0]["error"]


@pytest.mark.serve
def test_exhausted_retries_then_rerun_requests_only_the_missing_ids(tmp_path, proxy, model):
    proxy.rules.append(lambda body: Fault.status_code(500) if _sid(body) == "s2" else None)
    out = tmp_path / "responses.jsonl"
    convs = [_conv(f"s{i}") for i in range(4)]
    cfg = _cfg(max_retries=2)
    with pytest.raises(GenerationIncomplete) as info:
        _gen(convs, out, proxy, model, cfg)
    assert info.value.stats.failures == 1 and info.value.stats.retries == 2
    assert str(tmp_path / FAILED_NAME) in str(info.value)
    assert sorted(r["id"] for r in _records(out)) == ["s0", "s1", "s3"]
    assert [f["id"] for f in _records(tmp_path / FAILED_NAME)] == ["s2"]
    assert read_manifest(tmp_path) is None  # visibly incomplete

    proxy.reset()
    stats = _gen(convs, out, proxy, model, cfg)
    assert [_sid(s.body) for s in proxy.chat_requests()] == ["s2"]
    assert stats.samples_skipped == 3 and stats.samples_done == 1
    assert [r["id"] for r in _records(out)] == ["s0", "s1", "s2", "s3"]
    assert not (tmp_path / FAILED_NAME).exists()
    assert verify_manifest(tmp_path) == []


@pytest.mark.serve
def test_interrupted_run_with_torn_line_resumes_with_only_missing_ids(tmp_path, proxy, model):
    out = tmp_path / "responses.jsonl"
    convs = [_conv(f"s{i}") for i in range(6)]

    async def interrupted() -> None:
        task = asyncio.current_task()

        def stop_after_two(p: GenProgress) -> None:
            if p.done >= 2:
                task.cancel()

        await generate_dataset(convs, out, _cfg(concurrency=2), model=model, api_key=API_KEY,
                               base_url=proxy.base_url, on_progress=stop_after_two,
                               progress_bar=False)

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(interrupted())
    done_first = [r["id"] for r in _records(out)]
    assert 2 <= len(done_first) < 6
    with open(out, "ab") as fh:  # a crash in the middle of writing a record
        fh.write(b'{"id": "s5", "conversations": [{"role": "us')

    proxy.reset()
    stats = _gen(convs, out, proxy, model)
    requested = [_sid(s.body) for s in proxy.chat_requests()]
    missing = sorted(set(c.id for c in convs) - set(done_first))
    assert sorted(requested) == missing
    assert stats.samples_skipped == len(done_first)
    ids = [r["id"] for r in _records(out)]
    assert ids == [c.id for c in convs]  # each id exactly once, in input order
    assert Counter(ids).most_common(1)[0][1] == 1
    assert verify_manifest(tmp_path) == []


@pytest.mark.serve
def test_a_stop_ends_phase_1_at_the_answers_in_flight_keeps_those_received_and_the_rerun_equals_an_uninterrupted_run(
        tmp_path, proxy, model):
    """SIGTERM / Ctrl-C mid-generation (`eyas.stopping.request`, what their handler and the
    watcher thread call): the call ends within a second though two answers are still 20 s
    away, the answers received stay (whole lines, no manifest), and the rerun asks only for
    the missing ids and leaves the same bytes as an uninterrupted call."""
    convs = [_conv(f"s{i}") for i in range(6)]
    reference = tmp_path / "reference" / "responses.jsonl"
    _gen(convs, reference, proxy, model, _cfg(concurrency=2))

    proxy.reset()
    slow = {"s2", "s3", "s4", "s5"}
    proxy.rules.append(lambda body: Fault.slow(20.0) if _sid(body) in slow else None)
    out = tmp_path / "stopped" / "responses.jsonl"
    asked: list[float] = []

    def stop_after_two(p: GenProgress) -> None:
        if p.done >= 2 and not asked:
            asked.append(time.monotonic())
            stopping.request(signal.SIGTERM)

    try:
        with pytest.raises(stopping.StopRequested) as info:
            _gen(convs, out, proxy, model, _cfg(concurrency=2), on_progress=stop_after_two)
        took = time.monotonic() - asked[0]
    finally:
        stopping.reset()
    assert info.value.exit_code == 143
    assert took < 2.0, f"{took:.1f} s from the stop request to the end of the call"
    kept = [r["id"] for r in _records(out)]
    assert sorted(kept) == ["s0", "s1"], kept  # the answers in flight (s2, s3) are not
    assert out.read_bytes().endswith(b"\n")
    assert "2 answer(s) of this run kept" in str(info.value) and "4 still to ask" in str(info.value)
    assert read_manifest(out.parent) is None

    proxy.reset()
    stats = _gen(convs, out, proxy, model, _cfg(concurrency=2))
    assert sorted(_sid(s.body) for s in proxy.chat_requests()) == sorted(slow)
    assert stats.samples_skipped == 2 and stats.samples_done == 4
    assert out.read_bytes() == reference.read_bytes()
    assert verify_manifest(out.parent) == []


@pytest.mark.serve
def test_reasoning_kept_from_canned_responses(tmp_path, proxy, model):
    """Canned bodies (the tiny model does not reason): both field names servers use."""
    def canned(field: str, text: str) -> Fault:
        message = {"role": "assistant", "content": "answer", field: text}
        return Fault.respond({"choices": [{"index": 0, "message": message,
                                           "finish_reason": "stop"}],
                              "usage": {"prompt_tokens": 5, "completion_tokens": 7}})

    proxy.add(canned("reasoning_content", "think A"), canned("reasoning", "think B"))
    out = tmp_path / "o.jsonl"
    _gen([_conv("a"), _conv("b")], out, proxy, model, _cfg(concurrency=1))
    recs = {r["id"]: r for r in _records(out)}
    assert recs["a"]["conversations"][-1]["reasoning_content"] == "think A"
    assert recs["b"]["conversations"][-1]["reasoning_content"] == "think B"
    assert recs["a"]["usage"] == {"prompt_tokens": 5, "completion_tokens": 7}


@pytest.mark.serve
def test_unusable_200_body_is_retried(tmp_path, proxy, model):
    proxy.add(Fault.respond({"error": "overloaded"}))
    stats = _gen([_conv("a")], tmp_path / "o.jsonl", proxy, model, _cfg(concurrency=1))
    assert stats.retries == 1 and stats.samples_done == 1



@pytest.mark.serve
def test_answers_cut_at_max_tokens_are_marked_counted_and_named(tmp_path, proxy, model, caplog):
    """A server that cuts some answers (finish_reason "length"): 5 of 20 samples get a cut
    answer from the proxy, the others a real one from the server (which may cut them too)."""
    cut_ids = {"s03", "s07", "s11", "s12", "s19"}

    def cut_answer(body):
        if _sid(body) not in cut_ids:
            return None
        return Fault.respond({"choices": [{"index": 0, "finish_reason": "length",
                                           "message": {"role": "assistant", "content": "It is"}}],
                              "usage": {"prompt_tokens": 9, "completion_tokens": 16}})

    proxy.rules.append(cut_answer)
    caplog.set_level(logging.WARNING)
    out = tmp_path / "generated" / "ds" / "responses.jsonl"
    convs = [_conv(f"s{i:02d}") for i in range(20)]
    stats = _gen(convs, out, proxy, model, _cfg(max_tokens=64))

    recs = {r["id"]: r for r in _records(out)}
    cut_in_file = {sid for sid, r in recs.items() if "length" in r["finish_reasons"]}
    assert cut_ids <= cut_in_file  # the server's own answers may have been cut as well
    assert stats.cut_answers == len(cut_in_file)
    counts = read_manifest(out.parent)["counts"]
    assert counts["cut_answers"] == len(cut_in_file)
    assert counts["cut_answer_share"] == len(cut_in_file) / 20  # the dataset's cut share
    share = f"{100 * len(cut_in_file) / 20:.1f}%"
    assert f"{len(cut_in_file)} of 20 answers ({share}) were cut at max_tokens=64" in caplog.text
    # Read back, the cut turn says so: tokenization leaves its closing end-of-turn unsupervised.
    back = Conversation.from_json(recs["s07"])
    assert back.truncated and back.messages[-1].truncated
    assert [m.finish_reason for m in back.messages if m.role == "assistant"] == ["length"]


# --------------------------------------------------------------------------- sampling


@pytest.mark.serve
def test_top_p_goes_in_the_request_body_and_the_real_server_takes_it(tmp_path, proxy, model):
    """Thinking-mode sampling (Kimi-K2.5: temperature 1.0, top_p 0.95) reaches the server;
    without top_p the body carries none (the server's default)."""
    out = tmp_path / "o.jsonl"
    stats = _gen([_conv("a")], out, proxy, model, _cfg(temperature=1.0, top_p=0.95))
    (seen,) = proxy.chat_requests()
    assert seen.action == "pass" and seen.body["top_p"] == 0.95 and seen.body["temperature"] == 1.0
    assert stats.samples_done == 1 and _records(out)[0]["conversations"][-1]["role"] == "assistant"
    proxy.reset()
    _gen([_conv("b")], tmp_path / "p.jsonl", proxy, model)
    assert "top_p" not in proxy.chat_requests()[0].body


def test_top_p_is_a_probability():
    with pytest.raises(ValueError, match="top_p"):
        GenerationConfig(top_p=0.0)
    with pytest.raises(ValueError, match="top_p"):
        GenerationConfig(top_p=1.5)
    assert GenerationConfig().top_p is None


# --------------------------------------------------------------------------- server without parsers


@pytest.fixture(scope="module")
def kimi_markers():
    """The special strings of the Kimi replica's tokenizer and chat template."""
    from eyas.prepare.special_text import template_markers
    from eyas.prepare.tokenize import load_tokenizer
    from eyas.tiny import build_kimi_replica

    return template_markers(load_tokenizer(build_kimi_replica(), trust_remote_code=True))


def _unparsed(content: str) -> Fault:
    """An answer as SGLang returns Kimi's without --reasoning-parser / --tool-call-parser."""
    return Fault.respond({"choices": [{"index": 0, "finish_reason": "stop",
                                       "message": {"role": "assistant", "content": content}}],
                          "usage": {"prompt_tokens": 9, "completion_tokens": 12}})


UNPARSED_THINKING = "The user asks a sum. 2 + 2 = 4.</think>It is 4."
UNPARSED_TOOL_CALL = ("Let me look.<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
                      "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>")


@pytest.mark.serve
@pytest.mark.parametrize("on_bad", ["reject", "error"])
def test_stand_in_server_without_reasoning_parser_stops_the_run_early_naming_the_flags(
        tmp_path, proxy, model, kimi_markers, on_bad):
    """Stand-in for SGLang serving Kimi-K2.5 without parsers (the proxy answers every request
    with ``reasoning</think>answer`` in content): the run stops after the first refused
    answer ("error") or the first few ("reject"), not after the whole dataset, and says which
    server flags are missing; nothing of those answers is kept."""
    proxy.rules.append(lambda body: _unparsed(UNPARSED_THINKING))
    out = tmp_path / "generated" / "B1" / "responses.jsonl"
    convs = [_conv(f"s{i:02d}") for i in range(40)]
    with pytest.raises(ServerOutputError) as info:
        _gen(convs, out, proxy, model, _cfg(concurrency=1), special_text=kimi_markers,
             on_bad_answer=on_bad)
    msg = str(info.value)
    assert "--reasoning-parser kimi_k2 --tool-call-parser kimi_k2" in msg
    assert "'</think>'" in msg and "generation.base_url" in msg
    sent = len(proxy.chat_requests())
    assert sent == (EARLY_STOP_REJECTS if on_bad == "reject" else 1)
    assert f"{EARLY_STOP_REJECTS} of the first {EARLY_STOP_REJECTS} answers" in msg or on_bad == "error"
    assert not (out.parent / REJECTS_NAME).exists() and read_manifest(out.parent) is None
    assert not out.exists() or out.read_bytes() == b""

    # The server restarted with its parsers: the same run requests every sample again.
    proxy.reset()
    stats = _gen(convs[:3], out, proxy, model, special_text=kimi_markers, on_bad_answer=on_bad)
    assert stats.samples_done == 3 and stats.rejected == 0


@pytest.mark.serve
def test_a_single_answer_with_tool_calls_as_text_is_rejected_counted_and_the_run_finishes(
        tmp_path, proxy, model, kimi_markers, caplog):
    """One answer of 20 spells Kimi's tool-call markers (the others are the real server's):
    refused into rejects.jsonl with its reason, counted, the dataset finishes without it; the
    same file over a lower tokenize.max_rejected_share is a DataError."""
    proxy.rules.append(lambda body: _unparsed(UNPARSED_TOOL_CALL) if _sid(body) == "s07" else None)
    caplog.set_level(logging.WARNING)
    out = tmp_path / "generated" / "B8" / "responses.jsonl"
    convs = [_conv(f"s{i:02d}") for i in range(20)]
    stats = _gen(convs, out, proxy, model, special_text=kimi_markers, on_bad_answer="reject")
    assert stats.rejected == 1 and stats.samples_done == 19
    assert [r["id"] for r in _records(out)] == [c.id for c in convs if c.id != "s07"]
    (reject,) = _records(out.parent / REJECTS_NAME)
    assert reject["id"] == "s07" and reject["kind"] == "special-text"
    assert "'<|tool_calls_section_begin|>'" in reject["error"]
    assert reject["record"]["conversations"][-1]["content"] == UNPARSED_TOOL_CALL
    counts = read_manifest(out.parent)["counts"]
    assert counts["samples"] == 19 and counts["rejected"] == 1
    assert counts["rejected_reasons"] == {"special-text": 1}
    assert verify_manifest(out.parent) == []
    assert "1 of 20 answers refused" in caplog.text

    proxy.reset()
    again = _gen(convs, out, proxy, model, special_text=kimi_markers, on_bad_answer="reject")
    assert again.requests == 0 and again.samples_skipped == 20
    with pytest.raises(DataError, match=r"dataset 'B8': 1 of 20 records rejected \(5.00%\)"):
        _gen(convs, out, proxy, model, special_text=kimi_markers, on_bad_answer="reject",
             max_rejected_share=0.01)
    assert proxy.chat_requests() == []


def test_the_replica_recipe_keeps_the_random_toy_from_writing_kimis_markers(kimi_markers):
    """The Kimi replica is random: served by `transformers serve` it would write the template's
    markers anywhere, and phase 1 would refuse its answers. Its recipe biases exactly the
    markers decoding keeps (the ones decode(skip_special_tokens=True) drops need none)."""
    from transformers import AutoTokenizer

    from eyas.config import load_config
    from eyas.tiny import build_kimi_replica

    tok = AutoTokenizer.from_pretrained(build_kimi_replica(), trust_remote_code=True)
    kept = {tok.convert_tokens_to_ids(m) for m in kimi_markers.markers
            if m not in tok.all_special_tokens}
    recipe = load_config(REPO / "recipes" / "kimi-replica.yaml")
    bias = recipe.generation.extra_body["logit_bias"]
    assert {int(k) for k in bias} == kept and set(bias.values()) == {-100.0}
