"""Engine jobs: one detached job extracts many shards with one loaded engine, while each shard
keeps its own Prefect task.

SGLang's engine for Kimi-K2.5 loads about 1T parameters over `tp_size` GPUs; one load per shard
would cost more than the shard. So the flow runs, per engine of a host
(`eyas.extract.placement.engine_groups`), one job ``python -m eyas.extract.run --shards a,b,c
--keep-going`` with ``CUDA_VISIBLE_DEVICES`` set to the engine's GPUs. The job prints one JSON
event per shard as it ends (`eyas.extract.run.SHARD_DONE` / `SHARD_FAILED`). An `EngineQueue`
follows the job's log from a thread of the driving process, logs its lines, and resolves that
shard's future; whoever waits for a shard (the flow's `tasks.extract.placed_shard_task`) gets its
row or its error -- per-shard states, tables and retries work as with one job per shard.

A retry (the task's next attempt) queues its shard again: shards queued while a job runs go
together into the engine's next job once it ends, so a few retries load the engine once. The
job holds its engine's GPUs (`hold`: the host's GPU slot pool) while it runs. A flow restarted
while a job runs re-attaches to it (by its id prefix) and takes the shards it names from its
command line; shards it does not name run in the next job. Nothing here knows Prefect: the
caller gives the job ids (naming its flow run) and the slots to hold.
"""

from __future__ import annotations

import contextvars
import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from eyas.disk import DiskSpaceError
from eyas.errors import ConfigError, RemoteError
from eyas.extract.run import SHARD_DONE, SHARD_FAILED, shards_of_command
from eyas.remote.hosts import HostSpec, connect
from eyas.remote.jobs import attach, cancel, job_dir, new_job_id, start_or_reattach

_ERRORS: dict[str, type[Exception]] = {"ConfigError": ConfigError, "DiskSpaceError": DiskSpaceError}
"""Errors a job reports that keep their class here (a retry cannot fix them: not retried)."""


class ShardJobError(RemoteError):
    """A shard failed inside an engine job, or the job ended before reaching it."""


