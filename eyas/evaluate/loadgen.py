"""A closed-loop async load generator for OpenAI-compatible and SGLang servers (httpx).

`run_load` keeps `batch_size` requests in flight: each of `batch_size` workers sends one
request, waits for the whole answer, and sends the next, until `requests` are done. What it
measures for one run:

- ``output_tok_s``: completion tokens of the successful requests / wall time of the run (first
  request sent to last answer received), the figure SGLang's ``bench_serving`` calls "Output
  token throughput";
- per request: completion tokens (the server's count), latency, attempts, error;
- ``accept_length`` on SGLang's ``/generate``: Σ ``completion_tokens`` / Σ ``spec_verify_ct``
  over the successful requests, which is SGLang's own per-request formula summed over the run
  (the bonus token counted); None without speculation;
- with ``stream`` (SGLang's ``/generate`` streams server-sent events, one per step; eyas's
  servers stream deltas, ``--incremental-streaming-output``, the running total in
  ``meta_info.completion_tokens``): per request
  the time to its first token (``ttft_s``, the prefill) and its decode time per output token
  with the first token excluded, ``(t_last - t_first) / (n_last - n_first)`` (n: tokens so far
  at an event; a speculative step brings several at once). The run's ``tpot_ms`` is the mean
  over requests (SGLang ``bench_serving``'s "Mean TPOT") and ``decode_tok_s = 1000 / tpot_ms``:
  the per-request decode speed users quote ("90 tok/s at batch 1"), prefill excluded.

Runs are repeated (``--repeats``) and SGLang's prefix cache is emptied before each measured run
(``--flush-cache``: ``POST /flush_cache``), so no run reuses the prefill of an earlier one.

Prompts (`load_prompts`): merged records (``input_ids`` + ``loss_mask``: the tokens before the
first supervised one), or conversations (``messages`` / ``conversations``, or a ``prompt``
string: MT-Bench-style questions, GSM8K, HumanEval) which ``--tokenizer TARGET_DIR`` renders
with the target's chat template and generation prompt into token ids (Kimi's ends in
``<think>``), as SGLang's chat API would. A record without a prompt is skipped and counted.

Two request kinds (`api`):
- ``generate`` (SGLang native): ``POST /generate`` with the prompt as token ids;
- ``chat`` (OpenAI): ``POST /v1/chat/completions`` with the prompt as messages.

Failures never hang the run: every request has a timeout (`request_timeout_s`); timeouts,
dropped connections, 408/429/5xx are retried `max_retries` times with exponential backoff
(honouring ``Retry-After``); other 4xx and malformed answers fail at once; the whole run has a
deadline (`run_timeout_s`) after which requests in flight are cancelled and counted as failed and
unsent ones as not sent. Nothing is raised for a failed request: the result counts them and
keeps the first errors.

On a host (no Prefect needed)::

    python -m eyas.evaluate.loadgen --base-url http://127.0.0.1:30000 --api generate \\
        --prompts /data/runs/100k/merged/eval.jsonl --num-prompts 64 --batch-sizes 1,8,32

prints one ``EYAS_LOADGEN {json}`` line per batch size (`LoadResult.to_dict`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from eyas.errors import DataError, EyasError
from eyas.evaluate.sglang_server import generate_body
from eyas.prepare.generate import parse_retry_after

Api = Literal["generate", "chat"]
MARKER = "EYAS_LOADGEN "
"""Prefix of the result lines the command prints (one JSON object each)."""
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
MAX_BACKOFF_S = 10.0
KEEP_ERRORS = 5


# --------------------------------------------------------------------------- prompts


@dataclass(frozen=True)
class Prompt:
    """One request's prompt: token ids (for ``/generate``) or chat messages (for ``chat``)."""

    id: str
    input_ids: tuple[int, ...] | None = None
    messages: tuple[dict, ...] | None = None


class NoPrompt(DataError):
    """A record that holds no prompt to send (skipped, with `on_skip`, by `load_prompts`)."""


