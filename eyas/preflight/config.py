"""Typed settings of preflight (wired into the pipeline config as its ``preflight`` section)."""

from __future__ import annotations

from pydantic import Field

from eyas.config_model import ConfigModel


class PreflightConfig(ConfigModel):
    """The minutes-long proof, on the GPU host, that every GPU piece of the run works."""

    enabled: bool = True
    """Run preflight as the first stage of ``eyas-pipeline`` when a GPU host is given (its
    result is cached for the same host, recipe and code); ``eyas pipeline --no-preflight``
    skips it once."""
    samples: int = Field(8, ge=1)
    """Merged training samples the capture check extracts and the training check trains on."""
    train_steps: int = Field(20, ge=1)
    """Optimizer steps of the short training run (over every GPU, the recipe's drafter shape)."""
    check_timeout_s: float = Field(300.0, gt=0)
    """Seconds one check may take before it is stopped and reported failed (each check has its
    own limit; the six checks before overfit stay within about 15 minutes on the users' host)."""
    collective_timeout_s: float = Field(60.0, gt=0)
    """Seconds the all-reduce/all-gather run may take before it counts as hung (then it is
    retried once with ``NCCL_P2P_DISABLE=1``)."""
    disk_probe_mb: int = Field(256, ge=1)
    """Size of the temporary file whose sequential write and read measure the data root's
    bandwidth (written with fsync, read back past the page cache)."""
    reserve_bytes: int = Field(0, ge=0)
    """Free space to keep on the data volume beyond the extraction plan (and its margin)."""
    max_new_tokens: int = Field(32, ge=1)
    """Tokens the serving check asks for its one prompt."""
    overfit_samples: int = Field(2, ge=1)
    """Prompts of the merged data whose greedy answers the overfit check's drafter memorises
    (docs/preflight.md "The overfit gate")."""
    overfit_steps: int = Field(60, ge=1)
    """Optimizer steps of the overfit check's training (one step sees every sample)."""
    overfit_answer_tokens: int = Field(48, ge=4)
    """Length of the target's greedy answer to each overfit prompt (and of the measured one)."""
    overfit_tolerance: float = Field(0.15, gt=0, lt=1)
    """The measured accept length may fall this fraction below training's τ on the overfit
    samples (bf16 export, the last verification cut short, near ties: a few per cent)."""
    overfit_timeout_s: float = Field(2400.0, gt=0)
    """Seconds the overfit check may take: with SGLang it starts the server twice (the
    target alone for the answers, then with the drafter) and the extraction engine once."""
