"""tasks.retries: transient failures are retried, the user's own mistakes are not."""

from __future__ import annotations

from types import SimpleNamespace

from eyas.errors import ConfigError, DataError, RemoteError
from tasks.retries import USER_ERRORS, retry_unless


def _state(exc: BaseException | None):
    def result():
        if exc is not None:
            raise exc
        return 1

    return SimpleNamespace(result=result)


def test_retry_unless_the_failure_is_permanent():
    retry = retry_unless(*USER_ERRORS)
    assert retry(None, None, _state(RemoteError("host gone"))) is True
    assert retry(None, None, _state(MemoryError())) is True
    assert retry(None, None, _state(ConfigError("bad field", where="x"))) is False
    assert retry(None, None, _state(DataError("bad line", path="f", line=3))) is False
    assert retry(None, None, _state(None)) is True