Render = Callable[[list[dict]], list[int]]
"""Chat messages -> token ids with the target's chat template and generation prompt."""


def _prompt_from_record(obj: dict, path: Path, line: int, render: Render | None = None) -> Prompt:
    pid = str(obj.get("id", f"{path.name}:{line}"))
    if "input_ids" in obj:
        ids, mask = obj.get("input_ids"), obj.get("loss_mask")
        if not isinstance(ids, list) or not isinstance(mask, list) or len(ids) != len(mask):
            raise DataError("expected input_ids and loss_mask lists of the same length",
                            path=path, line=line, field="loss_mask")
        first = next((i for i, m in enumerate(mask) if m), None)
        if first is None:
            raise NoPrompt("no supervised token (loss_mask is all 0): no answer to generate",
                           path=path, line=line, field="loss_mask")
        if first == 0:
            raise NoPrompt("the first token is supervised: the record has no prompt",
                           path=path, line=line, field="loss_mask")
        return Prompt(pid, input_ids=tuple(int(t) for t in ids[:first]))
    turns = obj.get("messages", obj.get("conversations"))
    if turns is None and isinstance(obj.get("prompt"), str):  # HumanEval-style: one user turn
        turns = [{"role": "user", "content": obj["prompt"]}]
    if not isinstance(turns, list) or not turns:
        raise DataError("expected input_ids + loss_mask, a messages / conversations list, or "
                        "a prompt string", path=path, line=line, field="input_ids")
    prompt = []
    for turn in turns:
        if not isinstance(turn, dict):
            raise DataError("a turn is not an object", path=path, line=line, field="messages")
        role = turn.get("role", turn.get("from"))
        if role in ("assistant", "gpt"):
            break
        role = {"human": "user"}.get(role, role)
        prompt.append({"role": role, "content": turn.get("content", turn.get("value", ""))})
    if not any(m["role"] == "user" for m in prompt):
        raise NoPrompt("no user turn before the first assistant turn", path=path, line=line,
                       field="messages")
    ids = None
    if render is not None:
        try:
            ids = tuple(int(t) for t in render(prompt))
        except EyasError:
            raise
        except Exception as exc:  # the template's own error (jinja, tokenizer)
            raise DataError(f"the target's chat template could not render the messages: "
                            f"{type(exc).__name__}: {exc}", path=path, line=line,
                            field="messages") from exc
    return Prompt(pid, input_ids=ids, messages=tuple(prompt))


def load_prompts(path: str | Path, limit: int, *, render: Render | None = None,
                 on_skip: Callable[[NoPrompt], None] | None = None) -> list[Prompt]:
    """The first `limit` prompts of a JSONL file, in file order.

    A record with ``input_ids`` + ``loss_mask`` (the merged format) gives its tokens before the
    first supervised one; a record with ``messages`` / ``conversations`` (OpenAI or ShareGPT
    turns; or a ``prompt`` string, one user turn) gives its turns before the first assistant
    turn, and with `render` also their token ids (the target's chat template with its
    generation prompt: what ``/generate`` sends). A record without a prompt raises NoPrompt
    (file, line, field), or with `on_skip` is passed to it and skipped. Raises DataError for a
    malformed record, a missing file or one without any prompt.
    """
    from eyas.io import iter_jsonl

    path = Path(path)
    out: list[Prompt] = []
    skipped = 0
    for line, obj in iter_jsonl(path):
        try:
            out.append(_prompt_from_record(obj, path, line, render))
        except NoPrompt as exc:
            if on_skip is None:
                raise
            on_skip(exc)
            skipped += 1
            continue
        if len(out) >= limit:
            break
    if not out:
        raise DataError("no prompts (only blank lines)" if not skipped else
                        f"no prompts: all {skipped} records lack one", path=path)
    return out


