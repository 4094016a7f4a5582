"""The API key for phase 1: a Prefect Secret block, else an environment variable.

The key is returned to the caller only; it is never logged, passed as a task
parameter (parameters are stored and shown in the UI) or written to disk.
"""

from __future__ import annotations

import os

from eyas.config import GenerationConfig
from eyas.errors import ConfigError


def resolve_api_key(cfg: GenerationConfig) -> str | None:
    """`cfg.api_key_block` (a Secret block's name) wins; else `cfg.api_key_env`; else None."""
    if cfg.api_key_block:
        from prefect.blocks.system import Secret

        try:
            return Secret.load(cfg.api_key_block).get()
        except ValueError as exc:
            raise ConfigError(
                f"Prefect Secret block {cfg.api_key_block!r} not found ({exc}); create it with "
                f"`eyas secret set {cfg.api_key_block}` or in the UI (Blocks → Secret)",
                where="generation.api_key_block",
            ) from None
    return os.environ.get(cfg.api_key_env) or None
