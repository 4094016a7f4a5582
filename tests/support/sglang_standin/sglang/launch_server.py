"""Stand-in for ``python -m sglang.launch_server``: SGLang 0.5.23's HTTP shapes, simulated work.

It takes the flags the serving benchmark sends (``--model-path``, ``--host``, ``--port``,
``--tp-size``, ``--trust-remote-code``, the ``--speculative-*`` ones; others are logged and
ignored) and answers, as SGLang 0.5.23 does:

- ``GET /health``, ``/health_generate``: 503 while "starting", then 200;
- ``POST /generate`` (``input_ids`` + ``sampling_params``): ``output_ids`` and ``meta_info``
  with ``prompt_tokens``, ``completion_tokens`` (always ``max_new_tokens``), and with
  speculation ``spec_verify_ct``, ``spec_accept_length`` = completion / verify;
- ``POST /generate`` with ``"stream": true``: server-sent events, ``data: {...}`` after the
  prefill (the first token) and after each decoding step, ``meta_info.completion_tokens``
  counting the tokens so far, then ``data: [DONE]``; each event repeats the whole answer so
  far (``text``, ``output_ids``), SGLang's default, or with ``--incremental-streaming-output``
  carries only the step's new ones (``meta_info`` still the running totals), as SGLang 0.5.23's
  ``TokenizerManager`` does in that mode;
- ``GET /server_info`` and ``/get_server_info``: ``internal_states[0].avg_spec_accept_length``;
- ``POST`` (or ``GET``) ``/flush_cache``: 200 "Cache flushed.", 400 while requests run.

Simulated decoding: a prefill of ``PREFILL_S`` (halved for a prompt already in the prefix
cache, until ``/flush_cache``) gives the first token; one step costs
``STEP_S * (1 + (B - 1) / 16)`` without speculation and ``STEP_S * (1 + B)`` with EAGLE-3
(B = requests in flight), and an EAGLE-3 step yields ``1 + ACCEPT * num_steps`` tokens on
average (verify count = ceil(tokens / that)). So the drafter wins at batch 1 and loses at large
batches, as on a real GPU when verification is dear. ``--speculative-algorithm NGRAM`` (SGLang's
n-gram speculation, no draft model; ``--speculative-ngram-*`` flags accepted) yields
``1 + NGRAM_ACCEPT * 2`` tokens per step at ``STEP_S * (1 + B / 4)``.

Controls (environment): EYAS_STANDIN_STARTUP_S (seconds of 503, default 0.5),
EYAS_STANDIN_NEVER_HEALTHY=1, EYAS_STANDIN_EXIT (exit at once with this code),
EYAS_STANDIN_FAIL_STEPS (exit 1 at once when ``--speculative-num-steps`` is this),
EYAS_STANDIN_500_STEPS (answer every ``/generate`` with 500 when ``--speculative-num-steps``
is this), EYAS_STANDIN_500_EVERY (answer every N-th ``/generate`` with 500),
EYAS_STANDIN_STEP_S (default 0.01), EYAS_STANDIN_ACCEPT (default 0.6), EYAS_STANDIN_PREFILL_S
(default 0), EYAS_STANDIN_NGRAM_ACCEPT (default 0.3), EYAS_STANDIN_JITTER (each step's cost
times a uniform factor in 1 ± this, default 0), EYAS_STANDIN_FLUSHES (append a line here per
/flush_cache), EYAS_STANDIN_NO_FLUSH=1 (no /flush_cache route: 404, as an older server),
EYAS_STANDIN_STREAM_ERROR=1 (a streamed answer breaks off after its first token with SGLang's
error event), EYAS_STANDIN_DROP_EVENT=1 (a streamed answer's second event is never sent),
EYAS_STANDIN_REQUESTS (append each /generate body here, one JSON line),
EYAS_STANDIN_IGNORE_TERM=1 (survive SIGTERM: only SIGKILL stops it).
A ``--speculative-draft-model-path`` that SGLang could not load (no ``config.json`` naming an
EAGLE-3 architecture) makes it exit 1 at start-up, as SGLang does.
It also starts a child process, as SGLang starts its scheduler processes, to show that stopping
the server leaves no orphan.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ENV = os.environ


def _draft_problem(path: str) -> str | None:
    """What keeps SGLang from loading an EAGLE-3 drafter folder: no readable config.json
    naming an EAGLE-3 architecture; None when it loads (the weights are not read here)."""
    folder = os.path.abspath(path)
    config = os.path.join(folder, "config.json")
    if not os.path.isfile(config):
        return f"{config} not found"
    try:
        with open(config) as fh:
            arch = (json.load(fh).get("architectures") or [""])[0]
    except ValueError as exc:
        return f"{config}: {exc}"
    if "Eagle3" not in arch:
        return f"{config}: architecture {arch!r} is not an EAGLE-3 drafter"
    return None


def main() -> int:
    p = argparse.ArgumentParser(prog="sglang.launch_server (stand-in)")
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--incremental-streaming-output", action="store_true")
    p.add_argument("--speculative-algorithm")
    p.add_argument("--speculative-draft-model-path")
    p.add_argument("--speculative-num-steps", type=int)
    p.add_argument("--speculative-eagle-topk", type=int)
    p.add_argument("--speculative-num-draft-tokens", type=int)
    for name in ("min-bfs-breadth", "max-bfs-breadth", "max-trie-depth", "capacity"):
        p.add_argument(f"--speculative-ngram-{name}", type=int)
    p.add_argument("--speculative-ngram-match-type", choices=["BFS", "PROB"])
    args, unknown = p.parse_known_args()
    print(f"stand-in SGLang: {vars(args)} ignored={unknown}", flush=True)
    fail_steps = ENV.get("EYAS_STANDIN_FAIL_STEPS")
    if "EYAS_STANDIN_EXIT" in ENV or (
            fail_steps and str(args.speculative_num_steps) == fail_steps):
        print("RuntimeError: the stand-in was told to fail at start-up", flush=True)
        return int(ENV.get("EYAS_STANDIN_EXIT", "1"))
    if ENV.get("EYAS_STANDIN_IGNORE_TERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.speculative_draft_model_path:
        problem = _draft_problem(args.speculative_draft_model_path)
        if problem:  # SGLang fails at start-up when it cannot load the drafter
            print(f"RuntimeError: cannot load the draft model: {problem}", flush=True)
            return 1
    # The model path in its command line lets tests find it.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)",
                              args.model_path])
    print(f"scheduler stand-in pid {child.pid}", flush=True)

    if args.speculative_algorithm not in (None, "EAGLE3", "NGRAM"):
        print(f"ValueError: stand-in knows no --speculative-algorithm "
              f"{args.speculative_algorithm}", flush=True)
        return 1
    if args.speculative_algorithm == "NGRAM" and args.speculative_draft_model_path:
        print("ValueError: NGRAM takes no draft model", flush=True)
        return 1
    ngram = args.speculative_algorithm == "NGRAM"
    spec = args.speculative_algorithm is not None
    step_s = float(ENV.get("EYAS_STANDIN_STEP_S", "0.01"))
    prefill_s = float(ENV.get("EYAS_STANDIN_PREFILL_S", "0"))
    jitter = float(ENV.get("EYAS_STANDIN_JITTER", "0"))
    per_verify = (1 + 2 * float(ENV.get("EYAS_STANDIN_NGRAM_ACCEPT", "0.3")) if ngram else
                  1 + float(ENV.get("EYAS_STANDIN_ACCEPT", "0.6")) * (args.speculative_num_steps or 0))
    ready_at = time.monotonic() + float(ENV.get("EYAS_STANDIN_STARTUP_S", "0.5"))
    never = ENV.get("EYAS_STANDIN_NEVER_HEALTHY") == "1"
    lock = threading.Lock()
    state = {"inflight": 0, "tokens": 0, "verify": 0, "seen": 0}
    cached: set[tuple[int, ...]] = set()  # the prompts in the "prefix cache"
    import random
    rng = random.Random(0)
    every = int(ENV.get("EYAS_STANDIN_500_EVERY", "0"))
    broken = ENV.get("EYAS_STANDIN_500_STEPS") == str(args.speculative_num_steps)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a) -> None:
            pass

        def _send(self, code: int, obj=None) -> None:
            body = b"" if obj is None else json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _flush(self) -> None:
            if ENV.get("EYAS_STANDIN_NO_FLUSH") == "1":
                self._send(404, {"detail": "Not Found"})
                return
            with lock:
                busy = state["inflight"]
                if not busy:
                    cached.clear()
            if busy:
                self.send_response(400)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if "EYAS_STANDIN_FLUSHES" in ENV:
                with lock, open(ENV["EYAS_STANDIN_FLUSHES"], "a") as fh:
                    fh.write(f"{time.time()}\n")
            body = b"Cache flushed.\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path.split("?")[0] == "/flush_cache":
                self._flush()
            elif self.path in ("/health", "/health_generate"):
                ok = not never and time.monotonic() >= ready_at
                self._send(200 if ok else 503)
            elif self.path in ("/server_info", "/get_server_info"):
                with lock:
                    st = {"avg_spec_accept_length": state["tokens"] / state["verify"]} if (
                        spec and state["verify"]) else {}
                self._send(200, {"internal_states": [st], "version": "0.5.23",
                                 "speculative_algorithm": args.speculative_algorithm})
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path.split("?")[0] == "/flush_cache":
                self._flush()
                return
            if self.path != "/generate":
                self._send(404, {"detail": "Not Found"})
                return
            body = json.loads(raw)
            if "EYAS_STANDIN_REQUESTS" in ENV:
                with lock, open(ENV["EYAS_STANDIN_REQUESTS"], "a") as fh:
                    fh.write(json.dumps(body) + "\n")
            with lock:
                state["seen"] += 1
                fail = broken or (every and state["seen"] % every == 0)
            if fail:
                self._send(500, {"error": {"message": "stand-in: injected failure"}})
                return
            ids = body["input_ids"]
            n = int(body["sampling_params"]["max_new_tokens"])
            stream = bool(body.get("stream"))
            # The prefill yields the first token; the decoding steps the other n - 1. The
            # verification count reported stays ceil(n / tokens per step): 1.0 exactly when no
            # draft token is ever accepted, as SGLang reports then.
            steps = math.ceil((n - 1) / per_verify) if spec else n - 1
            verify_ct = math.ceil(n / per_verify) if spec else 0
            with lock:
                state["inflight"] += 1
                hit = tuple(ids) in cached
                cached.add(tuple(ids))
            reqid = f"req-{time.monotonic_ns()}"

            def meta(done: int, verify: int) -> dict:
                out = {"id": reqid, "finish_reason": ({"type": "length", "length": n}
                                                      if done == n else None),
                       "prompt_tokens": len(ids), "completion_tokens": done,
                       "cached_tokens": len(ids) if hit else 0, "e2e_latency": 0.0}
                if spec and verify:
                    out.update(spec_verify_ct=verify, spec_accept_length=done / verify)
                return out

            if stream:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

            def event(obj) -> None:
                data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode())
                data += b"\n\n"
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            done = 0
            try:
                # Steps end on a schedule, so sleep overshoot on a busy machine does not add
                # up (it would penalize the mode with more, shorter steps).
                due = time.monotonic() + prefill_s * (0.5 if hit else 1.0)
                time.sleep(max(0.0, due - time.monotonic()))
                done = sent = 1  # sent: the tokens already streamed
                if stream:
                    event({"text": "x", "output_ids": [0], "meta_info": meta(done, 0)})
                if stream and ENV.get("EYAS_STANDIN_STREAM_ERROR") == "1":
                    steps = 0  # http_server.py: a ValueError mid-stream becomes this event
                    event({"error": {"message": "stand-in: failed mid-stream",
                                     "type": "invalid_request_error", "code": 400,
                                     "retryable": False}})
                for i in range(steps):
                    with lock:
                        b = state["inflight"]
                    cost = ((1 + b / 4) if ngram else (1 + b)) if spec else (1 + (b - 1) / 16)
                    if jitter:
                        cost *= 1 + jitter * (2 * rng.random() - 1)
                    due += step_s * cost
                    time.sleep(max(0.0, due - time.monotonic()))
                    done = n if i == steps - 1 else min(n - 1, round(1 + (i + 1) * per_verify))
                    if stream and ENV.get("EYAS_STANDIN_DROP_EVENT") == "1" and i == 0 \
                            and done < n:
                        sent = done  # an event lost on the way (a bug the reader must notice)
                        continue
                    if stream:
                        start = sent if args.incremental_streaming_output else 0
                        event({"text": "x" * (done - start), "output_ids": list(range(start, done)),
                               "meta_info": meta(done, verify_ct if done == n else i + 1)})
                        sent = done
            finally:
                with lock:
                    state["inflight"] -= 1
                    if spec:
                        state["tokens"] += n
                        state["verify"] += verify_ct
            if stream:
                event(b"[DONE]")  # SGLang ends every stream so, an error event's too
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                return
            self._send(200, {"text": "x" * n, "output_ids": list(range(n)),
                             "meta_info": meta(n, verify_ct)})

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 128  # the default listen backlog (5) drops a batch's connects

    server = Server((args.host, args.port), Handler)
    print("The server is fired up and ready to roll!", flush=True)
    try:
        server.serve_forever()
    finally:
        child.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
