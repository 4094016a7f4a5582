"""Training settings as typed data (`PipelineConfig.train`; also flags of `python -m eyas.train.run`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from eyas.config_model import ConfigModel

LossObjective = Literal["kl", "lk_log", "lk_hybrid"]
"""The training objectives of `TrainConfig.loss`."""



class MlaSettings(ConfigModel):
    """The MLA drafter's attention (`train.mla`, with ``train.drafter: mla`` only): each size
    None takes the target's (an MLA target such as Kimi-K2.5 keeps its own; another target gets
    DeepSeek-V3's proportions of its head width, `eyas.train.drafter_config.mla_sizes`)."""

    num_heads: int | None = Field(None, ge=1)
    """Attention heads; None: the target's."""
    q_lora_rank: int | None = Field(None, ge=1)
    """Low-rank query width; None: the target's (a non-MLA target: 12 x its head width, at
    most its hidden size)."""
    kv_lora_rank: int | None = Field(None, ge=1)
    """Cached latent width; None: the target's (else 4 x head width, at most hidden)."""
    qk_nope_head_dim: int | None = Field(None, ge=1)
    """Per-head query/key width without rotary position; None: the target's (else its head
    width)."""
    qk_rope_head_dim: int | None = Field(None, ge=2)
    """Per-head rotated query/key width (even); None: the target's (else half its head
    width)."""
    v_head_dim: int | None = Field(None, ge=1)
    """Per-head value width; None: the target's (else its head width)."""
    init_attention: Literal["random", "target"] = "random"
    """"target" starts the attention from the target's last decoder layer (an MLA target whose
    sizes the drafter keeps): its down-projections read the hidden half of the 2 x H input,
    the embedding half starts at zero, the rest is copied; "random": normal, std 0.02
    (docs/training.md "Drafter kinds" has the study)."""

    def sizes(self) -> dict:
        """The sizes set here (``DrafterConfig.from_target``'s overrides)."""
        return {k: v for k, v in self.model_dump().items()
                if k != "init_attention" and v is not None}

    def named(self) -> list[str]:
        """The settings given a value other than their default."""
        return [k for k, v in self.model_dump().items() if v != type(self).model_fields[k].default]


