"""Errors a user can act on: each names the file, line, field or setting to fix."""

from __future__ import annotations

from pathlib import Path

USER_ERROR_EXIT = 2
"""The exit code of an eyas entry point that refused its configuration or data (an `EyasError`):
a retry cannot help."""


class EyasError(Exception):
    """Base class for every error eyas raises on purpose."""


class ConfigError(EyasError):
    """A configuration value is missing or wrong.

    `where` is the config file (and field path) the user should edit.
    """

    def __init__(self, message: str, *, where: str | None = None) -> None:
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class DataError(EyasError):
    """A record in an input file is malformed.

    The message reads ``FILE:LINE: field 'F': what is wrong (expected ...)`` so that a
    user can open the file at that line.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        line: int | None = None,
        field: str | None = None,
        kind: str | None = None,
    ) -> None:
        self.path = str(path) if path is not None else None
        self.line = line
        self.field = field
        self.reason = message
        # A short name of what is wrong ("special-text"...), counted per dataset when records
        # are rejected; None lets `eyas.prepare.rejects.reason_of` name it from the message.
        self.kind = kind
        where = self.path or "<input>"
        if line is not None:
            where += f":{line}"
        text = f"{where}: "
        if field is not None:
            text += f"field '{field}': "
        super().__init__(text + message)

    def as_reject(self) -> dict:
        """The error as a JSON-able dict, for a rejects file."""
        out = {"path": self.path, "line": self.line, "field": self.field, "error": self.reason}
        if self.kind is not None:
            out["kind"] = self.kind
        return out


class RemoteError(EyasError):
    """A command or transfer on a (remote or local) host failed."""
