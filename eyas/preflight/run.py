"""Preflight without an orchestrator: the seven checks in order on this machine (on a GPU host:
a detached job), each under its own time limit, the go/no-go report written to
``<workdir>/preflight/report.json`` and printed as the last line, as one JSON object::

    python -m eyas.preflight.run --config recipes/kimi-k2.5.yaml --workdir /data/runs/100k
    python -m eyas.preflight.run --config-json W/preflight/config.json --workdir W  # as a job

    {"ok": true, "checks": [{"name": "environment", "ok": true, "seconds": 1.2, "detail": ...,
     "figure": ..., "fix": ..., "partial": ...}, ...], "eta": {"extract_s": ..., "train_s": ...}}

Everything it makes lives in ``<workdir>/preflight/`` (a few samples' shard, a short-trained
drafter), never in the run's own folders. Exit code 0 on GO, 1 on NO-GO, 2 on a configuration
error (`EyasError`) before any check ran (``--no-go-exit 0``: a NO-GO exits 0 too, for an
orchestrator that reads the report).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eyas.errors import USER_ERROR_EXIT, EyasError
from eyas.io import read_json, write_json
from eyas.layout import RunLayout
from eyas.manifest import MANIFEST_NAME, write_manifest
from eyas.preflight import capture, collectives, disk, environment, overfit, serving, training
from eyas.preflight.result import CheckFailed, CheckResult, bounded, report, summary_lines

CHECKS = ("environment", "disk", "collectives", "capture", "training", "serving", "overfit")
"""The checks, in the order they run."""
REPORT_NAME = "report.json"


def preflight_dir(workdir: str | Path) -> Path:
    """Where preflight works and leaves its report: ``<workdir>/preflight``."""
    return Path(workdir) / "preflight"


def split_figures(workdir: Path) -> dict[str, dict[str, int]]:
    """``{split: {"records", "tokens"}}`` of the merged data: from ``merged/stats.json``, else
    counted in the JSONL files. Splits without data are left out."""
    layout = RunLayout(workdir)
    stats_file = layout.merged_dir / "stats.json"
    if stats_file.is_file():
        stats = read_json(stats_file)
        return {s: {"records": int(stats[s]["records"]), "tokens": int(stats[s]["tokens"])}
                for s in ("train", "eval") if s in stats}
    out = {}
    for split, path in (("train", layout.train), ("eval", layout.eval)):
        if path.is_file():
            records = tokens = 0
            with open(path, "rb") as fh:
                for line in fh:
                    if line.strip():
                        records += 1
                        tokens += len(json.loads(line)["input_ids"])
            out[split] = {"records": records, "tokens": tokens}
    return out


def _gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def run_preflight(cfg, workdir: str | Path, *, say: Callable[[str], None] = print,
                  gpus: int | None = None) -> dict[str, Any]:
    """Run every check of `CHECKS` for the pipeline config `cfg` (a `PipelineConfig`) and the
    run folder `workdir` (with merged data: ``eyas prepare``); return the report (`report`).
    A check that fails does not stop the others, except that training needs capture's samples
    and serving training's drafter (they then fail saying so)."""
    from eyas.devices import resolve_device
    from eyas.extract.target import target_shape
    from eyas.train.launch import resolve_processes

    pf = cfg.preflight
    workdir = Path(workdir).absolute()
    work = preflight_dir(workdir)
    work.mkdir(parents=True, exist_ok=True)
    (work / MANIFEST_NAME).unlink(missing_ok=True)  # a stale GO must not outlive a new run
    layout = RunLayout(workdir)
    gpus = _gpus() if gpus is None else gpus
    train_cuda = cfg.train.device != "cpu" and gpus > 0 and resolve_device(cfg.train.device).type == "cuda"
    processes = resolve_processes(cfg.train.processes, gpus if train_cuda else 0)
    serving_cfg = sglang_serving(cfg)
    sglang_python = serving_cfg.sglang_python if serving_cfg is not None else None
    needs_gpu = cfg.extract.backend == "sglang" or cfg.extract.device.startswith("cuda") or \
        cfg.train.device.startswith("cuda") or serving_cfg is not None
    figures = split_figures(workdir)
    train_fig = figures.get("train", {"records": 0, "tokens": 0})
    all_tokens = sum(f["tokens"] for f in figures.values())
    all_records = sum(f["records"] for f in figures.values())
    model_dir: Path | None = None
    results: dict[str, CheckResult] = {}

    def model() -> Path:
        capture.check_target(model_dir)
        return model_dir

    from eyas.prepare.phases import target_dir

    try:
        model_dir = target_dir(cfg)
    except EyasError:
        model_dir = cfg.resolve_path(cfg.target.model)  # capture names what is missing

    def hidden_size() -> int:
        return target_shape(model()).hidden_size

    def architecture() -> str | None:
        return target_shape(model()).architecture

    steps: dict[str, Callable[[], CheckResult]] = {
        "environment": lambda: environment.check_environment(
            needs_gpu=needs_gpu, gpus_wanted=max(processes if train_cuda else 0,
                                                 cfg.extract.tp_size if needs_gpu else 0),
            sglang_python=sglang_python),
        "disk": lambda: _disk(cfg, layout, work, all_records, all_tokens, hidden_size()),
        "collectives": lambda: collectives.check_collectives(
            gpus=gpus, gpu_env=cfg.gpu_env, timeout_s=pf.collective_timeout_s),
        "capture": lambda: capture.check_capture(
            merged=layout.train, work=work, model_dir=model(), cfg=cfg.extract,
            samples=pf.samples, total_tokens=all_tokens,
            trust_remote_code=cfg.target.trust_remote_code, architecture=architecture()),
        "training": lambda: training.check_training(
            work=work, model_dir=model(), cfg=cfg.train, steps=pf.train_steps,
            processes=processes, aux_layers=cfg.extract.aux_layers,
            timeout_s=pf.check_timeout_s - 5, records=max(1, train_fig["records"]),
            tokens=train_fig["tokens"], gpu_env=cfg.gpu_env,
            trust_remote_code=cfg.target.trust_remote_code),
        "serving": lambda: serving.check_serving(
            model_dir=model(), drafter=_export(results), merged=layout.train,
            serving=serving_cfg, device=cfg.evaluate.device, draft_tokens=cfg.evaluate.draft_tokens,
            max_new_tokens=pf.max_new_tokens, timeout_s=pf.check_timeout_s - 35,
            trust_remote_code=cfg.target.trust_remote_code, gpu_env=cfg.gpu_env),
        "overfit": lambda: overfit.check_overfit(
            work=work, model_dir=model(), merged=layout.train, extract_cfg=cfg.extract,
            train_cfg=cfg.train, draft_tokens=cfg.evaluate.draft_tokens,
            samples=pf.overfit_samples, steps=pf.overfit_steps,
            answer_tokens=pf.overfit_answer_tokens, tolerance=pf.overfit_tolerance,
            serving=serving_cfg, device=cfg.evaluate.device, timeout_s=pf.check_timeout_s - 35,
            trust_remote_code=cfg.target.trust_remote_code, gpu_env=cfg.gpu_env),
    }
    for name in CHECKS:
        if name in ("capture", "overfit") and not figures:
            results[name] = CheckResult(name, False, f"no merged data in {layout.merged_dir}",
                                        fix="run `eyas prepare` for this workdir first")
        else:
            limit = pf.overfit_timeout_s if name == "overfit" else pf.check_timeout_s
            results[name] = bounded(name, steps[name], limit)
            results[name].name = name
        r = results[name]
        say(f"preflight {name}: {'GO' if r.ok else 'NO-GO'} ({r.seconds:.1f}s) {r.figure} - "
            f"{r.detail}" + (f" | fix: {r.fix}" if not r.ok and r.fix else ""))
    train_tok_s = results["training"].data.get("tok_s") if results["training"].ok else None
    disk.relate_bandwidth(results["disk"], train_tok_s)
    eta = {"extract_s": _round(results["capture"].data.get("extract_s")),
           "train_s": _round(results["training"].data.get("train_s"))}
    rep = report([results[n] for n in CHECKS], eta)
    write_json(work / REPORT_NAME, rep)
    if rep["ok"]:
        write_manifest(work, phase="preflight", outputs=[REPORT_NAME],
                       counts={"checks": len(CHECKS)})
    return rep