def chat_renderer(model_dir: str, *, trust_remote_code: bool = False,
                  chat_template: str | None = None) -> Render:
    """`Render` with the tokenizer and chat template of the target folder `model_dir` (or the
    jinja file `chat_template`), loaded at the first call: a messages file becomes the token ids
    SGLang's chat API would build (Kimi's generation prompt ends in ``<think>``)."""
    loaded: list[Any] = []

    def render(messages: list[dict]) -> list[int]:
        if not loaded:
            from eyas.prepare.tokenize import load_tokenizer, read_chat_template

            template = read_chat_template(chat_template) if chat_template else None
            tok = load_tokenizer(model_dir, trust_remote_code=trust_remote_code,
                                 chat_template=template)
            if template:
                tok.chat_template = template
            loaded.append(tok)
        from eyas.evaluate.prompts import render_ids

        return render_ids(loaded[0], messages)

    return render


def cycle(prompts: list[Prompt], n: int) -> list[Prompt]:
    """`n` prompts: `prompts` in order, repeated when there are fewer."""
    if not prompts:
        raise EyasError("no prompts to send")
    return [prompts[i % len(prompts)] for i in range(n)]


# --------------------------------------------------------------------------- results


@dataclass
class RequestRecord:
    """What became of one request."""

    prompt_id: str
    ok: bool
    attempts: int
    latency_s: float
    completion_tokens: int = 0
    prompt_tokens: int | None = None
    spec_verify_ct: int | None = None
    error: str | None = None
    ttft_s: float | None = None
    """Seconds from the request sent to its first token (streamed answers only)."""
    tpot_s: float | None = None
    """Seconds per output token after the first (streamed answers of two tokens or more)."""


@dataclass
class LoadResult:
    """One run at one batch size."""

    batch_size: int
    requests: int
    """Requests the run was asked to make."""
    repeat: int = 0
    """Which run of the batch size this is (0, 1, ...)."""
    cache_flushed: bool | None = None
    """Whether the server's prefix cache was emptied before the run (None: not asked)."""
    ok: int = 0
    failed: int = 0
    """Requests that got no usable answer (after retries, or cancelled at the deadline)."""
    not_sent: int = 0
    """Requests never started because the run's deadline came first."""
    retries: int = 0
    wall_s: float = 0.0
    completion_tokens: int = 0
    output_tok_s: float = 0.0
    accept_length: float | None = None
    """Σ completion_tokens / Σ spec_verify_ct (SGLang ``/generate`` with speculation only)."""
    server_accept_length: float | None = None
    """The server's ``avg_spec_accept_length`` after the run (since it started), if it says."""
    tpot_ms: float | None = None
    """Mean over requests of the time per output token after the first (streamed only)."""
    decode_tok_s: float | None = None
    """``1000 / tpot_ms``: decode tokens/s of one request, prefill excluded."""
    ttft_s: float | None = None
    """Median time to first token over the requests (streamed only)."""
    timed_out: bool = False
    errors: dict[str, int] = field(default_factory=dict)
    """Failed requests by kind of error."""
    first_errors: list[str] = field(default_factory=list)
    records: list[RequestRecord] = field(default_factory=list)

    def to_dict(self, *, records: bool = False) -> dict[str, Any]:
        out = asdict(self)
        if not records:
            out.pop("records")
        return out


def summarize(batch_size: int, requests: int, records: list[RequestRecord], wall_s: float,
              *, timed_out: bool = False) -> LoadResult:
    """Totals of a run from its request records."""
    good = [r for r in records if r.ok]
    bad = [r for r in records if not r.ok]
    tokens = sum(r.completion_tokens for r in good)
    spec = [r for r in good if r.spec_verify_ct]
    verify = sum(r.spec_verify_ct or 0 for r in spec)
    kinds = Counter((r.error or "error").split(":", 1)[0] for r in bad)
    tpots = [r.tpot_s for r in good if r.tpot_s is not None]
    ttfts = sorted(r.ttft_s for r in good if r.ttft_s is not None)
    tpot_ms = 1000.0 * sum(tpots) / len(tpots) if tpots else None
    return LoadResult(
        batch_size=batch_size, requests=requests, ok=len(good), failed=len(bad),
        not_sent=requests - len(records), retries=sum(r.attempts - 1 for r in records),
        wall_s=wall_s, completion_tokens=tokens,
        output_tok_s=tokens / wall_s if wall_s > 0 else 0.0,
        accept_length=(sum(r.completion_tokens for r in spec) / verify) if verify else None,
        tpot_ms=tpot_ms, decode_tok_s=1000.0 / tpot_ms if tpot_ms else None,
        ttft_s=_median(ttfts) if ttfts else None,
        timed_out=timed_out, errors=dict(sorted(kinds.items())),
        first_errors=[f"{r.prompt_id}: {r.error}" for r in bad[:KEEP_ERRORS]], records=records,
    )


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


