"""Typed settings of the serving benchmark (wired into the pipeline config's evaluate section).

The speculative knobs are a small grid: every combination of `num_steps` x `eagle_topk` x
`num_draft_tokens` becomes one EAGLE-3 server, after the rules SGLang 0.5.23 itself applies:

- with ``eagle_topk == 1`` SGLang replaces ``num_draft_tokens`` by ``num_steps + 1``
  (``arg_groups/speculative_hook.py``, ``_handle_eagle_family``), so the grid does the same and
  drops the duplicates instead of starting identical servers;
- with ``eagle_topk > 1`` the draft tree offers ``topk + (num_steps - 1) * topk**2`` candidates
  of which ``num_draft_tokens - 1`` are kept (``speculative/eagle_utils.py``,
  ``organize_draft_results``): a combination asking for more is skipped, with the reason.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from eyas.config_model import ConfigModel


@dataclass(frozen=True, order=True)
class SpecKnobs:
    """One EAGLE-3 server's speculative settings (SGLang's three ``--speculative-*`` knobs)."""

    num_steps: int
    eagle_topk: int
    num_draft_tokens: int

    def label(self) -> str:
        """``steps 3 / topk 1 / 4 draft tokens``: how reports name this setting."""
        return (f"steps {self.num_steps} / topk {self.eagle_topk} / "
                f"{self.num_draft_tokens} draft tokens")


def max_draft_tokens(num_steps: int, eagle_topk: int) -> int:
    """The most ``num_draft_tokens`` SGLang can fill: the tree's candidates plus the root."""
    return eagle_topk + (num_steps - 1) * eagle_topk**2 + 1


