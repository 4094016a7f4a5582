"""The training attention on a fused flash kernel: causal keys plus the training-time test's
diagonal keys, memory linear in T, scores accumulated in float32.

Query t attends keys 0..t of the step-0 sequence (causal: what a flash kernel computes without
ever holding a [T, T] score matrix, its scores accumulated in float32 inside the kernel) plus
row t of each extra key tensor (the diagonal: one score per query and extra key, computed here
in float32 or wider). The kernel returns its log-sum-exp ``lse_c``; with the diagonal scores
``s_j`` the two merge exactly:

    lse = log(exp(lse_c) + Σ_j exp(s_j))
    out = exp(lse_c - lse) · out_c + Σ_j exp(s_j - lse) · v_j

Backward. Over the union of keys, the gradient that flows through the causal keys is exactly
the kernel's own flash backward called with the *merged* output and the *merged* lse: it
recomputes the causal keys' probabilities as exp(s - lse) (their share of the union's softmax)
and the softmax's row term Σ P∘dP as dOut·out (the union's), so dq, dk and dv of the causal
part come out exact. The diagonal part is a few elementwise products per query:

    p_j = exp(s_j - lse)   dv_j = p_j · dOut   ds_j = p_j · (dOut·v_j - dOut·out) · scale
    dq += ds_j · k_j       dk_j = ds_j · q

Kernels (`choose`): on CPU ``aten._scaled_dot_product_flash_attention_for_cpu`` (float64,
float32, bfloat16, float16; one torch thread or many); on CUDA FlashAttention-2's
``aten._scaled_dot_product_flash_attention`` (bfloat16/float16, where torch says it can run).
Both need the query, key and value heads equally wide: an MLA drafter's narrower values are
padded with zeros to the query width (their part of the output is zero, its gradient dropped).
Keys and values come in with one head per query head (``Attention.qkv`` repeats grouped ones).
Where no kernel runs, ``eyas.train.model.attend_causal`` falls back to its chunked attention
(``CausalAttention``), the reference the tests hold this one to, and logs why once.

Shapes: every tensor [B, A, T, D] (B batch, A heads, T positions, D head width).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

CPU_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
CUDA_DTYPES = (torch.bfloat16, torch.float16)


def choose(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           extras: Sequence[torch.Tensor] = ()) -> tuple[str | None, str]:
    """``("cpu", "")`` or ``("cuda", "")`` where a fused kernel runs these inputs, else
    ``(None, why not)``."""
    tensors = (q, k, v, *extras)
    if len({t.dtype for t in tensors}) > 1:
        return None, "the queries, keys and values differ in dtype: " + ", ".join(
            sorted({str(t.dtype) for t in tensors}))
    if len({t.device for t in tensors}) > 1:
        return None, "the queries, keys and values are on different devices"
    if q.shape[1] != k.shape[1] or k.shape[1] != v.shape[1]:
        return None, f"{q.shape[1]} query heads but {k.shape[1]} key heads (repeat them first)"
    dtype, device = q.dtype, q.device
    if device.type == "cpu":
        if dtype not in CPU_DTYPES:
            return None, f"the CPU flash kernel takes float64/32 and bf16/fp16, not {dtype}"
        return "cpu", ""
    if device.type == "cuda":
        if dtype not in CUDA_DTYPES:
            return None, (f"FlashAttention takes bfloat16/float16, not {dtype} (train with "
                          "precision bf16)")
        why = _flash_refuses(device, dtype, q.shape[1], _width(q.shape[-1], v.shape[-1], 8))
        return (None, why) if why else ("cuda", "")
    return None, f"no fused kernel on {device.type}"


@functools.lru_cache(maxsize=64)
def _flash_refuses(device: torch.device, dtype: torch.dtype, heads: int, width: int) -> str:
    """Why FlashAttention cannot run causal attention of `heads` heads `width` wide with
    gradients on `device` ("" when it can), as torch's own dispatcher decides."""
    probe = [torch.empty(1, heads, 8, width, dtype=dtype, device=device, requires_grad=True)
             for _ in range(3)]
    params = torch.backends.cuda.SDPAParams(*probe, None, 0.0, True, False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ok = torch.backends.cuda.can_use_flash_attention(params, True)
    if ok:
        return ""
    why = "; ".join(str(w.message) for w in seen) or "torch says it cannot run here"
    return f"FlashAttention cannot run heads {width} wide in {dtype}: {why}"


def attend_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 extra_k: Sequence[torch.Tensor] = (), extra_v: Sequence[torch.Tensor] = (),
                 *, kernel: str) -> torch.Tensor:
    """Causal attention over `k`/`v` plus row t of each extra key/value (see the module
    docstring) on `kernel` (``choose``'s answer). Returns [B, A, T, Dv] in `v`'s dtype."""
    return FusedAttention.apply(kernel, q, k, v, *extra_k, *extra_v)


