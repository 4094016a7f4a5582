"""Check 7, overfit: the gate of `eyas.evaluate.overfit` on this machine. A drafter memorises
the target's greedy answers to ``preflight.overfit_samples`` prompts of the merged data; its
export is measured on the same prompts and must be accepted within
``preflight.overfit_tolerance`` of training's τ on them, and pass the static checks of
`eyas.train.export_check` against that run.

Where the recipe serves with SGLang (``evaluate.serving``, or an SGLang extraction) the answers
come from SGLang serving the target alone, the samples are captured with the recipe's
extraction backend, and the export is served by SGLang: the served accept length is what is
measured. Elsewhere (CPU, the tiny demo) the answers come from the HF target and eyas's offline
evaluator measures; SGLang's own loading is then not checked, and the check says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eyas.evaluate import overfit
from eyas.preflight.result import CheckFailed, CheckResult

NAME = "overfit"


def check_overfit(*, work: Path, model_dir: Path, merged: Path, extract_cfg, train_cfg,
                  draft_tokens: int, samples: int, steps: int, answer_tokens: int,
                  tolerance: float, serving=None, device: str = "cpu", timeout_s: float = 300,
                  trust_remote_code: bool = False,
                  gpu_env: Mapping[str, str] | None = None) -> CheckResult:
    """Run the gate in ``work/overfit``; `serving` (a `ServingConfig`) measures with SGLang."""
    gate_dir = Path(work) / "overfit"
    kw: dict[str, Any] = {}
    partial = ""
    if serving is not None:
        from eyas.preflight.serving import sglang_answers

        def answers(prompts):
            got, _, _ = sglang_answers(model_dir=model_dir, drafter=None, prompts=prompts,
                                       cfg=serving, max_new_tokens=answer_tokens,
                                       timeout_s=timeout_s, trust_remote_code=trust_remote_code,
                                       gpu_env=gpu_env)
            return got

        def measure(export, prompts):
            _, tau, rows = sglang_answers(model_dir=model_dir, drafter=export, prompts=prompts,
                                          cfg=serving, max_new_tokens=answer_tokens,
                                          timeout_s=timeout_s,
                                          trust_remote_code=trust_remote_code, gpu_env=gpu_env)
            if tau is None:
                raise ValueError("SGLang reported no accept length: it did not speculate")
            return tau, rows

        kw = dict(answers=answers, measure=measure, measured_by="SGLang's served")
    else:
        partial = ("no SGLang in this recipe: measured with eyas's offline evaluator, SGLang's "
                   "loading of the export not checked")
    result = overfit.run_gate(work=gate_dir, model_dir=model_dir, merged=merged,
                              extract_cfg=extract_cfg, train_cfg=train_cfg,
                              draft_tokens=draft_tokens, samples=samples, steps=steps,
                              answer_tokens=answer_tokens, tolerance=tolerance, device=device,
                              trust_remote_code=trust_remote_code, say=lambda _m: None, **kw)
    data = {"gate": result.to_json()}
    figure = (f"accept length {result.measured_tau:.2f} / τ {result.offline_tau:.2f}"
              if result.measured_tau is not None and result.offline_tau is not None else "")
    if not result.ok:
        raise CheckFailed(result.detail, figure=figure, data=data,
                          fix="run `eyas check-export` on the overfit export "
                              f"({result.export}) for the static checks; a low accept length "
                              "with every static check passing: the serving engine computes "
                              "the drafter otherwise than training (report it)")
    return CheckResult(NAME, True, result.detail, figure=figure, partial=partial, data=data)
