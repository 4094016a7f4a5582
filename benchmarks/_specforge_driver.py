"""Run SpecForge 0.2.0's offline EAGLE-3 trainer on a CPU, for ``benchmarks/vs_specforge.py``.

This file runs under SpecForge's own interpreter (the venv ``benchmarks/specforge_env.sh``
builds), never eyas's, and imports nothing from eyas::

    ~/.venvs/specforge/bin/python benchmarks/_specforge_driver.py --config run.yaml \\
        --stats stats.json [--loss-norm batch|valid] [--teacher-dtype bfloat16|float32]

What it changes in SpecForge, and nothing else:

- ``triton`` (GPU only, not installed) is replaced by a stand-in module so that
  ``specforge.core.loss`` imports; no Triton kernel ever runs.
- The Triton loss ``LogSoftmaxLoss`` is replaced by the plain-PyTorch reference loss defined
  in the same SpecForge module (``-Σ mask · p · log q`` averaged over batch × length, padding
  included). ``--loss-norm valid`` divides by the supervised positions instead (eyas's
  normalisation), for controlled comparisons.
- The stored states are cast to the dtypes of the modules that read them (SpecForge casts
  nothing; its GPU runs hold bf16 everywhere, our CPU runs a float32 drafter).
- ``--teacher-dtype float32`` keeps the target head (the teacher's logits) in float32;
  SpecForge casts it to bfloat16.
- Each ``TrainerCore.train_step`` is timed (and its real tokens counted) and SpecForge's own
  evaluations are kept; both go to ``--stats`` as JSON, written when training ends.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types


def import_loss_module_with_triton_stand_in():
    """Import ``specforge.core.loss`` with a stand-in ``triton`` module, then remove it.

    The stand-in's ``jit`` returns each kernel function unchanged (none is ever launched).
    It is visible only while that one module imports: torch and transformers probe for
    Triton and would take a stand-in for the real thing.
    """
    # torch.compile's machinery and transformers probe for Triton when first imported: load
    # them now, before the stand-in exists (wrapping a function loads all of inductor).
    import torch
    import transformers  # noqa: F401

    torch.compile(lambda x: x)

    triton = types.ModuleType("triton")
    language = types.ModuleType("triton.language")
    language.constexpr = int  # read by kernel annotations at import; kernel bodies never run
    triton.language = language
    triton.jit = lambda fn=None, **kw: fn if fn is not None else (lambda f: f)
    triton.next_power_of_2 = lambda n: 1 << max(0, int(n) - 1).bit_length()
    saved = {name: sys.modules.get(name) for name in ("triton", "triton.language")}
    sys.modules["triton"], sys.modules["triton.language"] = triton, language
    try:
        import specforge.core.loss as sf_loss
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return sf_loss


def patch_loss(loss_norm: str) -> None:
    import torch

    sf_loss = import_loss_module_with_triton_stand_in()
    import specforge.algorithms.eagle3.model as eagle3_model

    reference = sf_loss._compute_loss  # torch.compile'd there, as SpecForge ships it

    def valid_normalised(logits, target_p, position_mask):
        logp = torch.log_softmax(logits.float(), dim=2)
        total = -torch.sum(position_mask * target_p * logp)
        return total / position_mask.sum().clamp(min=1)

    class ReferenceLoss:
        """Stands where ``LogSoftmaxLoss`` (a Triton autograd Function) stood."""

        @staticmethod
        def apply(logits, target_p, position_mask):
            if loss_norm == "valid":
                return valid_normalised(logits, target_p, position_mask)
            return reference(logits, target_p, position_mask)

    sf_loss.LogSoftmaxLoss = ReferenceLoss
    eagle3_model.LogSoftmaxLoss = ReferenceLoss


def patch_teacher_dtype(dtype_name: str) -> None:
    if dtype_name == "bfloat16":
        return
    import torch
    from specforge.modeling.target import target_head

    original = target_head.TargetHead.from_pretrained.__func__

    def from_pretrained(cls, *args, **kwargs):
        return original(cls, *args, **kwargs).to(dtype=getattr(torch, dtype_name))

    target_head.TargetHead.from_pretrained = classmethod(from_pretrained)


def patch_feature_dtypes(aux_dtype: str, teacher_dtype: str) -> None:
    """Cast each sample's stored states (bf16 from extraction) to what SpecForge's modules hold:
    the aux states to the draft model's dtype, the final states to the target head's. SpecForge
    casts neither (on a GPU both are bf16), and a float32 drafter fails on bf16 inputs."""
    import specforge.algorithms.eagle3.data as eagle3_data
    import torch

    original = eagle3_data.normalize_offline_sample

    def normalize_offline_sample(raw, max_len):
        out = original(raw, max_len)
        out["hidden_state"] = out["hidden_state"].to(getattr(torch, aux_dtype))
        out["target"] = out["target"].to(getattr(torch, teacher_dtype))
        return out

    eagle3_data.normalize_offline_sample = normalize_offline_sample


def patch_timing(records: list) -> None:
    from specforge.training.controller import TrainerCore

    original = TrainerCore.train_step

    def train_step(self, batch, ctx=None):
        mask = batch.tensors.get("attention_mask")
        tokens = int(mask.sum()) if mask is not None else 0
        t0, c0 = time.perf_counter(), time.process_time()
        result = original(self, batch, ctx)
        records.append({"seconds": time.perf_counter() - t0,
                        "cpu_seconds": time.process_time() - c0, "tokens": tokens,
                        "samples": len(batch.sample_ids)})
        return result

    TrainerCore.train_step = train_step


def patch_eval_capture(evaluations: list) -> None:
    from specforge.training.controller import TrainerController

    original = TrainerController.evaluate_configured

    def evaluate_configured(self):
        metrics = original(self)
        evaluations.append({"step": self.global_step,
                            **{k: float(v) if isinstance(v, (int, float)) else v
                               for k, v in (metrics or {}).items()}})
        return metrics

    TrainerController.evaluate_configured = evaluate_configured


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="SpecForge run YAML")
    p.add_argument("--stats", required=True, help="where to write per-step timings (JSON)")
    p.add_argument("--loss-norm", choices=("batch", "valid"), default="batch")
    p.add_argument("--teacher-dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    import torch
    import yaml

    torch.set_num_threads(args.threads)
    patch_loss(args.loss_norm)
    patch_teacher_dtype(args.teacher_dtype)
    with open(args.config) as fh:
        model_dtype = yaml.safe_load(fh)["model"].get("torch_dtype", "bfloat16")
    patch_feature_dtypes(model_dtype, args.teacher_dtype)
    records: list = []
    evaluations: list = []
    patch_timing(records)
    patch_eval_capture(evaluations)
    from specforge.cli import main as specforge_main

    t0 = time.perf_counter()
    rc = specforge_main(["train", "--config", args.config])
    tmp = args.stats + ".tmp"
    with open(tmp, "w") as fh:
        json.dump({"steps": records, "eval": evaluations, "wall_s": time.perf_counter() - t0, "rc": rc,
                   "torch": torch.__version__, "threads": torch.get_num_threads(),
                   "loss_norm": args.loss_norm, "teacher_dtype": args.teacher_dtype}, fh)
    os.replace(tmp, args.stats)
    return int(rc or 0)


if __name__ == "__main__":
    raise SystemExit(main())