# --------------------------------------------------------------------------- requests


class _Fatal(Exception):
    """A failure that a retry cannot fix (4xx, a malformed answer)."""


def _request(api: Api, prompt: Prompt, *, max_tokens: int, temperature: float,
             model: str | None, stream: bool = False) -> tuple[str, dict]:
    if api == "generate":
        if prompt.input_ids is None:
            raise EyasError(f"prompt {prompt.id}: /generate needs token ids (a tokenized record)")
        return "/generate", generate_body(list(prompt.input_ids), max_tokens=max_tokens,
                                          temperature=temperature, stream=stream)
    if prompt.messages is None:
        raise EyasError(f"prompt {prompt.id}: the chat API needs messages (a conversation record)")
    body: dict[str, Any] = {"messages": list(prompt.messages), "max_tokens": max_tokens,
                            "temperature": temperature, "stream": False}
    if model:
        body["model"] = model
    return "/v1/chat/completions", body


def _parse(api: Api, data: Any) -> tuple[int, int | None, int | None]:
    """``(completion_tokens, prompt_tokens, spec_verify_ct)`` of one answer."""
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if not isinstance(data, dict):
        raise _Fatal(f"bad answer: expected a JSON object, got {type(data).__name__}")
    if api == "generate":
        meta = data.get("meta_info")
        if not isinstance(meta, dict) or not isinstance(meta.get("completion_tokens"), int):
            raise _Fatal("bad answer: no meta_info.completion_tokens")
        verify = meta.get("spec_verify_ct")
        return meta["completion_tokens"], meta.get("prompt_tokens"), (
            int(verify) if isinstance(verify, int) and verify > 0 else None)
    usage = data.get("usage")
    if not isinstance(usage, dict) or not isinstance(usage.get("completion_tokens"), int):
        raise _Fatal("bad answer: no usage.completion_tokens")
    return usage["completion_tokens"], usage.get("prompt_tokens"), None


def _event(payload: str) -> Any:
    """One server-sent event's JSON; _Fatal for an error event or one that is not JSON."""
    try:
        obj = json.loads(payload)
    except ValueError:
        raise _Fatal(f"bad answer: an event is not JSON: {payload.strip()[:100]}") from None
    if isinstance(obj, dict) and "error" in obj:
        err = obj["error"]
        raise _Fatal(f"error event: {err.get('message') if isinstance(err, dict) else err}")
    return obj


