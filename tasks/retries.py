"""When a failed task is retried: transient failures yes, the user's own mistakes no."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eyas.errors import ConfigError, DataError

USER_ERRORS: tuple[type[BaseException], ...] = (ConfigError, DataError)
"""Wrong settings or bad data: a retry would fail the same way."""


def retry_unless(*permanent: type[BaseException]) -> Callable[[Any, Any, Any], bool]:
    """A Prefect ``retry_condition_fn`` retrying every failure except the `permanent` kinds
    (the network, a host, memory: those may pass on the next try)."""

    def condition(task: Any, task_run: Any, state: Any) -> bool:
        try:
            state.result()
        except permanent:
            return False
        except BaseException:  # noqa: BLE001 - anything else may be transient
            return True
        return True

    return condition
