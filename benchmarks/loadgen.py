"""Benchmark the serving benchmark's load generator: can it keep a GPU server busy?

    python benchmarks/loadgen.py --quick      # 300 requests per run, well under a minute
    python benchmarks/loadgen.py              # 2,000 requests per run

A server that answers at once (the SGLang stand-in of the tests, ``EYAS_STANDIN_STEP_S=0``,
SGLang's ``/generate`` shapes, 256 completion tokens per answer) on 127.0.0.1, driven by:

- **ours**: ``eyas.evaluate.loadgen.run_load`` at batch 32 (32 requests in flight, asyncio +
  one httpx connection each);
- **baseline**: the one-request-at-a-time loop a script would write (``httpx.Client``, one
  keep-alive connection), the same requests;
- **ours, streamed**: ``run_load(..., stream=True)`` at batch 32, as the serving benchmark
  drives SGLang (one server-sent event per token without speculation, each repeating the
  answer so far): the events/s it can read against the users' 32 x 90 = 2,880 per second.

Printed: requests/s and completion tokens/s each can drive, the generator's CPU seconds per
request (user + system of this process; steadier than wall time on a shared machine), the ratio,
and the headroom at the users' shape: Kimi-K2.5 on 8 GPUs decodes about 90 tok/s per request
without speculation, so batch 32 needs at most 32 x 90 = 2,880 tok/s, 11.3 requests/s of 256
tokens. The stand-in (a threaded stdlib server) is part of what is measured, so the figures are
a lower bound for the generator. The last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from eyas.evaluate.loadgen import Prompt, cycle, run_load  # noqa: E402
from eyas.evaluate.sglang_server import generate_body  # noqa: E402
from eyas.proc import free_port  # noqa: E402

STANDIN = ROOT / "tests" / "support" / "sglang_standin"
MAX_TOKENS = 256
USERS_TOK_S_PER_REQUEST = 90.0
USERS_BATCH = 32


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _start_server(port: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(STANDIN), EYAS_STANDIN_STEP_S="0",
               EYAS_STANDIN_STARTUP_S="0")
    proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", "--model-path",
                             tempfile.gettempdir(), "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health_generate", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.1)
    _stop(proc)
    raise SystemExit("the stand-in server did not start")


def _stop(proc: subprocess.Popen) -> None:
    """Kill the stand-in's whole process group (it starts a child, as SGLang does)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _baseline(url: str, prompts: list[Prompt]) -> tuple[float, int]:
    tokens = 0
    with httpx.Client(base_url=url, timeout=60) as client:
        start = time.monotonic()
        for p in prompts:
            r = client.post("/generate", json=generate_body(list(p.input_ids),
                                                            max_tokens=MAX_TOKENS, temperature=0))
            tokens += r.json()["meta_info"]["completion_tokens"]
        return time.monotonic() - start, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="300 requests per run")
    ap.add_argument("--requests", type=int, default=None)
    args = ap.parse_args()
    n = args.requests or (300 if args.quick else 2000)
    prompts = cycle([Prompt(f"p{i}", input_ids=tuple(range(100 + i))) for i in range(16)], n)
    port = free_port()
    server = _start_server(port)
    url = f"http://127.0.0.1:{port}"
    try:
        run_load(url, prompts[:64], batch_size=USERS_BATCH, max_tokens=MAX_TOKENS)  # warm up
        cpu0 = _cpu()
        ours = run_load(url, prompts, batch_size=USERS_BATCH, max_tokens=MAX_TOKENS)
        ours_cpu = _cpu() - cpu0
        cpu0 = _cpu()
        base_s, base_tokens = _baseline(url, prompts)
        base_cpu = _cpu() - cpu0
        cpu0 = _cpu()
        streamed = run_load(url, prompts, batch_size=USERS_BATCH, max_tokens=MAX_TOKENS,
                            stream=True)
        streamed_cpu = _cpu() - cpu0
    finally:
        _stop(server)
    if ours.ok != n or base_tokens != ours.completion_tokens or streamed.ok != n:
        raise SystemExit(f"runs differ: ours {ours.ok}/{n} ok, {ours.completion_tokens} tokens; "
                         f"baseline {base_tokens} tokens")
    need = USERS_BATCH * USERS_TOK_S_PER_REQUEST / MAX_TOKENS
    ours_rps, base_rps = n / ours.wall_s, n / base_s
    rows = [("ours, batch 32 (asyncio)", ours_rps, ours.output_tok_s, ours_cpu / n),
            ("baseline, one at a time", base_rps, base_tokens / base_s, base_cpu / n),
            ("ours, batch 32, streamed", n / streamed.wall_s, streamed.output_tok_s,
             streamed_cpu / n)]
    events_need = USERS_BATCH * USERS_TOK_S_PER_REQUEST
    print(f"{n} requests of {MAX_TOKENS} tokens against an instant server, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'driver':<28} {'req/s':>8} {'tok/s':>10} {'CPU ms/req':>11}")
    for name, rps, toks, cpu in rows:
        print(f"{name:<28} {rps:>8.1f} {toks:>10,.0f} {cpu * 1e3:>11.2f}")
    print(f"ratio ours / baseline: {ours_rps / base_rps:.2f}x requests/s; users' batch 32 needs "
          f"<= {need:.1f} req/s: headroom {ours_rps / need:.0f}x")
    print(f"streamed: {streamed.output_tok_s:,.0f} events/s read (one per token), "
          f"{streamed_cpu / streamed.completion_tokens * 1e6:.0f} us CPU per event; users' "
          f"batch 32 sends <= {events_need:,.0f}/s: headroom "
          f"{streamed.output_tok_s / events_need:.1f}x")
    print(json.dumps({
        "requests": n, "max_tokens": MAX_TOKENS,
        "ours_req_s": round(ours_rps, 1), "ours_tok_s": round(ours.output_tok_s),
        "ours_cpu_ms_per_req": round(ours_cpu / n * 1e3, 3),
        "baseline_req_s": round(base_rps, 1), "baseline_tok_s": round(base_tokens / base_s),
        "baseline_cpu_ms_per_req": round(base_cpu / n * 1e3, 3),
        "ratio": round(ours_rps / base_rps, 2), "users_batch32_req_s": round(need, 2),
        "headroom": round(ours_rps / need, 1),
        "streamed_events_s": round(streamed.output_tok_s),
        "streamed_cpu_us_per_event": round(streamed_cpu / streamed.completion_tokens * 1e6, 1),
        "users_batch32_events_s": events_need,
        "streamed_headroom": round(streamed.output_tok_s / events_need, 2),
    }))


if __name__ == "__main__":
    main()
