"""A fault-injecting HTTP/1.1 proxy on 127.0.0.1, in front of a real server, for tests.

Each request first takes the next fault of `script` (FIFO); when the script is empty the
`rules` are asked in order (each may return a Fault for that request body); otherwise the
request passes through to `upstream`. Faults:

- ``Fault.status_code(429, retry_after="1")`` — answer with that status (and ``Retry-After``);
- ``Fault.drop()`` — close the socket without any response;
- ``Fault.slow(3.0)`` — wait that long, then close (longer than the client's timeout);
- ``Fault.respond(body)`` — answer 200 with a canned JSON body.

Every request is recorded in `seen` (arrival time, path, JSON body, Authorization header,
what was done), so tests assert on what the client really sent. The server runs on its own
event loop in a thread; it is small and speaks just enough HTTP/1.1 (Content-Length
bodies, keep-alive) for httpx.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import httpx


@dataclass
class Fault:
    kind: str
    status: int = 200
    retry_after: str | None = None
    delay_s: float = 0.0
    body: Any = None

    @classmethod
    def status_code(cls, status: int, *, retry_after: str | None = None, body: Any = None) -> Fault:
        return cls("status", status=status, retry_after=retry_after,
                   body=body if body is not None else {"error": {"message": f"injected {status}"}})

    @classmethod
    def drop(cls) -> Fault:
        return cls("drop")

    @classmethod
    def slow(cls, delay_s: float) -> Fault:
        return cls("slow", delay_s=delay_s)

    @classmethod
    def respond(cls, body: Any) -> Fault:
        return cls("respond", status=200, body=body)


@dataclass
class Seen:
    t: float
    """time.monotonic() at arrival."""
    method: str
    path: str
    body: Any
    authorization: str | None
    action: str
    """'pass', 'status-429', 'drop', 'slow', 'respond'."""


@dataclass
class FaultProxy:
    upstream: str
    """Root of the real server, e.g. ``http://127.0.0.1:8000`` (paths are kept)."""
    script: deque[Fault] = field(default_factory=deque)
    rules: list[Callable[[Any], Fault | None]] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- control (from the test's thread)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def add(self, *faults: Fault) -> None:
        with self._lock:
            self.script.extend(faults)

    def reset(self) -> None:
        with self._lock:
            self.script.clear()
            self.rules.clear()
            self.seen.clear()

    def chat_requests(self) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.path.endswith("/chat/completions")]

    def start(self) -> FaultProxy:
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            self._client = httpx.AsyncClient(base_url=self.upstream, timeout=120)
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", 0))
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            self._loop.run_forever()
            # Handlers still running (a slow answer the client gave up on) end here, so no
            # coroutine is left for the garbage collector to complain about.
            pending = asyncio.all_tasks(self._loop)
            for t in pending:
                t.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.run_until_complete(self._client.aclose())
            self._loop.close()

        self._thread = threading.Thread(target=run, name="fault-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is None:
            return

        async def shutdown() -> None:
            self._server.close()
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop)
        self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- serving (on the proxy's loop)

    def _next_fault(self, body: Any) -> Fault | None:
        with self._lock:
            if self.script:
                return self.script.popleft()
            rules = list(self.rules)
        for rule in rules:
            fault = rule(body)
            if fault is not None:
                return fault
        return None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        k, v = line.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = None
                fault = self._next_fault(body) if path.endswith("/chat/completions") else None
                action = "pass" if fault is None else (
                    f"status-{fault.status}" if fault.kind == "status" else fault.kind)
                with self._lock:
                    self.seen.append(Seen(time.monotonic(), method, path, body,
                                          headers.get("authorization"), action))
                if fault is not None and fault.kind == "drop":
                    break
                if fault is not None and fault.kind == "slow":
                    await asyncio.sleep(fault.delay_s)
                    break
                if fault is not None:
                    extra = {"Retry-After": fault.retry_after} if fault.retry_after else {}
                    await self._write(writer, fault.status, json.dumps(fault.body).encode(), extra)
                    continue
                fwd = {k: v for k, v in headers.items()
                       if k not in ("host", "content-length", "connection")}
                resp = await self._client.request(method, path, content=raw, headers=fwd)
                await self._write(writer, resp.status_code, resp.content,
                                  {"Content-Type": resp.headers.get("content-type",
                                                                    "application/json")})
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, status: int, payload: bytes,
                     headers: dict[str, str]) -> None:
        reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "X"
        lines = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(payload)}"]
        headers = {"Content-Type": "application/json", **headers}
        lines += [f"{k}: {v}" for k, v in headers.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload)
        await writer.drain()