def _width(dq: int, dv: int, multiple: int) -> int:
    """The head width the kernel runs at: the wider of the two, rounded up to `multiple`."""
    return -(-max(dq, dv) // multiple) * multiple


def _pad(x: torch.Tensor, width: int) -> torch.Tensor:
    return x if x.shape[-1] == width else F.pad(x, (0, width - x.shape[-1]))


class FusedAttention(torch.autograd.Function):
    """``apply(kernel, q, k, v, *extra_k, *extra_v)``. Keeps the inputs, the merged output
    (padded to the kernel's width) and the merged log-sum-exp ([B, A, T] floats).

    The output is laid out [B, T, A, D] in memory (a transposed view): the attention's output
    projection reads it as [B, T, A·D] without a copy, so the output kept here for backward is
    the very tensor the projection keeps, not one more [B, A, T, D] a step."""

    @staticmethod
    def forward(ctx, kernel: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                *extras: torch.Tensor) -> torch.Tensor:
        with torch.autocast(q.device.type, enabled=False):
            n = len(extras) // 2
            ek, ev = extras[:n], extras[n:]
            B, A, T, dq_width = q.shape
            dv_width = v.shape[-1]
            scale = dq_width**-0.5
            width = _width(dq_width, dv_width, 8 if kernel == "cuda" else 1)
            out_c, lse_c, saved = _forward(kernel, _pad(q, width), _pad(k, width),
                                           _pad(v, width), scale)
            out = torch.empty(B, T, A, width, dtype=v.dtype, device=v.device).transpose(1, 2)
            if n:
                acc = torch.promote_types(q.dtype, torch.float32)
                s = _diagonal_scores(q, ek, scale, acc)  # [n, B, A, T]
                lse = torch.logaddexp(lse_c.to(acc), torch.logsumexp(s, 0))
                merged = out_c.to(acc).mul_(torch.exp(lse_c - lse)[..., None])
                for s_j, v_j in zip(s, ev, strict=True):
                    merged[..., :dv_width] += torch.exp(s_j - lse)[..., None] * v_j.to(acc)
                out.copy_(merged)
                del merged
                lse = lse.to(lse_c.dtype)
            else:
                out.copy_(out_c)
                lse = lse_c
            del out_c
            ctx.kernel, ctx.scale, ctx.saved, ctx.width = kernel, scale, saved, width
            ctx.save_for_backward(q, k, v, out, lse, *extras)
        return out[..., :dv_width] if width != dv_width else out

    @staticmethod
    @once_differentiable
    def backward(ctx, g_out: torch.Tensor):
        q, k, v, out, lse, *extras = ctx.saved_tensors
        with torch.autocast(q.device.type, enabled=False):
            n = len(extras) // 2
            ek, ev = extras[:n], extras[n:]
            dq_width, dv_width, width = q.shape[-1], v.shape[-1], ctx.width
            g = _pad(g_out.to(out.dtype), width)
            dq, dk, dv = _backward(ctx.kernel, g, _pad(q, width), _pad(k, width), _pad(v, width),
                                   out, lse, ctx.scale, ctx.saved)
            dq, dk, dv = dq[..., :dq_width], dk[..., :dq_width], dv[..., :dv_width]
            dek, dev = [], []
            if n:
                acc = torch.promote_types(q.dtype, torch.float32)
                qw = q.to(acc)
                go = g_out.to(acc)
                row = (go * out[..., :dv_width].to(acc)).sum(-1)  # Σ P∘dP of the union
                dq = dq.to(acc)
                lse_w = lse.to(acc)
                for s_j, k_j, v_j in zip(_diagonal_scores(qw, ek, ctx.scale, acc), ek, ev,
                                         strict=True):
                    p_j = torch.exp(s_j - lse_w)
                    dev.append((p_j[..., None] * go).to(v_j.dtype))
                    ds_j = (p_j * ((go * v_j.to(acc)).sum(-1) - row) * ctx.scale)[..., None]
                    dq += ds_j * k_j.to(acc)
                    dek.append((ds_j * qw).to(k_j.dtype))
                dq = dq.to(q.dtype)
            need = ctx.needs_input_grad[1:]
            grads = [dq, dk, dv, *dek, *dev]
        return None, *(x if want else None for x, want in zip(grads, need, strict=True))


def _diagonal_scores(q: torch.Tensor, ek: Sequence[torch.Tensor], scale: float,
                     acc: torch.dtype) -> torch.Tensor:
    """[n, B, A, T]: each query against its own row of each extra key, in `acc`."""
    qw = q.to(acc)
    return torch.stack([(qw * k_j.to(acc)).sum(-1) for k_j in ek]).mul_(scale)


def _forward(kernel: str, q, k, v, scale: float):
    """(causal output, its log-sum-exp [B, A, T], what the kernel's backward needs)."""
    if kernel == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, True, scale=scale)
        return out, lse, ()
    out, lse, cum_q, cum_k, max_q, max_k, rng, unused, _ = (
        torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False,
                                                           scale=scale))
    return out, lse, (cum_q, cum_k, max_q, max_k, rng, unused)


def _backward(kernel: str, g, q, k, v, out, lse, scale: float, saved):
    if kernel == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            g, q, k, v, out, lse, 0.0, True, scale=scale)
    cum_q, cum_k, max_q, max_k, rng, unused = saved
    return torch.ops.aten._scaled_dot_product_flash_attention_backward(
        g, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, True, rng, unused, scale=scale)
