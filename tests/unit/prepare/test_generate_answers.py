"""Phase 1 against servers that misbehave in ways the fault proxy cannot stage: a real HTTP
server on 127.0.0.1 that trickles its answer, and one that answers 200 with malformed
bodies. They are canned stand-ins for an OpenAI-compatible server (no model runs), which is
why they need no `transformers serve` and run in seconds."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson

from eyas.config import GenerationConfig
from eyas.conversation import Conversation, Message
from eyas.prepare.generate import FAILED_NAME, run_generation


@contextmanager
def canned_server(answer):
    """A loopback HTTP server; `answer(handler, body)` writes each /chat/completions reply."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            try:
                answer(self, body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up: what the deadline is for

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def _reply(handler, status: int, payload: bytes) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)


def _cfg(**kw) -> GenerationConfig:
    base = dict(concurrency=2, max_tokens=16, max_retries=1, backoff_s=0.05, max_backoff_s=0.1,
                timeout_s=30.0)
    base.update(kw)
    return GenerationConfig(**base)


def _conv(sid: str) -> Conversation:
    return Conversation(id=sid, messages=[Message("user", f"{sid}: question"),
                                          Message("assistant", "old")])


def _generate(convs, out: Path, base_url: str, cfg: GenerationConfig):
    return run_generation(convs, out, cfg, model="m", api_key=None, base_url=base_url,
                          progress_bar=False, raise_on_failure=False)


def test_a_server_trickling_one_byte_a_second_times_out_at_timeout_s_canned_server(tmp_path):
    """httpx's timeout bounds the gaps between reads; a server sending one byte a second
    never leaves a gap that long. generation.timeout_s bounds each request's whole time: the
    sample fails (after its retry) within a few timeouts, instead of holding its request for
    the ~100 s the answer takes to trickle in."""
    payload = orjson.dumps({"choices": [{"message": {"role": "assistant", "content": "x" * 80},
                                         "finish_reason": "stop"}]})

    def trickle(handler, body):
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        for i in range(len(payload)):
            handler.wfile.write(payload[i:i + 1])
            handler.wfile.flush()
            time.sleep(1.0)

    out = tmp_path / "o.jsonl"
    result: dict = {}
    with canned_server(trickle) as url:
        worker = threading.Thread(target=lambda: result.update(
            stats=_generate([_conv("a")], out, url, _cfg(timeout_s=1.5, concurrency=1))),
            daemon=True)
        worker.start()
        worker.join(60)  # two attempts of 1.5 s each; the trickle alone would take ~100 s
        assert not worker.is_alive(), "generation.timeout_s did not end the request"
    assert result["stats"].failures == 1
    failed = [json.loads(line) for line in (tmp_path / FAILED_NAME).read_text().splitlines()]
    assert failed[0]["id"] == "a" and "generation.timeout_s (1.5 s)" in failed[0]["error"]


MALFORMED = {
    "choices-a-dict": {"choices": {"message": {"content": "x"}}},
    "choices-an-int": {"choices": 3},
    "usage-a-list": {"choices": [{"message": {"role": "assistant", "content": "x"},
                                  "finish_reason": "stop"}], "usage": [1, 2]},
    "content-an-int": {"choices": [{"message": {"role": "assistant", "content": 7},
                                    "finish_reason": "stop"}]},
    "token-count-text": {"choices": [{"message": {"role": "assistant", "content": "x"},
                                      "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": "many"}},
}


def test_malformed_200_answers_fail_their_sample_naming_it_and_the_server_canned_server(tmp_path):
    """Each malformed 200 answer is a per-sample error in failed.jsonl that names the sample,
    the server and what is wrong -- not a raw KeyError / TypeError that ends the run, and
    never an integer written as an answer's text. The good sample is kept."""
    def answer(handler, body):
        sid = body["messages"][0]["content"].split(":", 1)[0]
        reply = MALFORMED.get(sid) or {"choices": [{"message": {"role": "assistant",
                                                                "content": "fine"},
                                                    "finish_reason": "stop"}]}
        _reply(handler, 200, orjson.dumps(reply))

    out = tmp_path / "o.jsonl"
    with canned_server(answer) as url:
        stats = _generate([_conv(s) for s in [*MALFORMED, "good"]], out, url, _cfg())
    assert stats.failures == len(MALFORMED) and stats.samples_done == 1
    assert [orjson.loads(line)["id"] for line in out.read_bytes().splitlines()] == ["good"]
    failed = {r["id"]: r["error"] for r in map(json.loads,
                                               (tmp_path / FAILED_NAME).read_text().splitlines())}
    assert set(failed) == set(MALFORMED)
    for sid, error in failed.items():
        assert url in error and f"sample {sid!r}" in error, error
    assert "choices" in failed["choices-a-dict"] and "choices" in failed["choices-an-int"]
    assert "usage" in failed["usage-a-list"] and "content" in failed["content-an-int"]
    assert "prompt_tokens" in failed["token-count-text"]
