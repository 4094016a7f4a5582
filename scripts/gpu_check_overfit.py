"""GPU check of the overfit gate (`eyas.evaluate.overfit`, preflight's ``overfit`` check) with
SGLang 0.5.23 measuring: on the tiny target, a drafter (with ``fc_norm``) memorises the target's
greedy answers to two prompts; SGLang serves the clean export and three copies broken on purpose
(aux layers one later, fc_norm weights dropped, d2t off by one) on the same prompts. The gate
must pass on the clean one and fail on each broken one.

    PYTHON=/sglang-venv/bin/python bash scripts/gpu_check.sh overfit    # one GPU, sglang==0.5.23
    python scripts/gpu_check_overfit.py --dry-run                       # CPU: offline evaluator

The same code as preflight's check: the answers come from SGLang serving the target alone
(`eyas.preflight.serving.sglang_answers`), the training and export from eyas's trainer
(`eyas.evaluate.overfit.train_overfit`), the verdict from `eyas.evaluate.overfit.judge`. With
``--dry-run`` the HF target answers and eyas's offline evaluator measures (what the CPU tests
run). Not run in the session that wrote it (no GPU there). One JSON line; exit 1 on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BROKEN = ("aux-shift", "fc-norm-dropped", "d2t-off-by-one")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU: HF answers, offline evaluator")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per SGLang start")
    args = p.parse_args(argv)
    from eyas.evaluate import overfit
    from eyas.evaluate.serving_config import ServingConfig
    from eyas.extract.config import ExtractConfig
    from eyas.tiny import build_tiny_target
    from eyas.train.config import TrainConfig
    from eyas.train.tiny_data import tiny_records, write_jsonl

    t0 = time.perf_counter()
    device = "cpu" if args.dry_run else "cuda"
    tmp = tempfile.TemporaryDirectory(prefix="eyas-gpu-overfit-")
    work = args.workdir or Path(tmp.name)
    target = build_tiny_target()
    merged = write_jsonl(work / "train.jsonl", tiny_records(target, 4))
    kw: dict = {}
    if not args.dry_run:
        from eyas.preflight.serving import sglang_answers

        serving = ServingConfig(sglang_python=sys.executable, port=_port(), batch_sizes=[1],
                                num_prompts=1, num_steps=[3],
                                extra_server_args=["--disable-cuda-graph",
                                                   "--mem-fraction-static", "0.5"])

        def answers(prompts):
            return sglang_answers(model_dir=target, drafter=None, prompts=prompts, cfg=serving,
                                  max_new_tokens=overfit.ANSWER_TOKENS,
                                  timeout_s=args.timeout)[0]

        def measure(export, prompts):
            _, tau, rows = sglang_answers(model_dir=target, drafter=export, prompts=prompts,
                                          cfg=serving, max_new_tokens=overfit.ANSWER_TOKENS,
                                          timeout_s=args.timeout)
            if tau is None:
                raise ValueError("SGLang reported no accept length")
            return tau, rows

        kw = dict(answers=answers, measure=measure, measured_by="SGLang's served")
    clean = overfit.run_gate(work=work / "gate", model_dir=target, merged=merged,
                             extract_cfg=ExtractConfig(device=device),
                             train_cfg=TrainConfig(device=device, draft_vocab_size=4100,
                                                   fc_norm=True),
                             draft_tokens=3, samples=2, steps=args.steps, device=device,
                             say=lambda _m: None, **kw)
    out: dict = {"check": "overfit-gate", "device": device, "clean": clean.to_json()}
    prompts = overfit.gate_prompts(merged, 2)
    passed = clean.ok
    for how in BROKEN:
        broken = overfit.break_export(Path(clean.export), work / f"broken-{how}", how)
        r = overfit.judge(broken, work=work / "gate", model_dir=target, prompts=prompts,
                          draft_tokens=3, max_new_tokens=overfit.ANSWER_TOKENS,
                          offline=clean.offline_tau, device=device,
                          measure=kw.get("measure"),
                          measured_by=kw.get("measured_by", "offline evaluator's"))
        out[how] = {"ok": r.ok, "measured_tau": r.measured_tau, "measured_ok": r.measured_ok,
                    "static_failures": r.static_failures}
        passed = passed and not r.ok
    out.update(passed=passed, seconds=round(time.perf_counter() - t0, 1))
    print(json.dumps(out))
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
