"""Phase 1: answer prompts with the target through any OpenAI-compatible chat API.

`generate_dataset` sends each conversation to ``POST {base_url}/chat/completions`` (a hosted
router, SGLang, vLLM, ``transformers serve``) and appends the answered conversation to a
JSONL file keyed by sample id.

Multi-turn semantics
    The input's assistant turns are dropped and regenerated, in order. System and user
    turns are kept; tool turns are dropped too (their results answered tool calls of the
    old answers). For each user turn the request carries the conversation so far — system
    turns, user turns and the model's *own* earlier answers (``role`` + ``content``, plus
    ``tool_calls`` when it made some; its reasoning is not sent back) — and the answer is
    appended after that user turn. The conversation's ``tools`` go with every request. A
    conversation without a user turn is a DataError (raised before any request is sent).
    The answer keeps ``reasoning_content`` (servers name it ``reasoning_content`` or
    ``reasoning``) and ``tool_calls``.

Output record (one line per sample): ``Conversation.to_json()`` -- with ``"finish_reasons"``,
one per answered turn -- plus ``"usage": {"prompt_tokens", "completion_tokens"}`` summed over
the turns and ``"finish_reason"`` of the last turn.

Cut answers
    An answer the server stopped at ``max_tokens`` (``finish_reason: "length"``) is kept and
    marked so; it is counted (``cut_answers`` and ``cut_answer_share`` in the call's stats and
    the manifest's counts) and a warning names how many. Tokenization decides what is trained
    of it (``tokenize.cut_answers``): the target never closed such a turn.

Answers that spell special tokens (a server without its parsers)
    With `special_text` (`eyas.prepare.special_text`: the target's template markers), an
    answer whose content or reasoning spells one of them (``reasoning</think>answer``, tool
    calls as ``<|tool_calls_section_begin|>...`` text) is refused, as ``on_bad_answer`` says
    (``tokenize.on_bad_record``): ``"error"`` stops the run at the first one;
    ``"reject"`` writes it to ``rejects.jsonl`` beside the output (id, reason, error, the
    answered record), counts it (``rejected``, ``rejected_reasons``) and treats the id as
    done (delete the file to request those ids again). Either way a server that keeps doing
    it stops the run early with `ServerOutputError`, naming the server flags: at
    `EARLY_STOP_REJECTS` refused answers among the first `EARLY_WINDOW` of a call, or later
    once the refused share passes ``max_rejected_share``. The refused answers of a stopped
    run are not kept (its rejects file is removed): once the server is fixed, a rerun
    requests them again. A finished file whose refused share passes ``max_rejected_share`` is
    a DataError (no manifest).

Failure and resume
    - Requests are retried with exponential backoff and jitter on 429, 5xx, timeouts and
      dropped connections, honouring ``Retry-After`` (seconds or an HTTP date, capped at
      ``max_backoff_s``). Other 4xx are not retried: 401, 403, 404 and 405 (a wrong key,
      URL or model name, the same for every sample) stop the run at once with
      `RequestRejected`; any other 4xx (a prompt too long for this server, say) fails that
      sample only — unless the first 10 such answers come before any success (a wrong
      model name gives 400 for every sample), which stops the run too.
    - Each finished record is written and flushed at once (fsync'ed every few seconds and at
      the end), so a crash loses at most the requests in flight. On start the file's
      finished ids are skipped, and a torn last line left by a crash is cut off.
    - A sample that still fails after all retries is counted, written to ``failed.jsonl``
      beside the output (id + error) and the run goes on; at the end `GenerationIncomplete`
      is raised (unless ``raise_on_failure=False``). Rerunning requests only the missing ids.
    - A stop (SIGTERM, Ctrl-C: `eyas.stopping`) ends the call within `STOP_POLL_S`: the
      requests in flight are abandoned, the answers received are kept (written and fsync'ed),
      and `StopRequested` says how many; the rerun asks only for the missing ids.
    - When every id is answered, the file is rewritten in input order (atomically) and
      ``manifest.json`` is written beside it. A rerun with everything done and a verifying
      manifest sends no request. While any id is missing there is no manifest.

The API key travels only in the ``Authorization`` header: it is never logged, never
written, and removed from any server message quoted in an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import os
import random
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
from tqdm import tqdm

from eyas import stopping
from eyas.conversation import CUT, Conversation, Message
from eyas.errors import ConfigError, DataError, EyasError
from eyas.io import AtomicJsonlWriter, dumps_line
from eyas.manifest import read_manifest, verify_manifest, write_manifest
from eyas.prepare.config import GenerationConfig
from eyas.prepare.rejects import RejectTally, check_rejected_share
from eyas.prepare.special_text import SpecialText, server_hint

log = logging.getLogger(__name__)

FAILED_NAME = "failed.jsonl"
REJECTS_NAME = "rejects.jsonl"
PHASE = "generate"
FSYNC_EVERY_S = 2.0
# Same answer for every sample: stop the run instead of failing each sample in turn.
FATAL_STATUSES = {401, 403, 404, 405}
RETRY_STATUSES = {408, 425, 429}
# Other 4xx fail one sample; this many with no success at all means the setup is wrong: stop.
REJECTS_BEFORE_STOP = 10
# A server without its reasoning / tool-call parser: this many refused answers among the
# first EARLY_WINDOW answers of a call stop the run (a thinking target spells </think> in
# nearly every answer; a missing tool-call parser shows in the first few tool calls).
EARLY_STOP_REJECTS = 3
EARLY_WINDOW = 50
STOP_POLL_S = 0.2
"""How often the workers' loop looks for a stop request (`eyas.stopping`)."""