class ServingConfig(ConfigModel):
    """SGLang without and with the drafter on a GPU host, driven at several batch sizes."""

    batch_sizes: list[int] = Field(default_factory=lambda: [1, 8, 32])
    """Requests in flight at once (closed loop: a new one starts when one ends), one run each."""
    num_steps: list[int] = Field(default_factory=lambda: [3, 5])
    """Grid of ``--speculative-num-steps`` (draft steps per verification)."""
    eagle_topk: list[int] = Field(default_factory=lambda: [1])
    """Grid of ``--speculative-eagle-topk`` (branching of the draft tree; 1 = a chain)."""
    num_draft_tokens: list[int] = Field(default_factory=lambda: [4])
    """Grid of ``--speculative-num-draft-tokens`` (tokens verified per step; with topk 1
    SGLang uses num_steps + 1 whatever is given, and so does the grid)."""
    num_prompts: int = Field(64, ge=1)
    """Requests per batch size, taken in file order from the held-out prompts (repeated when
    there are fewer; at least the largest batch size)."""
    warmup_requests: int = Field(4, ge=0)
    """Requests sent to each new server before measuring (not counted)."""
    repeats: int = Field(3, ge=1)
    """Measured runs per server and batch size (each after a cache flush); rows give their
    median and spread, and the verdict calls a difference only where the runs do not overlap."""
    flush_cache: bool = True
    """Empty SGLang's prefix cache (``POST /flush_cache``) before each measured run, so no run
    reuses the prefill of an earlier one."""
    max_tokens: int = Field(4096, ge=1)
    """Completion length limit per request (``max_new_tokens``): large enough for whole answers
    (public figures are over whole answers; set it to ``generation.max_tokens``)."""
    temperature: float = Field(0.0, ge=0.0)
    """Sampling temperature (0 = greedy: baseline and drafter then produce the same tokens)."""
    rejection_sampling: bool = False
    """Serve the drafter with SGLang's ``--speculative-use-rejection-sampling`` (the EAGLE-3
    servers only): at temperature > 0 drafts are sampled from the drafter and accepted with
    min(1, p/q), instead of its argmax accepted with probability p (SGLang's default). SGLang
    0.5.23 allows it only with ``eagle_topk`` 1 and a drafter whose draft vocabulary is the
    target's whole vocabulary (``train.draft_vocab_size`` ≥ the target's; the benchmark's
    check of the host says so before a server starts). Greedy (temperature 0) it changes nothing.
    docs/training.md, "At four epochs: the full draft vocabulary", measures what it is worth."""
    prompts: str | None = None
    """JSONL of held-out prompts on the host; default ``<workdir>/merged/eval.jsonl`` (records
    with ``input_ids`` + ``loss_mask``: the prompt is everything before the first supervised
    token). Or a benchmark's prompts (MT-Bench, GSM8K, HumanEval) as ``{"id", "messages"}``
    (or ``{"id", "prompt"}``) records, rendered with the target's chat template and
    generation prompt. Never the training split."""
    model_path: str | None = None
    """Target model folder on the host; default: the pipeline's ``target.model``."""
    draft_model_path: str | None = None
    """Exported drafter folder on the host; default ``<workdir>/drafter/export``."""
    port: int = Field(30000, ge=1024, le=65535)
    """Port of the server on the host's loopback (127.0.0.1); one server runs at a time."""
    tp_size: int = Field(1, ge=1)
    """Tensor-parallel GPUs per server (``--tp-size``; 8 for Kimi-K2.5 on 8 GPUs)."""
    sglang_python: str = "python3"
    """Python on the host whose environment has SGLang (its own venv: it pins its torch)."""
    eyas_python: str | None = None
    """Python on the host that runs the load generator; default: the host's eyas venv
    (``HostSpec.venv_path``, where ``eyas.remote.ship`` installs eyas)."""
    extra_server_args: list[str] = Field(default_factory=list)
    """More SGLang flags for both servers, e.g. ``["--mem-fraction-static", "0.85"]``."""
    server_env: dict[str, str] = Field(default_factory=dict)
    """Environment of the server processes, e.g. ``{"CUDA_VISIBLE_DEVICES": "0,1,2,3"}``."""
    startup_timeout_s: float = Field(1800.0, gt=0)
    """Seconds a server may take to answer its health check (loading a 1T model takes minutes)."""
    health_path: str = "/health_generate"
    """Health endpoint; SGLang's ``/health_generate`` answers 200 only once it can generate."""
    request_timeout_s: float = Field(600.0, gt=0)
    """Seconds one request may take (connect, send, wait for the whole answer)."""
    run_timeout_s: float = Field(1800.0, gt=0)
    """Seconds one batch-size run may take; then requests in flight are cancelled and counted
    as failed."""
    max_retries: int = Field(2, ge=0)
    """Retries of one request on a timeout, a dropped connection, 429 or 5xx."""
    ngram: bool = True
    """Also serve SGLang's own n-gram speculation (``--speculative-algorithm NGRAM``, no drafter):
    the speculative baseline a drafter must beat to be worth training."""
    ngram_num_draft_tokens: int | None = Field(None, ge=2)
    """``--speculative-num-draft-tokens`` of the n-gram server; None: SGLang's default (12)."""
    ngram_args: dict[str, int | str] = Field(default_factory=dict)
    """More n-gram flags by ``ServerArgs`` name, e.g. ``{"speculative_ngram_max_bfs_breadth":
    1}`` (SGLang 0.5.23 defaults: min/max BFS breadth 1/10, trie depth 18, capacity 10M)."""
    nvidia_smi: str = "nvidia-smi"
    """``nvidia-smi`` on the host, asked before each server starts whether its GPUs are free
    (absent: no GPU to check, nothing is checked)."""
    gpu_busy_mib: int = Field(2048, ge=0)
    """A GPU with more memory in use than this (MiB) counts as busy: the server would not fit."""
    gpu_free_wait_s: float = Field(120.0, ge=0)
    """Seconds to wait for busy GPUs to free (the previous server's memory takes a while)."""
    stop_grace_s: float = Field(30.0, gt=0)
    """Seconds between SIGTERM and SIGKILL when a server is stopped."""
    tie_band: float = Field(0.03, ge=0.0, lt=1.0)
    """Speedups within 1 ± this count as a tie in the verdict, not a win or a loss; where the
    runs' ranges overlap more widely than that, the verdict says "within noise"."""

    @field_validator("batch_sizes", "num_steps", "eagle_topk", "num_draft_tokens")
    @classmethod
    def _positive_list(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("must list at least one value")
        if any(x < 1 for x in v):
            raise ValueError(f"every value must be >= 1, got {v}")
        return sorted(set(v))

    @field_validator("ngram_args")
    @classmethod
    def _ngram_args(cls, v: dict[str, int | str]) -> dict[str, int | str]:
        from eyas.sglang_args import SERVER_ARGS

        bad = [k for k in v if not k.startswith("speculative_ngram_") or k not in SERVER_ARGS]
        if bad:
            names = sorted(n for n in SERVER_ARGS if n.startswith("speculative_ngram_"))
            raise ValueError(f"not an n-gram flag of SGLang 0.5.23: {', '.join(bad)} (expected "
                             f"one of {', '.join(names)}; the number of draft tokens is "
                             f"ngram_num_draft_tokens)")
        return v

    def ngram_flags(self) -> list[str]:
        """The n-gram server's flags after ``--speculative-algorithm NGRAM``."""
        flags = ([] if self.ngram_num_draft_tokens is None else
                 ["--speculative-num-draft-tokens", str(self.ngram_num_draft_tokens)])
        for key, value in sorted(self.ngram_args.items()):
            flags += ["--" + key.replace("_", "-"), str(value)]
        return flags

    @field_validator("health_path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(f"must start with '/', got {v!r}")
        return v

    @model_validator(mode="after")
    def _enough_prompts(self) -> ServingConfig:
        if self.num_prompts < max(self.batch_sizes):
            raise ValueError(
                f"num_prompts ({self.num_prompts}) must be at least the largest batch size "
                f"({max(self.batch_sizes)}), or that batch is never full"
            )
        if not self.spec_grid():
            raise ValueError("no valid speculative setting in the grid: " + "; ".join(
                why for _, why in self.skipped_knobs()))
        if self.rejection_sampling and self.eagle_topk != [1]:
            raise ValueError(f"rejection_sampling needs eagle_topk [1] (SGLang 0.5.23 samples "
                             f"only along a chain), got {self.eagle_topk}")
        return self

    def host_paths(self, workdir: str, target_model: str) -> tuple[str, str, str]:
        """``(model_path, draft_model_path, prompts)`` on the host: the fields when set, else
        `target_model`, ``<workdir>/drafter/export`` and ``<workdir>/merged/eval.jsonl``."""
        from eyas.layout import RunLayout

        run = RunLayout(Path(workdir))
        return (self.model_path or target_model,
                self.draft_model_path or str(run.export),
                self.prompts or str(run.eval))

    def _candidates(self) -> list[tuple[SpecKnobs, str | None]]:
        out: dict[SpecKnobs, str | None] = {}
        for steps, topk, tokens in itertools.product(self.num_steps, self.eagle_topk,
                                                     self.num_draft_tokens):
            if topk == 1:
                tokens = steps + 1
            knobs = SpecKnobs(steps, topk, tokens)
            if tokens < 2:
                why = "num_draft_tokens must be >= 2"
            elif tokens > max_draft_tokens(steps, topk):
                why = (f"num_draft_tokens {tokens} > {max_draft_tokens(steps, topk)}, what a tree "
                       f"of {steps} steps x topk {topk} can fill")
            else:
                why = None
            out.setdefault(knobs, why)
        return sorted(out.items())

    def spec_grid(self) -> list[SpecKnobs]:
        """The EAGLE-3 settings to serve, sorted, without duplicates or impossible ones."""
        return [k for k, why in self._candidates() if why is None]

    def skipped_knobs(self) -> list[tuple[SpecKnobs, str]]:
        """Combinations of the grid that SGLang could not serve, with the reason."""
        return [(k, why) for k, why in self._candidates() if why is not None]