def sglang_serving(cfg):
    """How the serving check starts SGLang: ``evaluate.serving``; else, for a recipe that
    extracts with SGLang, SGLang from the interpreter running preflight (the host's eyas venv,
    where ``eyas[sglang]`` installs it) over the engine's ``tp_size`` GPUs; None when the
    recipe uses no SGLang (eyas's own speculative decoding then serves)."""
    if cfg.evaluate.serving is not None:
        return cfg.evaluate.serving
    if cfg.extract.backend == "sglang":
        from eyas.evaluate.serving_config import ServingConfig

        return ServingConfig(sglang_python=sys.executable, tp_size=cfg.extract.tp_size,
                             batch_sizes=[1], num_prompts=1)
    return None


def _round(x: float | None) -> float | None:
    return None if x is None else round(float(x), 1)


def _export(results: dict[str, CheckResult]) -> Path | None:
    t = results.get("training")
    return Path(t.data["export"]) if t is not None and t.ok else None


def _disk(cfg, layout: RunLayout, work: Path, records: int, tokens: int,
          hidden: int) -> CheckResult:
    if records == 0:
        raise CheckFailed(f"no merged data in {layout.merged_dir}: no extraction plan to hold "
                          "the free space against", fix="run `eyas prepare` first")
    hidden_root = layout.hidden_dir("train").parent
    # hidden/ itself when it exists (it may be a mount of its own); else preflight's folder,
    # beside it on the run's volume: preflight creates nothing in the run's own folders.
    return disk.check_disk(data_dir=hidden_root if hidden_root.is_dir() else work,
                           cfg=cfg.extract,
                           records=records, tokens=tokens, hidden_size=hidden,
                           probe_bytes=cfg.preflight.disk_probe_mb << 20,
                           reserve_bytes=cfg.preflight.reserve_bytes)