class EngineQueue:
    """The jobs of one engine (a host's GPU group): shards queued, run in batches, one future
    per attempt of each shard.

    `command(indices)` builds the job's command line for a batch; `env` holds its environment
    (``CUDA_VISIBLE_DEVICES`` included); `hold()` is held while a job runs (the slots of the
    host's GPUs its engine takes); `job_id(prefix)` names a new job (`new_job_id` by default;
    a flow's names its run). `gather_s` is how long the queue waits after a first request
    before starting a job, so that requests arriving together share it.
    """

    def __init__(self, host: HostSpec, *, name: str, command: Callable[[list[int]], str],
                 env: Mapping[str, str], uses: list[str], logger: Any,
                 hold: Callable[[], AbstractContextManager[Any]] = nullcontext,
                 job_id: Callable[[str], str] = new_job_id,
                 gather_s: float = 1.0, poll_interval: float = 1.0) -> None:
        self.host, self.name, self.command = host, name, command
        self.env, self.uses, self.logger = dict(env), list(uses), logger
        self.hold, self.job_id = hold, job_id
        self.gather_s, self.poll_interval = gather_s, poll_interval
        self.jobs: list[str] = []
        """Ids of the jobs this queue started or re-attached to, in order."""
        self._cond = threading.Condition()
        self._latest: dict[int, Future] = {}
        self._handed: set[int] = set()  # ids of futures a waiter has already taken
        self._pending: list[int] = []
        self._closed = False
        self._running: str | None = None
        # Prefect's settings and run context travel in context variables: give them to the thread.
        ctx = contextvars.copy_context()
        self._thread = threading.Thread(target=ctx.run, args=(self._loop,), daemon=True,
                                        name=f"eyas-{name}")
        self._thread.start()

    # -- callers -----------------------------------------------------------------------------
    def submit(self, indices: list[int]) -> None:
        """Queue `indices` (the first attempt of each; a later `result` call retries)."""
        with self._cond:
            for i in indices:
                self._queue(i)

    def result(self, index: int) -> dict[str, Any]:
        """Wait for shard `index` and return its row; raise its error. The first call waits
        for the attempt already queued; a call after that attempt was handed out queues the
        shard again (a retry)."""
        with self._cond:
            f = self._latest.get(index)
            if f is None or (f.done() and id(f) in self._handed):
                f = self._queue(index)
            self._handed.add(id(f))
        return f.result()

    def close(self, *, cancel_running: bool = False) -> None:
        """Stop taking work: queued shards fail, the thread ends after its job (cancelled when
        `cancel_running`: the flow is failing or being cancelled)."""
        with self._cond:
            self._closed = True
            running = self._running
            self._cond.notify_all()
        if cancel_running and running is not None:
            with connect(self.host) as h:
                cancel(h, running)
        self._thread.join(timeout=None if cancel_running or running is None else 5)

    # -- the thread --------------------------------------------------------------------------
    def _queue(self, index: int) -> Future:
        f: Future = Future()
        self._latest[index] = f
        if index not in self._pending:
            self._pending.append(index)
        self._cond.notify_all()
        return f

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    _fail({i: self._latest[i] for i in self._pending},
                          "the flow stopped before this shard's job started")
                    self._pending.clear()
                    return
            time.sleep(self.gather_s)
            with self._cond:
                batch, self._pending = sorted(self._pending), []
                # This batch's attempts: a retry queued meanwhile gets a future of its own.
                futures = {i: self._latest[i] for i in batch}
                if self._closed:
                    _fail(futures, "the flow stopped before this shard's job started")
                    return
            try:
                self._run(batch, futures)
            except BaseException as exc:  # noqa: BLE001 -- every waiter must hear of it
                _fail(futures, f"{self.host.login}: {self.name}: {exc}")
                if not isinstance(exc, Exception):
                    raise

    def _run(self, batch: list[int], futures: dict[int, Future]) -> None:
        prefix = f"{self.name}"
        with self.hold(), connect(self.host) as h:
            job_id, reattached = start_or_reattach(
                h, self.command(batch), prefix=prefix, job_id=self.job_id(prefix), env=self.env,
                uses=self.uses)
            covered = batch
            if reattached:
                named = shards_of_command(h.read_text(f"{job_dir(h.spec.data_root, job_id)}/cmd"))
                covered = batch if named is None else [i for i in batch if i in set(named)]
            self.jobs.append(job_id)
            self.logger.info("%s job %s on %s: shards %s", "re-attached to" if reattached
                             else "started", job_id, self.host.login,
                             ", ".join(f"{i:05d}" for i in covered))
            with self._cond:
                self._running = job_id
            lines: list[str] = []
            try:
                code = attach(h, job_id, stream=lambda line: self._on_line(line, lines, futures),
                              poll_interval=self.poll_interval, cancel_on_interrupt=False)
            finally:
                with self._cond:
                    self._running = None
        tail = "\n".join(lines[-20:])
        _fail({i: futures[i] for i in covered},
              f"{self.host.login}: job {job_id} exited with {code} before this shard was done; "
              f"log tail:\n{tail}")
        left = [i for i in batch if i not in set(covered)]
        if left:  # a re-attached job did not name them: they go into the next job
            with self._cond:
                for i in left:
                    if i not in self._pending:
                        self._pending.append(i)
                self._cond.notify_all()

    def _on_line(self, line: str, lines: list[str], futures: dict[int, Future]) -> None:
        lines.append(line)
        event = _event(line)
        if event is None:
            self.logger.info("[%s] %s", self.host.login, line)
            return
        f = futures.get(int(event["index"]))
        if f is None or f.done():
            return
        if event["event"] == SHARD_DONE:
            row = {k: v for k, v in event.items() if k not in ("event", "index")}
            self.logger.info("[%s] %s: %s", self.host.login, row["shard"], row["status"])
            f.set_result(row)
        else:
            cls = _ERRORS.get(event.get("error_type", ""), ShardJobError)
            self.logger.error("[%s] %s failed: %s", self.host.login, event["shard"], event["error"])
            f.set_exception(cls(f"{self.host.login}: {event['shard']}: {event['error']}"))

def _fail(futures: Mapping[int, Future], message: str) -> None:
    """Fail every future of `futures` not resolved yet."""
    for i, f in futures.items():
        if not f.done():
            f.set_exception(ShardJobError(f"shard {i:05d}: {message}"))


def _event(line: str) -> dict | None:
    """A shard event of `eyas.extract.run` (a JSON line with ``event``), else None."""
    if not line.startswith('{"event"'):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if record.get("event") in (SHARD_DONE, SHARD_FAILED) else None


# -- the queues of a flow run, found by key from the shard tasks (same process, other threads) --
_QUEUES: dict[str, EngineQueue] = {}
_QUEUES_LOCK = threading.Lock()


def register(queue: EngineQueue) -> str:
    """Make `queue` findable by the key returned (a task parameter: plain text)."""
    key = f"{queue.name}-{uuid.uuid4().hex[:8]}"
    with _QUEUES_LOCK:
        _QUEUES[key] = queue
    return key


def lookup(key: str) -> EngineQueue:
    with _QUEUES_LOCK:
        queue = _QUEUES.get(key)
    if queue is None:
        raise RemoteError(f"engine queue {key} is gone (its flow run ended)")
    return queue


def unregister(key: str) -> None:
    with _QUEUES_LOCK:
        _QUEUES.pop(key, None)