async def _read_events(resp: httpx.Response, sent: float) -> tuple[tuple, float | None,
                                                                   float | None]:
    """``((completion_tokens, prompt_tokens, spec_verify_ct), ttft_s, tpot_s)`` of a streamed
    ``/generate`` answer.

    eyas starts SGLang with ``--incremental-streaming-output`` (`eyas.evaluate.sglang_server`):
    each event carries only its new ``output_ids`` (and ``text``), while
    ``meta_info.completion_tokens`` is the running total (SGLang 0.5.23 keeps it so in that
    mode, and in the default one); the last event holds the totals. Times are read from the
    running total, so a server streaming whole answers (SGLang's default) is read right too;
    a stream whose deltas add up neither to the total nor to a whole answer in its last event
    lost tokens, and fails the request."""
    first = last = None  # (time, tokens so far) at the first and last event that added tokens
    data = None
    delta_ids = 0
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        if line[5:].strip() == "[DONE]":
            break
        now = time.monotonic()
        data = _event(line[5:])  # an error event, or not JSON: raises
        meta = data.get("meta_info") if isinstance(data, dict) else None
        n = meta.get("completion_tokens") if isinstance(meta, dict) else None
        if not isinstance(n, int):
            raise _Fatal("bad answer: an event without meta_info.completion_tokens")
        ids = data.get("output_ids")
        delta_ids += len(ids) if isinstance(ids, list) else 0
        if n > 0 and first is None:
            first = (now, n)
        if n > (last[1] if last else 0):
            last = (now, n)
    if data is None:
        raise _Fatal("bad answer: the stream ended before its first event")
    total = _parse("generate", data)
    ids = data.get("output_ids")
    if delta_ids != total[0] and not (isinstance(ids, list) and len(ids) == total[0]):
        raise _Fatal(f"bad answer: the stream's output_ids add up to {delta_ids} tokens, its "
                     f"meta_info.completion_tokens says {total[0]} (events lost?)")
    ttft = first[0] - sent if first else None
    tpot = ((last[0] - first[0]) / (last[1] - first[1])
            if first and last and last[1] > first[1] else None)
    return total, ttft, tpot


async def _one(client: httpx.AsyncClient, api: Api, prompt: Prompt, *, max_tokens: int,
               temperature: float, model: str | None, max_retries: int, backoff_s: float,
               rng: random.Random, timeout_s: float, stream: bool = False) -> RequestRecord:
    stream = stream and api == "generate"
    path, body = _request(api, prompt, max_tokens=max_tokens, temperature=temperature,
                          model=model, stream=stream)
    start = time.monotonic()
    error = "error"
    attempt = 0

    async def attempt_once() -> RequestRecord | httpx.Response:
        sent = time.monotonic()
        if not stream:
            resp = await client.post(path, json=body)
            if resp.status_code != 200:
                return resp
            tokens, ptoks, verify = _parse(api, resp.json())
            return RequestRecord(prompt.id, True, attempt, time.monotonic() - start,
                                 tokens, ptoks, verify)
        async with client.stream("POST", path, json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return resp
            (tokens, ptoks, verify), ttft, tpot = await _read_events(resp, sent)
        return RequestRecord(prompt.id, True, attempt, time.monotonic() - start, tokens, ptoks,
                             verify, ttft_s=ttft, tpot_s=tpot)

    for attempt in range(1, max_retries + 2):
        retry_after = None
        try:
            # A streamed answer never idles long enough for httpx's per-read timeout: bound
            # the whole attempt.
            resp = await asyncio.wait_for(attempt_once(), timeout_s)
            if isinstance(resp, RequestRecord):
                return resp
            error = f"http {resp.status_code}: {resp.text[:200]}"
            if resp.status_code not in RETRY_STATUSES:
                break
            retry_after = parse_retry_after(resp.headers.get("retry-after"))
        except _Fatal as exc:
            error = str(exc)
            break
        except ValueError as exc:  # the body is not JSON
            error = f"bad answer: {exc}"
            break
        except (httpx.TimeoutException, asyncio.TimeoutError):
            error = f"timeout: no complete answer within {timeout_s:g}s"
        except httpx.TransportError as exc:
            error = f"connection: {type(exc).__name__}: {exc or 'dropped'}"
        if attempt <= max_retries:
            delay = retry_after if retry_after is not None else backoff_s * 2 ** (attempt - 1)
            await asyncio.sleep(min(MAX_BACKOFF_S, delay) * (0.5 + 0.5 * rng.random()))
    return RequestRecord(prompt.id, False, attempt, time.monotonic() - start, error=error)


async def run_load_async(
    base_url: str,
    prompts: list[Prompt],
    *,
    api: Api = "generate",
    batch_size: int = 1,
    max_tokens: int = 256,
    temperature: float = 0.0,
    model: str | None = None,
    request_timeout_s: float = 600.0,
    run_timeout_s: float = 1800.0,
    max_retries: int = 2,
    backoff_s: float = 0.5,
    seed: int = 0,
    stream: bool = False,
) -> LoadResult:
    """Send every prompt of `prompts` once, `batch_size` at a time, to `base_url` (the server's
    root, e.g. ``http://127.0.0.1:30000``); see the module docstring for what is measured."""
    if batch_size < 1:
        raise EyasError(f"batch_size must be >= 1, got {batch_size}")
    for p in prompts:  # fail before the first request, not inside a worker
        _request(api, p, max_tokens=max_tokens, temperature=temperature, model=model)
    rng = random.Random(seed)
    pending = list(enumerate(prompts))
    pending.reverse()
    records: list[RequestRecord] = []
    limits = httpx.Limits(max_connections=batch_size, max_keepalive_connections=batch_size)
    timeout = httpx.Timeout(request_timeout_s)

    async with httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout,
                                 limits=limits) as client:

        async def worker() -> None:
            while pending:
                _, prompt = pending.pop()
                t0 = time.monotonic()
                try:
                    rec = await _one(client, api, prompt, max_tokens=max_tokens,
                                     temperature=temperature, model=model,
                                     max_retries=max_retries, backoff_s=backoff_s, rng=rng,
                                     timeout_s=request_timeout_s, stream=stream)
                except asyncio.CancelledError:
                    records.append(RequestRecord(
                        prompt.id, False, 1, time.monotonic() - t0,
                        error=f"deadline: the run passed {run_timeout_s:g}s; cancelled"))
                    raise
                records.append(rec)

        start = time.monotonic()
        tasks = [asyncio.create_task(worker()) for _ in range(min(batch_size, len(prompts)))]
        done, late = await asyncio.wait(tasks, timeout=run_timeout_s)
        for t in late:
            t.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        wall = time.monotonic() - start
        for t in done:  # a bug in a worker must not pass for unsent requests
            if t.exception() is not None:
                raise t.exception()
    return summarize(batch_size, len(prompts), records, wall, timed_out=bool(late))