def command(python: str, *, config_json: str, workdir: str) -> str:
    """The shell command of the detached preflight job on a host."""
    import shlex

    return shlex.join([python, "-m", "eyas.preflight.run", "--config-json", config_json,
                       "--workdir", workdir, "--no-go-exit", "0"])


def main(argv: list[str] | None = None) -> int:
    from eyas.config import PipelineConfig, load_config

    p = argparse.ArgumentParser(prog="python -m eyas.preflight.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", type=Path, help="pipeline YAML (a recipe)")
    src.add_argument("--config-json", type=Path,
                     help="the resolved PipelineConfig as JSON (what an orchestrator sends)")
    p.add_argument("--workdir", type=Path, required=True, help="the run folder (merged data)")
    p.add_argument("--no-go-exit", type=int, default=1,
                   help="exit code of a NO-GO (an orchestrator that reads the report passes 0)")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        cfg = (load_config(args.config) if args.config is not None
               else PipelineConfig.model_validate_json(args.config_json.read_text()))
        rep = run_preflight(cfg, args.workdir, say=lambda line: print(line, flush=True))
    except EyasError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return USER_ERROR_EXIT
    for line in summary_lines(rep):
        print(line, flush=True)
    print(json.dumps(rep), flush=True)
    return 0 if rep["ok"] else args.no_go_exit


if __name__ == "__main__":
    from eyas.stopping import run_main

    sys.exit(run_main(main, "preflight"))