@dataclass
class GenStats:
    """What one `generate_dataset` call did."""

    requests: int = 0
    """HTTP requests sent, retries included."""
    retries: int = 0
    """Requests that were repeats of a failed one."""
    prompt_tokens: int = 0
    """Prompt tokens of the answers received in this call (server's count)."""
    completion_tokens: int = 0
    """Completion tokens of the answers received in this call."""
    samples_done: int = 0
    """Samples answered and written in this call."""
    samples_skipped: int = 0
    """Samples already in the output file (answered by an earlier call)."""
    failures: int = 0
    """Samples that failed after all retries (or with a non-retryable 4xx)."""
    cut_answers: int = 0
    """Samples answered in this call with an answer cut at ``max_tokens`` (finish_reason
    ``length``)."""
    rejected: int = 0
    """Samples answered in this call whose answer was refused (it spells a special token)."""
    elapsed_s: float = 0.0
    """Wall time of the call."""


@dataclass
class GenProgress:
    """Samples finished (earlier calls included) out of the total."""

    done: int
    total: int


class RequestRejected(EyasError):
    """The server answered a request with a status that retrying cannot fix."""

    def __init__(self, message: str, *, status: int, sample_id: str) -> None:
        self.status = status
        self.sample_id = sample_id
        super().__init__(message)


class RetriesExhausted(EyasError):
    """A request kept failing with retryable errors until `max_retries` ran out."""


class ServerOutputError(ConfigError):
    """The server's answers spell the chat template's special tokens: it runs without the
    reasoning / tool-call parser the target needs (a setting of the server, not of eyas)."""


class GenerationIncomplete(EyasError):
    """Some samples failed; `stats` says how many, `failed_path` lists them."""

    def __init__(self, message: str, *, stats: GenStats, failed_path: Path) -> None:
        self.stats = stats
        self.failed_path = failed_path
        super().__init__(message)


# --------------------------------------------------------------------------- conversations


def _check_conversations(conversations: Iterable[Conversation]) -> list[Conversation]:
    convs = list(conversations)
    if not convs:
        raise DataError("no conversations to answer (the dataset is empty)", field="conversations")
    seen: set[str] = set()
    for n, conv in enumerate(convs, start=1):
        if conv.id in seen:
            raise DataError(f"sample id {conv.id!r} appears twice (ids must be unique)",
                            line=n, field="id")
        seen.add(conv.id)
        if not any(m.role == "user" for m in conv.messages):
            raise DataError(
                f"sample {conv.id!r} has no user turn (roles: "
                f"{[m.role for m in conv.messages]}); nothing to answer",
                line=n, field="conversations",
            )
    return convs


