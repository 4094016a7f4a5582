"""Progress artifacts that move as work advances, throttled (every update is an API call)."""

from __future__ import annotations

import threading
import time
import uuid

from prefect.artifacts import update_progress_artifact

INTERVAL_S = 3.0
"""A progress artifact moves at most this often; the last step always goes through."""


class ThrottledProgress:
    """Moves the progress artifact `artifact_id` to ``100 * done / total`` at most every
    `interval` seconds (the first call and ``done >= total`` always go through). Safe to call
    from several threads; does nothing without an artifact."""

    def __init__(self, artifact_id: str | uuid.UUID | None, total: int | None = None, *,
                 interval: float = INTERVAL_S, label: str | None = None) -> None:
        self.artifact_id = uuid.UUID(str(artifact_id)) if artifact_id else None
        self.total, self.interval, self.label = total, interval, label
        self._last = -float("inf")
        self._lock = threading.Lock()
        self.updates = 0
        """Updates sent so far."""

    def __call__(self, done: int, total: int | None = None) -> None:
        """Report `done` units of `total` (default: the total given at construction)."""
        total = max(1, total or self.total or 1)
        if self.artifact_id is None:
            return
        now = time.monotonic()
        with self._lock:
            if done < total and now - self._last < self.interval:
                return
            self._last = now
            self.updates += 1
        description = f"{self.label}: {done} of {total}" if self.label else None
        update_progress_artifact(self.artifact_id, min(100.0, 100.0 * done / total),
                                 description=description)