class TrainConfig(ConfigModel):
    """How the EAGLE-3 drafter is trained. Defaults follow the common recipe of EAGLE-3 and
    SpecForge (TTT unroll 7, AdamW lr 1e-4 with warmup and cosine decay, grad clip 0.5)."""

    steps: int = Field(1000, ge=1)
    """Optimizer steps in total (each one `grad_accum` micro-batches per process); ignored
    when `epochs` is set."""
    epochs: float | None = Field(None, gt=0)
    """Passes over the training samples; when set, the steps are ``ceil(epochs × samples /
    (processes × grad_accum × micro_batch))``, counted when training starts (`eyas train
    --plan` prints them beforehand). None: `steps` decides."""
    lr: float = Field(1e-4, gt=0)
    """Peak AdamW learning rate."""
    warmup_steps: int | None = Field(None, ge=0)
    """Linear warmup steps before the cosine decay; None: `warmup_fraction` of the steps."""
    warmup_fraction: float = Field(0.015, ge=0, lt=1)
    """Warmup as a share of the run's steps when `warmup_steps` is None (1.5 %: what public
    EAGLE-3 recipes use; 184 steps of the Kimi recipe's 12,263)."""
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """Cosine decays to `lr * min_lr_ratio` at the last step."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    grad_clip: float = Field(0.5, gt=0)
    """Clip the global gradient norm to this value."""
    micro_batch: int = Field(1, ge=1)
    """Samples per forward pass (padded to the longest)."""
    group_batches: int = Field(4, ge=1)
    """Sort each run of this many optimizer steps' samples (of a seeded shuffle) by length
    before cutting it into steps and micro-batches: less padding, so more real tokens per
    second when lengths vary (1.33x on the tiny demo, same acceptance: docs/training.md
    "Recipe study"), and with several processes every rank of a step gets a sample of similar
    length, so none waits for another (8 GPUs busy 96% of the time at 32, 41% at 1:
    benchmarks/ddp_balance.py); 1: a plain shuffle."""
    loss_norm: Literal["sample", "token"] = "sample"
    """How a step's loss weighs its tokens. "sample": each micro-batch's soft-CE is the mean
    over its own scored tokens, micro-batches (and processes) weigh the same -- at micro-batch
    1 a token weighs 1/(its sample's tokens). "token": every scored token of the whole step
    weighs the same (step i's sum divided by its count over every micro-batch and process,
    one small all-reduce a step): the step's gradient is then the same however its samples
    are split into micro-batches, accumulation and processes. On the tiny target the two
    reach the same acceptance (docs/training.md)."""
    loss: LossObjective = "kl"
    """The per-position objective of each TTT step (weighted by the steps' 0.8^i and
    normalised by `loss_norm` alike). "kl": soft cross-entropy to the teacher over the draft
    vocabulary (its KL plus a constant), EAGLE-3's objective. "lk_log" and "lk_hybrid": the
    LK losses (Samarin et al., arXiv 2602.23881), which train on the acceptance rate
    ``α = Σ_x min(p(x), q(x))`` itself: "lk_log" minimises ``-log α``; "lk_hybrid"
    ``λ·KL + (1-λ)·(1-α)`` with ``λ = exp(-3·α)`` (α without gradient, per position). α is
    taken against the same teacher as "kl" (restricted to the draft vocabulary and
    renormalised; positions whose argmax is outside it stay out of the loss). On the real
    target neither LK loss beat "kl", greedy or sampled (docs/training.md "Sampled decoding:
    the objective")."""
    prefetch: int = Field(4, ge=0)
    """Micro-batches of shard data read ahead by a background thread (pinned in memory for a
    GPU; float8 aux states of storage "compact" widened on the device), in the same order;
    0: read on the training thread. Online data is always read on the training thread."""
    grad_accum: int = Field(1, ge=1)
    """Micro-batches per process whose gradients add up to one optimizer step (a step sees
    `processes` × `grad_accum` × `micro_batch` samples)."""
    processes: int | None = Field(None, ge=1)
    """Training processes on the host, one per GPU (DDP through torchrun; 1 runs without it).
    None: one per GPU of the host (its block's `num_gpus`, else what torch sees), 1 without
    GPUs. On CPU more than 1 runs gloo processes."""
    max_len: int | None = Field(None, ge=8)
    """Truncate samples to this many tokens. None: the merge's `max_seq_len` in a pipeline
    config (a different value is refused there); whole samples when training runs alone."""
    ttt_steps: int = Field(7, ge=1)
    """Training-time-test unroll length k."""
    draft_vocab_size: int = Field(32_000, ge=1)
    """Draft vocabulary size N (clipped to the target's vocabulary)."""
    seed: int = 0
    """Seeds the drafter's initialisation and the data order."""
    eval_every: int = Field(100, ge=1)
    """Evaluate every this many optimizer steps, and at the end; the best evaluation's
    weights are kept (``best/``) and exported."""
    eval_samples: int | None = Field(None, ge=1)
    """Evaluate on the first N eval samples only (None: all)."""
    best_draft_steps: int | None = Field(None, ge=1)
    """Draft steps n of the τ_n that chooses the best evaluation: the length the drafter is
    served with. None: in a pipeline config `evaluate.draft_tokens` (SGLang's
    ``--speculative-num-steps``; 3), else `ttt_steps`; at most `ttt_steps`."""
    checkpoint_every: int | None = Field(None, ge=1)
    """Write the resumable checkpoint every this many steps; None: when `checkpoint_minutes`
    have passed since the last one. Also at the end and when stopped."""
    checkpoint_minutes: float = Field(30.0, gt=0)
    """With `checkpoint_every` None: minutes of training between two checkpoints (decided
    by the first process, which alone writes; the others wait at the next step). A crash
    loses at most this much; each checkpoint of the Kimi-width drafter is ~10.75 GB written
    synchronously, so every 100 steps would be 123 of them (docs/training.md)."""
    grad_compression: Literal["none", "bf16"] = "none"
    """With several processes: "bf16" all-reduces the gradients in bfloat16 (DDP's
    ``bf16_compress_hook``: half the bytes over PCIe, 3.2 instead of 6.3 GB a GPU a step at
    the Kimi width; the sum is cast back to float32) -- docs/training.md has its τ effect on
    the tiny target; "none": float32."""
    log_every: int = Field(10, ge=1)
    """Print progress every this many steps."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """"bf16": bf16 autocast (float32 weights and optimizer) on any device -- on a CPU with
    AVX512-BF16 or AMX about 1.5x the tokens/s of "fp32"; "auto": bf16 on GPU, fp32 on CPU."""
    device: str = "auto"
    """Torch device: "auto" (cuda when available), "cpu", "cuda:0", ..."""
    storage: Literal["final", "topk"] = "final"
    """Teacher for online data (offline data takes the shards' storage)."""
    online_topk: int = Field(32, ge=1)
    """K for online storage "topk"."""
    init_head: Literal["random", "target"] = "target"
    """How the drafter's ``lm_head`` starts: "target": the target's head rows of the draft
    vocabulary, its final norm folded in (tau +0.06 at 60 steps of the tiny demo:
    docs/training.md "Recipe study"); "random": normal, std 0.02, as its other weights."""
    intermediate_size: int | None = Field(None, ge=1)
    """Drafter MLP width; None: the target's."""
    drafter: Literal["llama", "mla"] = "llama"
    """Drafter kind. "llama": SGLang's ``LlamaForCausalLMEagle3`` (q/k/v heads; caches
    2 x heads x head width per token: 32 KiB for Kimi-K2.5); "mla": its
    ``Eagle3DeepseekV2ForCausalLM``, multi-head latent attention as the DeepSeek-V3/Kimi target
    has (caches the latent and the rotary key: 1.1 KiB per token for Kimi-K2.5). Both serve
    with ``--speculative-algorithm EAGLE3`` (docs/training.md "Drafter kinds")."""
    fc_norm: bool = False
    """EAGLE-3.1: an RMSNorm on each auxiliary state before ``fc`` (either kind: both SGLang
    classes read it from the export's config)."""
    norm_output: bool = False
    """EAGLE-3.1: feed the next draft step the normed output, not the pre-norm one (either
    kind)."""
    mla: MlaSettings = Field(default_factory=MlaSettings)
    """The MLA drafter's attention sizes and initialisation (``drafter: mla`` only)."""

    @model_validator(mode="after")
    def _mla_settings_need_the_mla_kind(self) -> TrainConfig:
        if self.drafter == "mla":
            return self
        named = self.mla.named()
        if named:
            raise ValueError(f"{', '.join('mla.' + k for k in named)} are settings of the MLA "
                             "drafter; set drafter: mla (or remove them)")
        return self

    def warmup(self, steps: int | None = None) -> int:
        """Warmup steps of a run of `steps` (default `steps`): `warmup_steps`, else
        `warmup_fraction` of them, rounded."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        return round(self.warmup_fraction * (self.steps if steps is None else steps))

    def selection_draft_steps(self) -> int:
        """Draft steps of the τ that chooses the best evaluation (`best_draft_steps`, at
        most `ttt_steps`; None: `ttt_steps`)."""
        return min(self.best_draft_steps or self.ttt_steps, self.ttt_steps)

    def drafter_overrides(self) -> dict:
        """The MLA sizes and EAGLE-3.1 options set here (``DrafterConfig.from_target``'s
        `overrides`)."""
        flags = {k: True for k in ("fc_norm", "norm_output") if getattr(self, k)}
        return {**self.mla.sizes(), **flags}
    activation_checkpointing: bool = False
    """Keep only each TTT step's output, keys and values and recompute the rest in backward:
    less activation memory (see docs/training.md for the figures) for about a third more compute."""
    chunk_mb: float = Field(1024, gt=0)
    """Working memory of one chunk of attention scores, logits or teacher logits (MiB): fewer,
    larger chunks run faster on a GPU; a small machine may want less."""
    teacher_memo: bool = True
    """Storage "final": keep each sample's whole-vocabulary argmax (int32, 4 bytes a token, on
    the CPU) once computed, so later epochs and evaluations run only the draft-vocabulary part
    of the teacher (the V-wide matmul is about 88 % of its cost at Kimi-K2.5's vocabulary:
    docs/benchmarks.md "The teacher, every epoch"). The same training on CPU, bit for bit;
    with several processes every process holds every sample's (351 MB each at 87.8M tokens),
    exchanged at each step's end until complete. False: recomputed every time."""
    attention_kernel: Literal["auto", "fused", "chunked"] = "auto"
    """Training attention: "fused" runs torch's flash kernel (CPU; CUDA in bf16/fp16) with the
    TTT diagonal merged through its log-sum-exp, "chunked" the reference written in PyTorch
    operations (slower, the same values within float rounding); "auto" fused where it runs,
    else chunked, saying why in the log."""