def _as_request_message(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = m.tool_calls
    return out


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP date), or None."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


def backoff_delay(attempt: int, cfg: GenerationConfig, retry_after: float | None,
                  rng: random.Random) -> float:
    """Delay before retry number `attempt` (0-based).

    With ``Retry-After``: that value (plus up to 10 % jitter), capped at ``max_backoff_s``.
    Otherwise ``backoff_s * 2**attempt`` capped at ``max_backoff_s``, times a jitter factor
    in [0.5, 1.0] so that many clients do not retry in lockstep.
    """
    if retry_after is not None:
        return min(cfg.max_backoff_s, retry_after * (1.0 + 0.1 * rng.random()))
    base = min(cfg.max_backoff_s, cfg.backoff_s * (2.0 ** attempt))
    return base * (0.5 + 0.5 * rng.random())


# --------------------------------------------------------------------------- output file


def repair_torn_tail(path: Path) -> int:
    """Cut a last line that lacks its newline (a crash mid-write); return bytes removed."""
    if not path.exists():
        return 0
    size = path.stat().st_size
    if size == 0:
        return 0
    with open(path, "rb+") as fh:
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return 0
        # Walk back to the last newline, in blocks.
        pos = size
        keep = 0
        while pos > 0:
            step = min(1 << 16, pos)
            pos -= step
            fh.seek(pos)
            block = fh.read(step)
            idx = block.rfind(b"\n")
            if idx >= 0:
                keep = pos + idx + 1
                break
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())
    return size - keep


def _index_existing(path: Path) -> dict[str, tuple[int, int]]:
    """``{id: (offset, length)}`` of the complete records of `path` (first one of an id)."""
    index: dict[str, tuple[int, int]] = {}
    if not path.exists():
        return index
    offset = 0
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if raw.strip():
                try:
                    obj = orjson.loads(raw)
                    sid = str(obj["id"])
                except (orjson.JSONDecodeError, KeyError, TypeError):
                    raise DataError(
                        "not a generated record (expected a JSON object with an 'id'); "
                        "move the file away to start over",
                        path=path, line=lineno,
                    ) from None
                index.setdefault(sid, (offset, len(raw)))
            offset += len(raw)
    return index


def _index_rejects(path: Path) -> dict[str, dict[str, Any]]:
    """``{id: reject}`` of a phase-1 rejects file (its torn last line cut first)."""
    if repair_torn_tail(path):
        log.warning("%s: cut off a torn last line (an interrupted write)", path)
    out: dict[str, dict[str, Any]] = {}
    if path.exists():
        for lineno, raw in enumerate(path.read_bytes().splitlines(), start=1):
            if raw.strip():
                try:
                    obj = orjson.loads(raw)
                    out.setdefault(str(obj["id"]), obj)
                except (orjson.JSONDecodeError, KeyError, TypeError):
                    raise DataError("not a rejected answer (expected a JSON object with an "
                                    "'id'); move the file away to start over",
                                    path=path, line=lineno) from None
    return out


