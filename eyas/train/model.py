"""The EAGLE-3 drafter, top to bottom, in one file.

One drafting step at sequence position t reads two things: the token ``x`` whose successor it
predicts (through the target's frozen embedding) and a hidden state ``h`` of width H. On the
first step ``h = fc(aux)``, the three auxiliary target states (3·H_target wide) projected to H;
on later steps ``h`` is the drafter's own previous output (before the final norm; after it with
EAGLE-3.1's ``norm_output``, and ``fc_norm`` norms each aux state before ``fc``). Then:

    e = input_layernorm(embed(x))          [.., H]
    a = attention(concat(e, hidden_norm(h)))   q/k/v read 2·H, o_proj writes H
    r = h + a
    out = r + mlp(post_attention_layernorm(r))   fed back as the next step's h
    logits = lm_head(norm(out))            over the draft vocabulary

This is the computation SGLang's ``LlamaForCausalLMEagle3`` serves (``DrafterConfig.attention``
"llama"; "mla" swaps the attention for the multi-head latent one of SGLang's
``Eagle3DeepseekV2ForCausalLM``: ``eyas.train.mla``); parameter names follow its
checkpoint names (``fc``, ``midlayer.*``, ``norm``, ``lm_head``), so export is a rename-free
copy. The embedding is the target's, frozen, and never saved (SGLang shares the target's).

``Drafter.step`` is that computation, written once (``MidLayer.forward``): every caller runs
it -- the evaluator's drafting, the training-time test's unroll, the dense reference,
``forward_causal`` -- and only what the step's queries attend to differs, a ``StepCache``:

- ``KVCache``: a server's cache, entries in order, each new query seeing the cached entries
  and the new ones up to itself (``eyas.evaluate.drafters``: the prompt, each verification's
  positions, the draft chain one entry at a time);
- ``UnrolledCache``: the training-time test's, a whole sequence of origins per step (step 0's
  keys causally, later steps' as each origin's own "diagonal"), on ``attend_causal``
  (``eyas.train.ttt``); ``eyas.train.dense`` has its [T, T] form;
- ``Masked``: no cache, an explicit mask (``forward_causal`` given one: the plain reference).

A cache is a value (``attend`` returns a new one), so a draft chain is dropped by keeping the
cache from before it and a step recomputed in backward computes the same again.

Attention is written out (not ``F.scaled_dot_product_attention`` with a flag) because the
training-time test needs a mask that is not causal: see ``eyas.train.ttt``. Two forms:

- ``attend`` takes an explicit boolean mask over keys (``True`` = may attend) and materialises
  the [queries, keys] scores: right for a few queries at a time (drafting with a cache) and
  the plain reference the tests hold everything else against;
- ``attend_causal`` is causal attention, optionally with a few extra keys per query (the
  training-time test's "diagonal"), in memory that grows linearly with T. Two kernels
  (`kernel`): "fused" runs the causal part on torch's flash kernel and merges the diagonal keys
  through its log-sum-exp (``eyas.train.fused_attention``: the default where that kernel
  runs); "chunked" computes a chunk of queries at a time and recomputes it in backward
  (``CausalAttention``: each chunk writes only its block of the gradients, no [T, T] matrix
  outlives one chunk) -- the reference the tests hold the fused one to, and the fallback.

Shape suffixes (``x_BATD``: a [B, A, T, D] tensor): B batch, A attention heads, T/Q/K
sequence/query/key positions, C a chunk of query positions, D head width, H hidden
width, V vocabulary.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from eyas.errors import ConfigError
from eyas.train import fused_attention
from eyas.train.drafter_config import (  # noqa: F401  (named here too: eyas.train.model.DrafterConfig)
    MLA_DEFAULT_HEAD_DIM,
    MLA_SIZES,
    DrafterConfig,
    is_mla,
    mla_attention_shape,
    mla_sizes,
    yarn_parameters,
)
from eyas.train.mla import MLAAttention
from eyas.train.norm import RMSNorm

log = logging.getLogger(__name__)


def frozen_weight(weight: torch.Tensor, *, copy: bool = False) -> torch.Tensor:
    """A frozen target weight, detached, in its stored dtype when torch computes in it (bf16
    stays bf16: half the memory of float32, and exact when widened), else float32 (e.g. a
    float8 checkpoint). `copy`: never share storage with `weight`."""
    weight = weight.detach()
    if weight.dtype not in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
        return weight.float()
    return weight.clone() if copy else weight


def rotate(x_BATD: torch.Tensor, pos_BT: torch.Tensor, theta: float) -> torch.Tensor:
    """Apply rotary position embedding (half-split layout, as HF Llama) at positions `pos_BT`."""
    d = x_BATD.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, device=x_BATD.device).float() / d))
    ang_BTd = pos_BT.float()[..., None] * inv_freq  # [B, T, D/2]
    ang_BTD = torch.cat([ang_BTd, ang_BTd], dim=-1)[:, None]  # [B, 1, T, D]
    cos, sin = ang_BTD.cos().to(x_BATD.dtype), ang_BTD.sin().to(x_BATD.dtype)
    x1, x2 = x_BATD[..., : d // 2], x_BATD[..., d // 2 :]
    return x_BATD * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    """Self-attention whose projections read 2·H (embedding ‖ hidden) and write H."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, nq, nkv = cfg.dim_per_head, cfg.num_attention_heads, cfg.num_key_value_heads
        self.q_proj = nn.Linear(2 * cfg.hidden_size, nq * d, bias=False)
        self.k_proj = nn.Linear(2 * cfg.hidden_size, nkv * d, bias=False)
        self.v_proj = nn.Linear(2 * cfg.hidden_size, nkv * d, bias=False)
        self.o_proj = nn.Linear(nq * d, cfg.hidden_size, bias=False)

    def qkv(
        self, x_BT2H: torch.Tensor, pos_BT: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated queries [B, nq, T, D] and keys/values [B, nq, T, D] (kv heads repeated)."""
        cfg = self.cfg
        B, T, _ = x_BT2H.shape
        d, nq, nkv = cfg.dim_per_head, cfg.num_attention_heads, cfg.num_key_value_heads
        q = self.q_proj(x_BT2H).view(B, T, nq, d).transpose(1, 2)
        k = self.k_proj(x_BT2H).view(B, T, nkv, d).transpose(1, 2)
        v = self.v_proj(x_BT2H).view(B, T, nkv, d).transpose(1, 2)
        q = rotate(q, pos_BT, cfg.rope_theta)
        k = rotate(k, pos_BT, cfg.rope_theta)
        rep = nq // nkv
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        return q, k, v

    def out(self, ctx_BATD: torch.Tensor) -> torch.Tensor:
        B, A, T, d = ctx_BATD.shape
        return self.o_proj(ctx_BATD.transpose(1, 2).reshape(B, T, A * d))


def attend(
    q_BAQD: torch.Tensor, k_BAKD: torch.Tensor, v_BAKD: torch.Tensor, mask_BQK: torch.Tensor
) -> torch.Tensor:
    """softmax(q·kᵀ/√D, masked) · v, scores in at least float32. `mask_BQK` True = attend.

    Every query must be allowed at least one key (each sees itself in this project)."""
    acc = torch.promote_types(q_BAQD.dtype, torch.float32)
    scores = torch.einsum("bhqd,bhkd->bhqk", q_BAQD.to(acc), k_BAKD.to(acc))
    scores = scores / math.sqrt(q_BAQD.shape[-1])
    scores = scores.masked_fill(~mask_BQK[:, None], float("-inf"))
    probs = scores.softmax(-1).to(v_BAKD.dtype)
    return torch.einsum("bhqk,bhkd->bhqd", probs, v_BAKD)


DEFAULT_CHUNK_MB = 1024
"""Working memory of one chunk of attention scores (and of logits in the loss)."""


def chunk_rows(chunk_mb: float, bytes_per_row: int, total: int) -> int:
    """How many rows of `bytes_per_row` fit `chunk_mb` MiB (at least 1, at most `total`)."""
    return max(1, min(total, int(chunk_mb * 2**20) // max(1, bytes_per_row)))


AttentionKernel = Literal["auto", "fused", "chunked"]
"""Which kernel ``attend_causal`` runs: "fused" (torch's flash kernel, log-sum-exp merged with
the diagonal keys), "chunked" (``CausalAttention``, the reference), or "auto": fused where its
kernel runs these inputs, else chunked (logged once per reason)."""

_FALLBACKS_LOGGED: set[str] = set()


def attend_causal(
    q_BATD: torch.Tensor,
    k_BATD: torch.Tensor,
    v_BATD: torch.Tensor,
    extra_k: Sequence[torch.Tensor] = (),
    extra_v: Sequence[torch.Tensor] = (),
    *,
    chunk_mb: float = DEFAULT_CHUNK_MB,
    kernel: AttentionKernel = "auto",
) -> torch.Tensor:
    """Causal attention: query t attends keys 0..t, plus its own row t of each tensor of
    `extra_k`/`extra_v` (each [B, A, T, D]; the training-time test's diagonal keys).

    Equals ``attend`` with the matching mask in memory linear in T, scores accumulated in
    float32 (or wider) on either kernel (`kernel`, see ``AttentionKernel``). The chunked one
    takes the queries in chunks sized to `chunk_mb`, each chunk seeing only the keys up to its
    last query; under autograd nothing of a chunk is kept: ``CausalAttention`` recomputes its
    scores in backward and writes only its own block of each gradient. Returns [B, A, T, D]
    in `v`'s dtype. Raises ConfigError when `kernel` is "fused" and no fused kernel runs these
    inputs (the reason named).
    """
    if len(extra_k) != len(extra_v):
        raise ValueError(f"{len(extra_k)} extra keys but {len(extra_v)} extra values")
    if kernel not in ("auto", "fused", "chunked"):
        raise ConfigError(f"attention kernel {kernel!r}: expected auto, fused or chunked",
                          where="train.attention_kernel")
    if kernel != "chunked":
        device_kernel, why = fused_attention.choose(q_BATD, k_BATD, v_BATD, (*extra_k, *extra_v))
        if device_kernel is not None:
            return fused_attention.attend_fused(q_BATD, k_BATD, v_BATD, extra_k, extra_v,
                                                kernel=device_kernel)
        if kernel == "fused":
            raise ConfigError(f"no fused attention kernel runs here: {why} (set "
                              "attention_kernel: auto or chunked)", where="train.attention_kernel")
        if why not in _FALLBACKS_LOGGED:
            _FALLBACKS_LOGGED.add(why)
            log.warning("attention: the chunked kernel, since %s", why)
    B, A, T, _ = q_BATD.shape
    acc = torch.promote_types(q_BATD.dtype, torch.float32)
    # scores, probabilities and their gradients: ~4 float32-or-wider copies per key
    rows = chunk_rows(chunk_mb, 4 * B * A * T * acc.itemsize, T)
    return CausalAttention.apply(rows, q_BATD, k_BATD, v_BATD, *extra_k, *extra_v)


class CausalAttention(torch.autograd.Function):
    """``attend_causal`` with a backward of its own (FlashAttention's, a chunk of queries at a
    time): forward keeps only its inputs and each query's log-sum-exp ([B, A, T] floats);
    backward recomputes a chunk's probabilities from them and writes the chunk's block of each
    gradient into buffers allocated once -- dq and the extras' rows [a, b), dk and dv rows
    [0, b) accumulated in float32 (or wider). Checkpointing each chunk instead made every
    chunk's backward allocate and zero-fill whole [B, A, T, D] gradients for its slices (T³
    work over the chunks) and pass over its scores some ten times.

    ``apply(rows, q, k, v, *extra_k, *extra_v)``: `rows` queries per chunk; every tensor
    [B, A, T, D].
    """

    @staticmethod
    def forward(ctx, rows: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                *extras: torch.Tensor) -> torch.Tensor:
        with torch.autocast(q.device.type, enabled=False):
            n = len(extras) // 2
            ek, ev = extras[:n], extras[n:]
            B, A, T, _ = q.shape
            acc = torch.promote_types(q.dtype, torch.float32)
            out = torch.empty(B, A, T, v.shape[-1], dtype=v.dtype, device=v.device)
            lse = torch.empty(B, A, T, 1, dtype=acc, device=q.device)
            for a in range(0, T, rows):
                b = min(T, a + rows)
                p, own = _chunk_probs(q, k, ek, a, b, acc)
                lse[:, :, a:b] = p.lse
                o = torch.matmul(p.probs.to(v.dtype), v[:, :, :b])
                for p_j, v_j in zip(own, ev, strict=True):
                    o += p_j.to(v.dtype) * v_j[:, :, a:b]
                out[:, :, a:b] = o
            ctx.rows = rows
            ctx.save_for_backward(q, k, v, lse, *extras)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g_out: torch.Tensor):
        q, k, v, lse, *extras = ctx.saved_tensors
        with torch.autocast(q.device.type, enabled=False):
            n = len(extras) // 2
            ek, ev = extras[:n], extras[n:]
            need = ctx.needs_input_grad[1:]
            B, A, T, D = q.shape
            acc = lse.dtype
            scale = D**-0.5
            g_out = g_out.to(v.dtype)
            dq = torch.empty_like(q) if need[0] else None
            dk = torch.zeros(k.shape, dtype=acc, device=k.device) if need[1] else None
            dv = torch.zeros(v.shape, dtype=acc, device=v.device) if need[2] else None
            dek = [torch.empty_like(x) if need[3 + j] else None for j, x in enumerate(ek)]
            dev = [torch.empty_like(x) if need[3 + n + j] else None for j, x in enumerate(ev)]
            for a in range(0, T, ctx.rows):
                b = min(T, a + ctx.rows)
                p, own = _chunk_probs(q, k, ek, a, b, acc, lse[:, :, a:b])
                go = g_out[:, :, a:b]  # [B, A, C, D]
                go_w = go.to(acc)
                # dP = dO·vᵀ; dS = P ∘ (dP - Σ P∘dP), the extras' columns alike
                dp = torch.matmul(go_w, v[:, :, :b].transpose(-1, -2).to(acc))
                dp_own = [(go_w * v_j[:, :, a:b].to(acc)).sum(-1, keepdim=True) for v_j in ev]
                rowsum = (p.probs * dp).sum(-1, keepdim=True)
                for p_j, d_j in zip(own, dp_own, strict=True):
                    rowsum += p_j * d_j
                if dv is not None:
                    dv[:, :, :b] += torch.matmul(p.probs.to(v.dtype).transpose(-1, -2), go)
                for j, p_j in enumerate(own):
                    if dev[j] is not None:
                        dev[j][:, :, a:b] = (p_j * go_w).to(ev[j].dtype)
                ds = dp.sub_(rowsum).mul_(p.probs).mul_(scale)  # scale: ∂S/∂(q·k)
                ds_own = [p_j * (d_j - rowsum) * scale for p_j, d_j in zip(own, dp_own,
                                                                           strict=True)]
                del p
                ds_in = ds.to(q.dtype)
                qc = q[:, :, a:b]
                if dq is not None:
                    g = torch.matmul(ds_in, k[:, :, :b]).to(acc)
                    for s_j, k_j in zip(ds_own, ek, strict=True):
                        g += s_j * k_j[:, :, a:b].to(acc)
                    dq[:, :, a:b] = g
                if dk is not None:
                    dk[:, :, :b] += torch.matmul(ds_in.transpose(-1, -2), qc)
                for j, s_j in enumerate(ds_own):
                    if dek[j] is not None:
                        dek[j][:, :, a:b] = (s_j * qc.to(acc)).to(ek[j].dtype)
            dk = dk.to(k.dtype) if dk is not None else None
            dv = dv.to(v.dtype) if dv is not None else None
        return None, dq, dk, dv, *dek, *dev


@dataclass
class _Probs:
    probs: torch.Tensor
    """[B, A, C, b]: probabilities of the chunk's queries over keys 0..b-1 (0 in the future)."""
    lse: torch.Tensor
    """[B, A, C, 1]: log of the softmax's normaliser."""


def _chunk_probs(q: torch.Tensor, k: torch.Tensor, ek: Sequence[torch.Tensor], a: int, b: int,
                 acc: torch.dtype, lse: torch.Tensor | None = None
                 ) -> tuple[_Probs, list[torch.Tensor]]:
    """Queries a..b-1: probabilities over keys 0..b-1 and over each extra key ([B, A, C, 1]),
    from the scores (softmax as torch computes it) or, given the log-sum-exp, as exp(s - lse).
    """
    scale = q.shape[-1] ** -0.5
    qc = q[:, :, a:b]
    # scores from the inputs widened to `acc`: a bf16 matmul would round them to bf16 before
    # the softmax (error ~1e-2 at score std 9), where the fused kernel accumulates in float32
    s = torch.matmul(qc.to(acc), k[:, :, :b].transpose(-1, -2).to(acc)).mul_(scale)
    # only the diagonal block [a, b) of keys holds a query's future
    span = torch.arange(b - a, device=q.device)
    s[..., a:b].masked_fill_(span[None, :] > span[:, None], float("-inf"))
    qw = qc.to(acc)
    own = [(qw * k_j[:, :, a:b].to(acc)).sum(-1, keepdim=True).mul_(scale) for k_j in ek]
    if lse is None:
        top = s.amax(-1, keepdim=True)
        for o in own:
            top = torch.maximum(top, o)
        s.sub_(top).exp_()
        own = [(o - top).exp_() for o in own]
        total = s.sum(-1, keepdim=True)
        for o in own:
            total += o
        lse = top + total.log()
        return _Probs(s.div_(total), lse), [o.div_(total) for o in own]
    return _Probs(s.sub_(lse).exp_(), lse), [(o - lse).exp_() for o in own]


def matmul_dtype(x: torch.Tensor, default: torch.dtype) -> torch.dtype:
    """The dtype autocast would run a matmul on `x` in (bf16 under bf16 autocast), else
    `default`."""
    kind = x.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else default


# -- the KV cache: what a step's queries attend to --------------------------------------------
class StepCache(Protocol):
    """What a drafting step's new entries attend to, and where their keys and values go.

    Keys and values are [B, A, T, D] for both attention kinds (the MLA kind's keys are its
    expanded nope + rope ones: SGLang caches the latent instead, for the same product). A cache
    is a value: ``attend`` returns a new one and leaves itself as it was, so a draft chain is
    thrown away by keeping the cache from before it, and a step recomputed in backward
    (``checkpoint_steps``) computes the same again.
    """

    def attend(self, q_BAQD: torch.Tensor, k_BAQD: torch.Tensor, v_BAQD: torch.Tensor
               ) -> tuple[torch.Tensor, StepCache]:
        """The new entries' attention [B, A, Q, D] (their queries, keys and values given), and
        the cache with their keys and values in it."""
        ...


@dataclass(frozen=True, eq=False)
class KVCache:
    """A server's drafter cache: keys and values [B, A, S, D] of the S entries read so far,
    in order. Query j of n new entries sees every cached entry and the new ones up to itself;
    its scores are materialised (``attend``): right for a few queries at a time."""

    keys_BASD: torch.Tensor | None = None
    values_BASD: torch.Tensor | None = None

    @property
    def length(self) -> int:
        """Entries cached (the evaluator's next entry sits at this rotary position)."""
        return 0 if self.keys_BASD is None else self.keys_BASD.shape[2]

    def attend(self, q_BAQD: torch.Tensor, k_BAQD: torch.Tensor, v_BAQD: torch.Tensor
               ) -> tuple[torch.Tensor, KVCache]:
        if self.keys_BASD is None or self.values_BASD is None:
            keys, values = k_BAQD, v_BAQD
        else:
            keys = torch.cat([self.keys_BASD, k_BAQD], dim=2)
            values = torch.cat([self.values_BASD, v_BAQD], dim=2)
        S, n = keys.shape[2], q_BAQD.shape[2]
        index_S = torch.arange(S, device=keys.device)
        mask_QS = index_S[None, :] <= index_S[S - n:, None]
        return attend(q_BAQD, keys, values, mask_QS[None]), KVCache(keys, values)


@dataclass(frozen=True, eq=False)
class Masked:
    """No cache: the new entries attend one another through an explicit mask [B, Q, Q]
    (True = may attend; ``attend``), the plain reference the tests hold the other forms to."""

    mask_BQK: torch.Tensor

    def attend(self, q_BAQD: torch.Tensor, k_BAQD: torch.Tensor, v_BAQD: torch.Tensor
               ) -> tuple[torch.Tensor, Masked]:
        return attend(q_BAQD, k_BAQD, v_BAQD, self.mask_BQK), self


@dataclass(frozen=True, eq=False)
class UnrolledCache:
    """The training-time test's keys (``eyas.train.ttt``), one whole sequence of origins per
    step: step 0's entries of every origin, attended causally, then each origin's own entries
    of steps 1..i (the "diagonal": one key per query per step). Empty, ``attend`` is causal
    attention over the new entries, which become step 0's; after that each step's entries
    join the diagonal. Attention is ``attend_causal`` on `kernel`, in memory linear in T."""

    chunk_mb: float = DEFAULT_CHUNK_MB
    """Working memory of one chunk of scores (the chunked kernel's)."""
    kernel: AttentionKernel = "auto"
    """``attend_causal``'s kernel."""
    k0_BATD: torch.Tensor | None = None
    """Step 0's keys (None: empty)."""
    v0_BATD: torch.Tensor | None = None
    diag_k: tuple[torch.Tensor, ...] = ()
    """Keys of steps 1..i, [B, A, T, D] each: row t is origin t's own."""
    diag_v: tuple[torch.Tensor, ...] = ()

    def grown(self, k_BATD: torch.Tensor, v_BATD: torch.Tensor) -> UnrolledCache:
        """This cache with one more step's entries: step 0's when empty, else the diagonal's."""
        if self.k0_BATD is None:
            return replace(self, k0_BATD=k_BATD, v0_BATD=v_BATD)
        return replace(self, diag_k=(*self.diag_k, k_BATD), diag_v=(*self.diag_v, v_BATD))

    def attend(self, q_BATD: torch.Tensor, k_BATD: torch.Tensor, v_BATD: torch.Tensor
               ) -> tuple[torch.Tensor, UnrolledCache]:
        new = self.grown(k_BATD, v_BATD)
        return new.attention(q_BATD), new

    def attention(self, q_BATD: torch.Tensor) -> torch.Tensor:
        """`q`'s attention over the cache (its own step's entries in it)."""
        assert self.k0_BATD is not None and self.v0_BATD is not None
        return attend_causal(q_BATD, self.k0_BATD, self.v0_BATD, self.diag_k, self.diag_v,
                             chunk_mb=self.chunk_mb, kernel=self.kernel)


class MLP(nn.Module):
    """SwiGLU feed-forward, Llama's."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    """The single decoder layer (SGLang calls it ``midlayer``)."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)  # on the embedding
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)  # on the fed hidden
        if cfg.attention == "mla":
            self.self_attn = MLAAttention(cfg)
        else:
            self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, embed_BTH: torch.Tensor, hidden_BTH: torch.Tensor, pos_BT: torch.Tensor,
                cache: StepCache) -> tuple[torch.Tensor, StepCache]:
        """The layer over T new entries (embedded token, fed hidden, rotary position): the
        pre-norm outputs [B, T, H] (what is fed back) and `cache` with the entries' keys and
        values in it. What the queries attend to is `cache`'s to say (``StepCache``)."""
        # the 2·H attention input: normed embedding first, normed hidden second (SGLang's order)
        x_BT2H = torch.cat([self.input_layernorm(embed_BTH), self.hidden_norm(hidden_BTH)], dim=-1)
        x_BT2H = x_BT2H.to(matmul_dtype(x_BT2H, x_BT2H.dtype))  # autocast: one bf16 copy, not 3
        q_BATD, k_BATD, v_BATD = self.self_attn.qkv(x_BT2H, pos_BT)
        ctx_BATD, cache = cache.attend(q_BATD, k_BATD, v_BATD)
        r_BTH = hidden_BTH + self.self_attn.out(ctx_BATD)
        return r_BTH + self.mlp(self.post_attention_layernorm(r_BTH)), cache