def run_load(base_url: str, prompts: list[Prompt], **kw: Any) -> LoadResult:
    """`run_load_async` from synchronous code (its own event loop)."""
    return asyncio.run(run_load_async(base_url, prompts, **kw))


def server_accept_length(base_url: str, *, timeout_s: float = 10.0) -> float | None:
    """SGLang's ``internal_states[0].avg_spec_accept_length`` from ``/server_info`` (or the
    older ``/get_server_info``); None when the server does not report one."""
    with httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s) as client:
        for path in ("/server_info", "/get_server_info"):
            try:
                resp = client.get(path)
            except httpx.HTTPError:
                return None
            if resp.status_code == 404:
                continue
            try:
                states = resp.json().get("internal_states") or [{}]
                value = states[0].get("avg_spec_accept_length")
            except (ValueError, AttributeError, IndexError, TypeError):
                return None
            return float(value) if isinstance(value, (int, float)) else None
    return None


def flush_cache(base_url: str, *, timeout_s: float = 60.0, poll_s: float = 0.5) -> str | None:
    """Empty SGLang's prefix cache (``POST /flush_cache``); None when done, else why not.

    SGLang refuses (400) while requests are running or waiting (a cancelled request may still
    be aborting): asked again every `poll_s` until `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s) as client:
        while True:
            try:
                resp = client.post("/flush_cache")
            except httpx.HTTPError as exc:
                return f"POST /flush_cache failed: {type(exc).__name__}: {exc}"
            if resp.status_code == 200:
                return None
            why = f"POST /flush_cache answered {resp.status_code}: {resp.text.strip()[:200]}"
            if resp.status_code != 400 or time.monotonic() > deadline:
                return why
            time.sleep(poll_s)


# --------------------------------------------------------------------------- command


def _batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes like 1,8,32, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected positive sizes like 1,8,32, got {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eyas.evaluate.loadgen", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:30000")
    p.add_argument("--prompts", required=True, help="JSONL of held-out prompts")
    p.add_argument("--api", choices=["generate", "chat"], default="generate")
    p.add_argument("--model", default=None, help="model name sent with chat requests")
    p.add_argument("--num-prompts", type=int, default=64, help="requests per batch size")
    p.add_argument("--batch-sizes", type=_batch_sizes, default=[1, 8, 32])
    p.add_argument("--warmup", type=int, default=0, help="unmeasured requests sent first")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--run-timeout", type=float, default=1800.0)
    p.add_argument("--max-retries", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1, help="measured runs per batch size")
    p.add_argument("--flush-cache", action="store_true",
                   help="POST /flush_cache (SGLang) before each measured run")
    p.add_argument("--no-stream", dest="stream", action="store_false",
                   help="ask /generate for whole answers (no TTFT, no decode tok/s)")
    p.add_argument("--tokenizer", default=None,
                   help="target folder whose chat template renders messages records into token "
                        "ids (needed by --api generate for a messages file)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let transformers run the tokenizer folder's own code (Kimi)")
    p.add_argument("--chat-template", default=None, help="jinja file replacing the folder's")
    args = p.parse_args(argv)
    render = (chat_renderer(args.tokenizer, trust_remote_code=args.trust_remote_code,
                            chat_template=args.chat_template) if args.tokenizer else None)
    skipped: list[str] = []
    try:
        prompts = load_prompts(args.prompts, args.num_prompts, render=render,
                               on_skip=lambda exc: skipped.append(str(exc)))
    except EyasError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if skipped:
        print(f"note: skipped {len(skipped)} record(s) of {args.prompts} without a prompt "
              f"(first: {skipped[0]})", flush=True)
    if len(prompts) < args.num_prompts:
        print(f"note: {args.prompts} holds {len(prompts)} prompts; each is sent "
              f"~{args.num_prompts / len(prompts):.1f} times per batch size", flush=True)
    common = dict(api=args.api, max_tokens=args.max_tokens, temperature=args.temperature,
                  model=args.model, request_timeout_s=args.request_timeout,
                  max_retries=args.max_retries, stream=args.stream)
    if args.warmup:
        warm = run_load(args.base_url, cycle(prompts, args.warmup),
                        batch_size=min(args.warmup, max(args.batch_sizes)),
                        run_timeout_s=args.run_timeout, **common)
        print(f"warmup: {warm.ok}/{warm.requests} ok in {warm.wall_s:.1f}s", flush=True)
    for size in args.batch_sizes:
        for repeat in range(args.repeats):
            flushed = None
            if args.flush_cache:
                why = flush_cache(args.base_url)
                flushed = why is None
                if why:
                    print(f"note: batch {size}, run {repeat + 1}: prefix cache not flushed "
                          f"({why})", flush=True)
            res = run_load(args.base_url, cycle(prompts, args.num_prompts), batch_size=size,
                           run_timeout_s=args.run_timeout, seed=size, **common)
            res.repeat, res.cache_flushed = repeat, flushed
            if args.api == "generate":
                res.server_accept_length = server_accept_length(args.base_url)
            print(f"batch {size} run {repeat + 1}/{args.repeats}: {res.ok}/{res.requests} ok, "
                  f"{res.output_tok_s:.1f} tok/s"
                  + (f", {res.decode_tok_s:.1f} decode tok/s per request, TTFT "
                     f"{res.ttft_s * 1000:.0f} ms" if res.decode_tok_s and res.ttft_s else "")
                  + (f", accept length {res.accept_length:.2f}" if res.accept_length else "")
                  + (f", {res.failed} failed ({res.first_errors[0]})" if res.failed else ""),
                  flush=True)
            print(MARKER + json.dumps(res.to_dict(), sort_keys=True), flush=True)
    return 0


def parse_results(lines: list[str]) -> list[dict]:
    """The result objects among the command's output lines."""
    return [json.loads(line[len(MARKER):]) for line in lines if line.startswith(MARKER)]


if __name__ == "__main__":
    sys.exit(main())