def _finalize(out_path: Path, convs: list[Conversation], index: dict[str, tuple[int, int]],
              manifest_config: dict[str, Any], inputs: dict[str, str | Path] | None,
              rejected: dict[str, dict[str, Any]], max_rejected_share: float) -> Path:
    """Rewrite the output in input order (atomically), then write the manifest; a refused
    share over `max_rejected_share` is a DataError instead (no manifest)."""
    rejects_path = out_path.parent / REJECTS_NAME
    refused = [c.id for c in convs if c.id in rejected and c.id not in index]
    tally = RejectTally()
    for sid in refused:
        tally.add(rejected[sid])
    check_rejected_share(dataset=out_path.parent.name, tally=tally, seen=len(convs),
                         max_share=max_rejected_share, rejects_path=rejects_path,
                         source=str(out_path))
    kept = [c for c in convs if c.id in index]
    counts: dict[str, Any] = {"samples": len(kept), "prompt_tokens": 0, "completion_tokens": 0,
                              "cut_answers": 0}
    with open(out_path, "rb") as src, AtomicJsonlWriter(out_path) as dst:
        for conv in kept:
            offset, length = index[conv.id]
            src.seek(offset)
            raw = src.read(length)
            obj = orjson.loads(raw)
            usage = obj.get("usage") or {}
            counts["prompt_tokens"] += int(usage.get("prompt_tokens") or 0)
            counts["completion_tokens"] += int(usage.get("completion_tokens") or 0)
            counts["cut_answers"] += int(CUT in (obj.get("finish_reasons") or []))
            dst.write_raw(raw if raw.endswith(b"\n") else raw + b"\n")
    counts["cut_answer_share"] = counts["cut_answers"] / len(kept) if kept else 0.0
    counts["rejected"] = len(refused)
    counts["rejected_reasons"] = tally.as_dict()
    if counts["cut_answers"]:
        log.warning("%s: %d of %d answers (%.1f%%) were cut at max_tokens=%s (finish_reason "
                    "'length'); tokenize.cut_answers decides how they are trained", out_path,
                    counts["cut_answers"], len(kept), 100 * counts["cut_answer_share"],
                    manifest_config["generation"]["max_tokens"])
    if refused:
        log.warning("%s: %d of %d answers refused (%s), listed in %s", out_path, len(refused),
                    len(convs), tally.top(), rejects_path)
    outputs = [out_path.name] + ([REJECTS_NAME] if refused else [])
    return write_manifest(out_path.parent, phase=PHASE, inputs=inputs, outputs=outputs,
                          config=manifest_config, counts=counts)


# --------------------------------------------------------------------------- the run