class Drafter(nn.Module):
    """EAGLE-3 drafter. `embed_VH` is the target's token embedding (frozen buffer, not saved).

    Parameters are named as SGLang's checkpoint expects: ``fc.weight``, ``midlayer.*``,
    ``norm.weight``, ``lm_head.weight``.
    """

    def __init__(self, cfg: DrafterConfig, embed_VH: torch.Tensor) -> None:
        super().__init__()
        if tuple(embed_VH.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise ConfigError(
                f"embedding has shape {tuple(embed_VH.shape)}, drafter expects "
                f"[vocab_size={cfg.vocab_size}, hidden_size={cfg.hidden_size}] (SGLang feeds "
                "the target's embedding, so the drafter must be as wide as the target's)",
                where="drafter.hidden_size",
            )
        self.cfg = cfg
        self.register_buffer("embed_VH", frozen_weight(embed_VH, copy=True), persistent=False)
        self.fc = nn.Linear(3 * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList(
                RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps) for _ in range(3))
        self.midlayer = MidLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        """Normal(0, std) linear weights, unit norms (deterministic under torch.manual_seed)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    @torch.no_grad()
    def init_head_from_target(self, lm_head_VH: torch.Tensor, draft_to_target: torch.Tensor,
                              final_norm_H: torch.Tensor | None = None) -> None:
        """Start ``lm_head`` as the target's head restricted to the draft vocabulary (rows
        `draft_to_target`), its final norm's weight folded in: on the target's own final
        hidden state the drafter's head then gives the target's logits, so training starts
        from a head that already reads the target's space instead of from noise."""
        rows_VdH = lm_head_VH.index_select(0, draft_to_target.to(lm_head_VH.device)).float()
        if final_norm_H is not None:
            rows_VdH = rows_VdH * final_norm_H.float()
        self.lm_head.weight.copy_(rows_VdH.to(self.lm_head.weight.device,
                                              self.lm_head.weight.dtype))
        self.norm.weight.fill_(1.0)

    def project(self, aux_BTA: torch.Tensor) -> torch.Tensor:
        """Step 0's hidden state from the target's auxiliary states: ``fc`` (after an RMSNorm
        on each of the three states with ``fc_norm``, as SGLang's EAGLE-3.1 layout)."""
        if self.cfg.fc_norm:
            aux_BTA = torch.cat([norm(part) for norm, part in
                                 zip(self.fc_norm, aux_BTA.chunk(3, dim=-1), strict=True)], -1)
        return self.fc(aux_BTA)

    def feedback(self, out_BTH: torch.Tensor) -> torch.Tensor:
        """The hidden state the next draft step reads: the pre-norm output, or the normed one
        with ``norm_output`` (SGLang's EAGLE-3.1 option)."""
        return self.norm(out_BTH) if self.cfg.norm_output else out_BTH

    def embed(self, ids_BT: torch.Tensor) -> torch.Tensor:
        """Rows of the frozen embedding, widened to at least float32 (it may be stored in bf16,
        as the target stores it: half the memory, and the rows are exact in float32)."""
        rows = F.embedding(ids_BT, self.embed_VH)
        return rows.to(torch.promote_types(rows.dtype, torch.float32))

    def logits(self, out_BTH: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [B, T, Vd] of pre-norm outputs."""
        return self.lm_head(self.norm(out_BTH))

    def step(self, ids_BT: torch.Tensor, hidden_BTH: torch.Tensor, pos_BT: torch.Tensor,
             cache: StepCache) -> tuple[torch.Tensor, StepCache]:
        """One drafting step over T new entries: token `ids_BT` (whose successor each entry
        predicts), fed hidden `hidden_BTH` (already H wide: ``project`` of the aux states on
        step 0, ``feedback`` of the previous output after), rotary position `pos_BT`.

        Returns the pre-norm outputs [B, T, H] (``logits`` scores them, ``feedback`` feeds
        them to the next step) and `cache` with the new entries' keys and values. The
        embedding rows are read in the weights' dtype (a bf16 drafter reads bf16 rows).
        Logits stay out of the step: training scores them a chunk of positions at a time.

        Every caller computes its step here, and only the cache differs (``StepCache``): the
        evaluator's drafting and ``forward_causal`` with a mask read a ``KVCache`` or
        ``Masked`` (few queries, explicit scores); the training-time test
        (``eyas.train.ttt.unroll``) and ``forward_causal`` without a mask an
        ``UnrolledCache`` (a whole sequence per step, memory linear in T); the dense reference
        (``eyas.train.dense``) its [T, T] form of that cache.
        """
        return self.midlayer(self.embed(ids_BT).to(self.fc.weight.dtype), hidden_BTH, pos_BT,
                             cache)

    def forward_causal(
        self,
        ids_BT: torch.Tensor,
        hidden_BTH: torch.Tensor,
        pos_BT: torch.Tensor,
        mask_BTT: torch.Tensor | None = None,
        *,
        chunk_mb: float = DEFAULT_CHUNK_MB,
        kernel: AttentionKernel = "auto",
    ) -> torch.Tensor:
        """One ``step`` over an explicit sequence of entries, nothing cached before them.

        With `mask_BTT` None attention is causal and memory-bounded (an empty
        ``UnrolledCache``: ``attend_causal`` on `kernel`); with a mask, ``attend`` over it
        (``Masked``). Returns the pre-norm outputs [B, T, H]. ``eyas.train.ttt`` computes the
        same thing for all positions and steps at once, and the tests hold the two equal.
        """
        cache: StepCache = (UnrolledCache(chunk_mb=chunk_mb, kernel=kernel) if mask_BTT is None
                            else Masked(mask_BTT))
        return self.step(ids_BT, hidden_BTH, pos_BT, cache)[0]

    def num_trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)