class _Run:
    """State shared by the workers of one `generate_dataset` call."""

    def __init__(self, cfg: GenerationConfig, model: str, api_key: str | None,
                 key_hint: str, base_url: str) -> None:
        self.cfg = cfg
        self.model = model
        self.api_key = api_key
        self.key_hint = key_hint
        self.base_url = base_url
        self.stats = GenStats()
        self.rng = random.Random()

    def redact(self, text: str) -> str:
        if self.api_key:
            text = text.replace(self.api_key, "***")
        return text

    def _server_message(self, resp: httpx.Response) -> str:
        try:
            body = resp.json()
        except ValueError:
            return self.redact(resp.text[:500].strip() or "(empty body)")
        msg: Any = body
        if isinstance(body, dict):
            err = body.get("error", body.get("detail", body.get("message", body)))
            msg = err.get("message", err) if isinstance(err, dict) else err
        return self.redact(str(msg)[:500])

    async def chat(self, client: httpx.AsyncClient, sample_id: str,
                   messages: list[dict[str, Any]], tools: list | None) -> dict[str, Any]:
        """One chat completion, with retries; returns the response's first choice + usage."""
        body: dict[str, Any] = {
            "model": self.model, "messages": messages, "max_tokens": self.cfg.max_tokens,
            "temperature": self.cfg.temperature,
        }
        if self.cfg.top_p is not None:
            body["top_p"] = self.cfg.top_p
        body.update(self.cfg.extra_body)
        if tools:
            body["tools"] = tools
        attempt = 0
        while True:
            retry_after: float | None = None
            self.stats.requests += 1
            try:
                # httpx's timeout bounds each gap between reads; this, the whole request (a
                # server trickling a byte a second would hold it forever).
                resp = await asyncio.wait_for(client.post("/chat/completions", json=body),
                                              self.cfg.timeout_s)
            except asyncio.TimeoutError:
                error = (f"no complete answer within generation.timeout_s "
                         f"({self.cfg.timeout_s:g} s)")
            except httpx.TransportError as exc:  # timeouts, refused/dropped connections
                error = f"{type(exc).__name__}: {self.redact(str(exc)) or 'no detail'}"
            else:
                status = resp.status_code
                if status == 200:
                    parsed = _parse_completion(resp)
                    if isinstance(parsed, dict):
                        return parsed
                    error = f"HTTP 200 with an unusable body: {self.redact(parsed)}"
                elif status in RETRY_STATUSES or status >= 500:
                    retry_after = parse_retry_after(resp.headers.get("retry-after"))
                    error = f"HTTP {status}: {self._server_message(resp)}"
                else:
                    raise RequestRejected(self._rejection(status, sample_id, resp),
                                          status=status, sample_id=sample_id)
            if attempt >= self.cfg.max_retries:
                raise RetriesExhausted(
                    f"sample {sample_id!r}: gave up after {attempt + 1} attempts at "
                    f"{self.base_url}; last error: {error}"
                )
            delay = backoff_delay(attempt, self.cfg, retry_after, self.rng)
            log.warning("sample %s: %s; retry %d/%d in %.2f s", sample_id, error, attempt + 1,
                        self.cfg.max_retries, delay)
            attempt += 1
            self.stats.retries += 1
            await asyncio.sleep(delay)

    def _rejection(self, status: int, sample_id: str, resp: httpx.Response) -> str:
        text = (f"HTTP {status} from {self.base_url}/chat/completions for sample {sample_id!r}: "
                f"{self._server_message(resp)}")
        if status in (401, 403):
            text += f" — check the API key ({self.key_hint})"
        elif status == 404:
            text += " — check generation.base_url (it should end in /v1) and the model name"
        elif status == 400 or status == 422:
            text += f" — the request was refused (model {self.model!r}; is the name right?)"
        return text

    async def answer(self, client: httpx.AsyncClient, conv: Conversation) -> dict[str, Any]:
        """Regenerate every assistant turn of `conv`; return the output record."""
        sent: list[dict[str, Any]] = []
        out: list[Message] = []
        usage = {"prompt_tokens": 0, "completion_tokens": 0}
        for m in conv.messages:
            if m.role not in ("system", "user"):
                continue
            sent.append(_as_request_message(m))
            out.append(Message(role=m.role, content=m.content))
            if m.role != "user":
                continue
            reply = await self.chat(client, conv.id, sent, conv.tools)
            msg = reply["message"]
            answer = Message(
                role="assistant",
                content=msg.get("content") or "",
                reasoning_content=msg.get("reasoning_content") or msg.get("reasoning") or None,
                tool_calls=msg.get("tool_calls") or None,
                finish_reason=reply.get("finish_reason"),
            )
            out.append(answer)
            sent.append(_as_request_message(answer))
            for k in usage:
                usage[k] += int((reply.get("usage") or {}).get(k) or 0)
        answered = Conversation(id=conv.id, messages=out, tools=conv.tools)
        record = answered.to_json()
        record["usage"] = usage
        record["finish_reason"] = out[-1].finish_reason
        record["finish_reasons"] = [m.finish_reason for m in out if m.role == "assistant"]
        return record


def _parse_completion(resp: httpx.Response) -> dict[str, Any] | str:
    """``{"message", "finish_reason", "usage"}`` of a 200 answer, or what is wrong with it:
    ``choices`` a non-empty list of objects with a ``message`` object, whose ``content`` and
    reasoning are text (or absent) and ``tool_calls`` a list; ``usage`` an object of integer
    token counts (or absent)."""
    try:
        data = resp.json()
    except ValueError:
        return f"not JSON: {resp.text[:200]!r}"
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        return f"choices is {_kind(choices)}, expected a non-empty list: {str(data)[:200]}"
    if not isinstance(choices[0], dict) or not isinstance(choices[0].get("message"), dict):
        return f"no choices[0].message object in {str(data)[:200]}"
    message = choices[0]["message"]
    for key in ("content", "reasoning_content", "reasoning"):
        if message.get(key) is not None and not isinstance(message[key], str):
            return f"choices[0].message.{key} is {_kind(message[key])}, expected text"
    if message.get("tool_calls") is not None and not isinstance(message["tool_calls"], list):
        return f"choices[0].message.tool_calls is {_kind(message['tool_calls'])}, expected a list"
    usage = data.get("usage")
    if usage is None:
        usage = {}
    if not isinstance(usage, dict):
        return f"usage is {_kind(usage)}, expected an object of token counts"
    for key in ("prompt_tokens", "completion_tokens"):
        value = usage.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            return f"usage.{key} is {_kind(value)}, expected an integer"
    return {"message": message, "finish_reason": choices[0].get("finish_reason"),
            "usage": usage}


def _kind(value: Any) -> str:
    return "absent" if value is None else f"{type(value).__name__} {str(value)[:40]!r}"


async def generate_dataset(
    conversations: Iterable[Conversation],
    out_path: Path,
    cfg: GenerationConfig,
    *,
    model: str,
    api_key: str | None = None,
    on_progress: Callable[[GenProgress], None] | None = None,
    base_url: str | None = None,
    inputs: dict[str, str | Path] | None = None,
    progress_bar: bool = True,
    raise_on_failure: bool = True,
    special_text: SpecialText | None = None,
    on_bad_answer: str = "error",
    max_rejected_share: float = 1.0,
) -> GenStats:
    """Answer every conversation not yet in `out_path`; see the module docstring.

    `base_url` (default ``cfg.base_url``) is the API root ending in ``/v1``; `model` is the
    name sent in requests. `inputs` are recorded with hashes in the manifest. `on_progress`
    is called with samples done / total after each record. `progress_bar` shows a tqdm bar on
    stderr. `special_text` (the target's template markers; None checks nothing),
    `on_bad_answer` (``"error"`` or ``"reject"``) and `max_rejected_share` decide what
    happens to answers that spell special tokens (module docstring).

    Returns the call's GenStats. Raises DataError for an empty input, a conversation without
    a user turn, a repeated id or an unreadable output file; ConfigError without a base URL;
    RequestRejected for 401/403/404/405 (after writing what was finished);
    ServerOutputError when answers spell special tokens (the first one with
    ``on_bad_answer="error"``, else the early-stop rule); DataError when the refused share of
    a finished file passes `max_rejected_share`; GenerationIncomplete when samples failed
    (unless `raise_on_failure` is false); `eyas.stopping.StopRequested` when a stop was
    requested of this process (within `STOP_POLL_S`: the answers in flight are abandoned,
    those received kept, no manifest).
    """
    started = time.monotonic()
    base_url = (base_url or cfg.base_url or "").rstrip("/")
    if not base_url:
        raise ConfigError("no server URL: set generation.base_url (ending in /v1) or "
                          "generation.launch_server", where="generation.base_url")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    failed_path = out_path.parent / FAILED_NAME
    rejects_path = out_path.parent / REJECTS_NAME
    if on_bad_answer not in ("error", "reject"):
        raise ConfigError(f"on_bad_answer is {on_bad_answer!r}; expected 'error' or 'reject'",
                          where="tokenize.on_bad_record")
    convs = _check_conversations(conversations)
    key_hint = (f"Prefect Secret block {cfg.api_key_block!r}" if cfg.api_key_block
                else f"environment variable {cfg.api_key_env}")
    run = _Run(cfg, model, api_key, key_hint, base_url)
    stats = run.stats
    manifest_config = {"generation": cfg.model_dump(mode="json"), "model": model,
                       "base_url": base_url}

    if repair_torn_tail(out_path):
        log.warning("%s: cut off a torn last line (an interrupted write)", out_path)
    index = _index_existing(out_path)
    refused = _index_rejects(rejects_path)
    wanted = {c.id for c in convs}
    stale = len(set(index) - wanted)
    if stale:
        log.warning("%s: %d records have ids not in the input; they are left out of the final "
                    "file", out_path, stale)
    pending = [c for c in convs if c.id not in index and c.id not in refused]
    stats.samples_skipped = len(convs) - len(pending)
    total = len(convs)

    if not pending:
        # Every id is in the file; a verifying manifest means the file is final already.
        manifest = read_manifest(out_path.parent)
        if (not stale and manifest and manifest.get("phase") == PHASE
                and not verify_manifest(out_path.parent)):
            done = RejectTally()
            done.reasons.update(manifest.get("counts", {}).get("rejected_reasons") or {})
            check_rejected_share(dataset=out_path.parent.name, tally=done, seen=len(convs),
                                 max_share=max_rejected_share, rejects_path=rejects_path,
                                 source=str(out_path))
            stats.elapsed_s = time.monotonic() - started
            return stats
    else:
        # Partial again (the input grew, or an earlier run stopped): no manifest may stand.
        with contextlib.suppress(FileNotFoundError):
            (out_path.parent / "manifest.json").unlink()

    with contextlib.suppress(FileNotFoundError):
        failed_path.unlink()
    bar = tqdm(total=total, initial=stats.samples_skipped, desc=f"generate {out_path.parent.name}",
               unit="sample", file=sys.stderr, disable=not progress_bar, dynamic_ncols=True)
    if on_progress:
        on_progress(GenProgress(stats.samples_skipped, total))
    queue: asyncio.Queue[Conversation] = asyncio.Queue()
    for conv in pending:
        queue.put_nowait(conv)
    fatal: list[BaseException] = []
    rejected: list[RequestRejected] = []
    last_fsync = time.monotonic()

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency)
    timeout = httpx.Timeout(cfg.timeout_s, connect=min(cfg.timeout_s, 30.0))
    out_fh = open(out_path, "ab")
    fail_fh = None
    reject_fh = None
    tally = RejectTally()
    markers = special_text.markers if special_text else ()
    stopped_by: int | None = None

    def refuse(error: DataError) -> ServerOutputError | None:
        """Count a refused answer; the error that stops the run, or None to go on."""
        tally.add(error.as_reject())
        stats.rejected += 1
        answered = stats.samples_done + stats.rejected
        log.warning("refused answer: %s", error.reason)
        if on_bad_answer == "error":
            why = ("tokenize.on_bad_record is 'error': the first such answer stops the run; "
                   "'reject' refuses single ones and stops only on many")
        elif answered <= EARLY_WINDOW and stats.rejected >= EARLY_STOP_REJECTS:
            why = f"{stats.rejected} of the first {answered} answers of this run spell them"
        elif answered > EARLY_WINDOW and stats.rejected / answered > max_rejected_share:
            why = (f"{stats.rejected} of {answered} answers spell them, more than "
                   f"tokenize.max_rejected_share ({max_rejected_share:.2%})")
        else:
            return None
        return ServerOutputError(
            f"the server at {base_url} returns answers that spell the chat template's special "
            f"tokens ({why}); it runs without the reasoning / tool-call parser this target "
            f"needs: {server_hint(markers)}, then run again (the refused answers are "
            f"requested again). First: {error}",
            where="generation.base_url (the server's launch flags)",
        )
    try:
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout,
                                     limits=limits) as client:

            def advance() -> None:
                """One more prompt finished (answered or refused): the bar and the progress."""
                bar.update(1)
                if on_progress:
                    on_progress(GenProgress(
                        stats.samples_skipped + stats.samples_done + stats.rejected, total))

            async def worker() -> None:
                nonlocal fail_fh, reject_fh, last_fsync
                while not fatal:
                    try:
                        conv = queue.get_nowait()
                    except asyncio.QueueEmpty:
                        return
                    try:
                        record = await run.answer(client, conv)
                        bad = special_text.check(Conversation.from_json(record)) if (
                            special_text is not None) else None
                    except RequestRejected as exc:
                        rejected.append(exc)
                        if exc.status in FATAL_STATUSES or (
                                len(rejected) >= REJECTS_BEFORE_STOP and not stats.samples_done):
                            fatal.append(exc)
                            return
                        error = str(exc)
                    except RetriesExhausted as exc:
                        error = str(exc)
                    else:
                        if bad is not None:
                            stop = refuse(bad)
                            if stop is not None:
                                fatal.append(stop)
                                return
                            if reject_fh is None:
                                reject_fh = open(rejects_path, "ab")
                            reject_fh.write(dumps_line({"id": conv.id, **bad.as_reject(),
                                                        "record": record}))
                            reject_fh.flush()
                            refused[conv.id] = {"id": conv.id, **bad.as_reject()}
                            advance()
                            continue
                        line = dumps_line(record)
                        out_fh.write(line)
                        out_fh.flush()
                        now = time.monotonic()
                        if now - last_fsync >= FSYNC_EVERY_S:
                            os.fsync(out_fh.fileno())
                            last_fsync = now
                        stats.samples_done += 1
                        stats.cut_answers += int(CUT in record["finish_reasons"])
                        stats.prompt_tokens += record["usage"]["prompt_tokens"]
                        stats.completion_tokens += record["usage"]["completion_tokens"]
                        advance()
                        continue
                    stats.failures += 1
                    log.error("%s", error)
                    if fail_fh is None:
                        fail_fh = open(failed_path, "ab")
                    fail_fh.write(dumps_line({"id": conv.id, "error": error}))
                    fail_fh.flush()

            async def stop_watch() -> None:
                """Returns once a stop is requested of this process (SIGTERM, Ctrl-C)."""
                while stopping.requested() is None:
                    await asyncio.sleep(STOP_POLL_S)

            workers = [asyncio.create_task(worker()) for _ in range(min(cfg.concurrency,
                                                                        len(pending)))]
            watcher = asyncio.create_task(stop_watch())
            everything = asyncio.gather(*workers)
            try:
                await asyncio.wait({everything, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if everything.done():
                    everything.result()  # a worker's error
                else:
                    # A stop: the answers in flight are abandoned (a worker is cancelled only
                    # while it awaits the server, never while it writes a record), the ones
                    # received are kept, and the rerun asks only for the missing ids.
                    stopped_by = stopping.requested()
            finally:
                watcher.cancel()
                for w in workers:
                    w.cancel()
                await asyncio.gather(everything, watcher, *workers, return_exceptions=True)
    finally:
        out_fh.flush()
        os.fsync(out_fh.fileno())
        out_fh.close()
        if fail_fh is not None:
            fail_fh.close()
        if reject_fh is not None:
            reject_fh.close()
        bar.close()
        stats.elapsed_s = time.monotonic() - started

    if stopped_by is not None:
        missing = total - stats.samples_skipped - stats.samples_done - stats.rejected
        raise stopping.StopRequested(stopped_by, (
            f"phase 1 of {out_path.parent.name} stopped: {stats.samples_done} answer(s) of this "
            f"run kept in {out_path}, {missing} still to ask (the rerun asks only for those)"))
    if fatal:
        if isinstance(fatal[0], ServerOutputError):
            # Answers of a misconfigured server: not kept, so the fixed server answers them.
            with contextlib.suppress(FileNotFoundError):
                rejects_path.unlink()
        raise fatal[0]
    if stats.failures:
        message = (f"{stats.failures} of {total} samples failed (listed in {failed_path}); "
                   f"{stats.samples_skipped + stats.samples_done + stats.rejected} are done in "
                   f"{out_path} (and {rejects_path.name}). Run again "
                   "to request only the missing ids.")
        if raise_on_failure:
            raise GenerationIncomplete(message, stats=stats, failed_path=failed_path)
        log.error("%s", message)
        return stats
    _finalize(out_path, convs, _index_existing(out_path), manifest_config, inputs, refused,
              max_rejected_share)
    stats.elapsed_s = time.monotonic() - started
    log.info("%s: %s", out_path, asdict(stats))
    return stats


def run_generation(conversations: Iterable[Conversation], out_path: Path, cfg: GenerationConfig,
                   **kwargs: Any) -> GenStats:
    """Synchronous `generate_dataset` (runs its own event loop; same arguments and errors)."""
    return asyncio.run(generate_dataset(conversations, out_path, cfg, **kwargs))
