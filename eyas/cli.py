"""The `eyas` command.

    eyas pipeline --config recipes/tiny-demo.yaml --workdir runs/tiny-demo  # the whole job, 1-6
                  [--phases merge extract ...] [--online] [--host-block NAME]
                  [--clean PATH ... [--yes]] [--no-preflight]
    eyas prepare --config recipes/tiny-demo.yaml --workdir runs/tiny-demo   # phases 1-3
    eyas preflight --config FILE --workdir DIR [--host-block NAME] [--json]   # GO / NO-GO in minutes
    eyas extract --config FILE --workdir DIR [--split train] [--only-failed]  # phase 4 (shards)
                 [--shards 0 3] [--host-block NAME [NAME ...] [--shared-storage]]
    eyas extract --config FILE --plan [--records N --tokens T --hidden-size H] # disk estimate only
    eyas train --config FILE --workdir DIR [--online] [--host-block NAME]     # phase 5 (drafter)
    eyas evaluate --config FILE --workdir DIR [--host-block NAME]             # phase 6 (τ, report)
    eyas tiny-target                                                          # build/cache the demo target
    eyas check-config --config FILE                                           # validate a YAML
    eyas secret set NAME                                                      # API key → Prefect Secret
    eyas status --workdir DIR [--config FILE] [--host user@addr] [--json]     # probe a run
    eyas clean PATH... [--host user@addr] [--yes]                             # safe deletion

Commands that orchestrate (pipeline, prepare, extract, train, evaluate, secret) need the
`orchestrate` extra (Prefect); the rest run on a bare GPU host with only the core installed.
The config is loaded and validated once, here, and the flows receive the typed object.

Stopping: SIGTERM (``timeout``, systemd, a container runtime, a scheduler) and Ctrl-C stop a
command cleanly (`eyas.stopping`) at its next small unit: an answer in flight (abandoned), a
forward batch (the shard under way abandoned, not written), a training step (its checkpoint
written); remote jobs it follows are cancelled, its children and its temporary Prefect server
are stopped; it prints one line saying what it kept (`KEPT_ON_STOP`) and exits with 128 + the
signal (143, 130) within a bounded time. The same command run again resumes
(docs/stopping.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from pathlib import Path

from eyas import stopping
from eyas.errors import ConfigError, EyasError
from eyas.layout import SPLITS, RunLayout

EXIT_WITHIN_S = stopping.EXIT_WITHIN_S
"""Once stopped, the seconds the process may take to wind down (Prefect reporting the run's
state, threads ending) before it exits regardless (the entry points' bound too)."""
KEPT_ON_STOP = {
    "pipeline": "every finished phase, the answers received, complete shards and training's "
                "checkpoint are kept; the unit under way is redone",
    "prepare": "the answers received and every finished dataset are kept; the answers in "
               "flight are asked again",
    "extract": "complete shards are kept; the shard under way was abandoned, not written, and "
               "is extracted again",
    "train": "the checkpoint written at the step under way is kept",
    "evaluate": "the evaluation under way is not kept; it runs again",
    "preflight": "a check keeps nothing",
}
"""What a stopped command keeps (docs/stopping.md), in its last line."""
STOP_DEADLINE_S = 420.0
"""The backstop: seconds from SIGTERM / Ctrl-C to the exit, whatever still runs. Longer than a
training's stop (`eyas.train.launch.STOP_GRACE_S`, 300 s: a step and a checkpoint)."""


def offline_defaults() -> None:
    """Environment every eyas entry point (and the test suite) runs with; set only when unset."""
    # eyas never fetches weights or data from a hub at run time, and never phones home.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Prefect's temporary server can take long to start on a loaded 2-core machine.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


CONTROL_INSTALL_HINT = (
    "install eyas with its control-plane extra from an eyas checkout (eyas is not on a package "
    "index): `pip install -e '.[orchestrate]'` there (scripts/setup.sh does it); on a GPU host, "
    "ship it from the control machine: `ship(host, extras=['orchestrate'], "
    "venv='/data/.eyas/control')` (eyas.remote.ship, docs/remote.md)"
)


def _need_prefect(command: str) -> None:
    try:
        import prefect  # noqa: F401
    except ImportError:
        raise EyasError(f"`eyas {command}` runs a Prefect flow; {CONTROL_INSTALL_HINT}") from None
    from tasks.temporary_server import start_tied

    start_tied()  # without PREFECT_API_URL: a temporary server that dies with this command


def cmd_pipeline(args: argparse.Namespace) -> int:
    from eyas.config import load_config

    cfg = load_config(args.config)  # fail fast, before Prefect starts
    _need_prefect("pipeline")
    from flows.pipeline import run_pipeline

    result = run_pipeline(config=cfg, workdir=str(args.workdir), host_block=args.host_block,
                          phases=args.phases, data="online" if args.online else "offline",
                          clean_paths=args.clean, confirm_clean=args.yes,
                          data_root=args.data_root, preflight=not args.no_preflight)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return 0
    for split, summary in (result.get("extract") or {}).items():
        print(f"extract {split}: {summary['extracted']} extracted, {summary['skipped']} "
              f"complete already, {summary['actual_bytes']:,} bytes")
    train = result.get("train")
    if train:
        print(f"training: {train['status']} at step {train['steps']}; exported drafter: "
              f"{train['export']}")
    if result.get("evaluate"):
        print(evaluation_lines(result["evaluate"]))
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    from eyas.config import load_config

    cfg = load_config(args.config)  # fail fast, before Prefect starts
    _need_prefect("prepare")
    from flows.prepare import prepare_data

    stats = prepare_data(config=cfg, workdir=str(args.workdir), phases=args.phases)
    print(json.dumps(stats, indent=2, default=str) if args.json else _summary(stats, Path(args.workdir)))
    return 0


def cmd_preflight(args: argparse.Namespace) -> int:
    """``eyas preflight``: the checks as a Prefect flow (here or on a host); the table, then
    the report as one JSON line last. Exit 0 on GO, 1 on NO-GO."""
    from eyas.config import load_config
    from eyas.preflight.result import PreflightFailed, summary_lines

    cfg = load_config(args.config)  # fail fast, before Prefect starts
    _need_prefect("preflight")
    from flows.preflight import preflight_flow

    try:
        rep = preflight_flow(config=cfg, workdir=str(args.workdir), host_block=args.host_block)
    except PreflightFailed as exc:
        if exc.report is None:
            raise
        rep = exc.report
    if not args.json:
        print("\n".join(summary_lines(rep)))
    print(json.dumps(rep))
    return 0 if rep["ok"] else 1


def _summary(stats: dict, workdir: Path) -> str:
    from eyas.prepare.report import merge_totals, outlier_lines

    if "records" not in stats:
        return json.dumps(stats, indent=2, default=str)
    lines = [f"{k:<32} {v:,}" if isinstance(v, int) else f"{k:<32} {v}"
             for k, v in merge_totals(stats) if v is not None]
    lines += outlier_lines(stats)
    run = RunLayout(workdir)
    lines.append(f"outputs: {run.merged_dir}  picture: {run.composition_picture}")
    return "\n".join(lines)


def _plan_figures(args: argparse.Namespace, cfg) -> tuple[int, int, int]:
    """(records, tokens, hidden size) for ``eyas extract --plan``: the figures given, else the
    workdir's merged splits; the hidden size given, else the target's config.json."""
    from eyas.extract.shards import plan_shards
    from eyas.extract.target import target_shape

    records, tokens = args.records, args.tokens
    if records is None or tokens is None:
        if args.workdir is None:
            raise ConfigError("--plan needs --records and --tokens, or --workdir with merged data",
                              where="eyas extract --plan")
        layout = RunLayout(Path(args.workdir))
        files = [layout.train if s == "train" else layout.eval for s in args.split or SPLITS]
        missing = [str(f) for f in files if not f.exists()]
        if missing:
            raise ConfigError(f"no merged data at {', '.join(missing)} (run `eyas prepare`, or "
                              f"pass --records and --tokens)", where="eyas extract --plan")
        specs = [s for f in files for s in plan_shards(f, cfg.extract)]
        records, tokens = sum(s.num_samples for s in specs), sum(s.num_tokens for s in specs)
    hidden = args.hidden_size
    if hidden is None:
        from eyas.prepare.phases import BUILTIN_TARGETS, resolve_target

        # eyas:tiny / eyas:kimi-replica name targets eyas builds (cached), never a path.
        model = (resolve_target(cfg) if cfg.target.model in BUILTIN_TARGETS
                 else cfg.resolve_path(cfg.target.model))
        if not (model / "config.json").exists():
            raise ConfigError(f"the target's config.json is not readable here ({model}); pass "
                              f"--hidden-size (7168 for Kimi-K2.5)", where="target.model")
        hidden = target_shape(model).hidden_size
    return records, tokens, hidden


def cmd_extract_plan(args: argparse.Namespace) -> int:
    """``eyas extract --plan``: the disk estimate of the configured storage, nothing run."""
    from eyas.config import load_config
    from eyas.extract.run import disk_estimate

    cfg = load_config(args.config)
    records, tokens, hidden = _plan_figures(args, cfg)
    est = disk_estimate(cfg.extract, records=records, tokens=tokens, hidden_size=hidden)
    if args.json:
        print(json.dumps(est, indent=2))
        return 0

    def size(n: int) -> str:
        return f"{n / 1e12:,.2f} TB ({n:,} bytes)"

    x = cfg.extract
    print(f"{args.config}: {records:,} records, {tokens:,} tokens, hidden size {hidden}, "
          f"{est['shards']:,} shards of {x.shard_size}")
    kind = "float8 aux" if x.storage == "compact" else x.dtype
    kind += f", K={x.topk}" if x.storage in ("topk", "compact") else ""
    print(f"storage {x.storage!r} ({kind}): {est['bytes_per_token']:,} bytes/token "
          f"-> {size(est['estimated_bytes'])}")
    print(f"free space required (+{x.disk_margin:.0%} margin): {size(est['required_bytes'])}")
    others = ", ".join(f"{s} {v / 1e12:,.2f} TB" for s, v in est["by_storage"].items())
    print(f"all storages: {others}; SpecForge (8·H) {est['specforge_bytes'] / 1e12:,.2f} TB")
    return 0


def cmd_extract(args: argparse.Namespace) -> int:
    from eyas.config import load_config

    if args.plan:
        return cmd_extract_plan(args)
    if args.workdir is None:
        raise ConfigError("--workdir is required (except with --plan)", where="eyas extract")
    cfg = load_config(args.config)  # fail fast, before Prefect starts
    _need_prefect("extract")
    from flows.extract import extract_hidden_states

    blocks = args.host_block or []
    summaries = extract_hidden_states(
        config=cfg, workdir=str(args.workdir),
        host_block=blocks[0] if blocks else None, host_blocks=blocks[1:] or None,
        splits=args.split, only_failed=args.only_failed, shards=args.shards,
        shared_storage=args.shared_storage,
    )
    if args.json:
        print(json.dumps(summaries, indent=2, default=str))
        return 0
    for split, summary in summaries.items():
        for r in summary["shards"]:
            print(f"{split:<5} {r['shard']}  {r['status']:<9} {r['samples']:>7,} samples "
                  f"{r['tokens']:>11,} tokens {r['bytes']:>15,} bytes")
        print(f"{split}: {summary['extracted']} extracted, {summary['skipped']} complete "
              f"already ({summary['left_out_complete']} of them not submitted); "
              f"{summary['actual_bytes']:,} bytes written vs {summary['estimated_bytes']:,} "
              f"estimated -> {summary['out']} ({summary['host']})")
        if len(summary.get("hosts", [])) > 1:
            counts = {h: list(summary["placement"].values()).count(h) for h in summary["hosts"]}
            print(f"{split}: shards done by " + ", ".join(f"{h} {n}" for h, n in counts.items()))
    return 0


def cmd_train_plan(args: argparse.Namespace) -> int:
    """``eyas train --plan``: steps, epochs, tokens and ETA of the configured training; runs
    nothing. It counts the train split's records (``--records`` / ``--tokens`` are the merged
    totals, both splits; ``--workdir``: the merge's own count) and the processes training will
    start (`eyas.train.plan.plan_processes`), saying where each figure comes from. Last line:
    the plan as JSON."""
    from eyas.config import load_config
    from eyas.io import read_json
    from eyas.manifest import read_manifest
    from eyas.train.plan import measured_tok_s, plan_processes, train_split, training_plan

    cfg = load_config(args.config)
    if args.records is not None and args.tokens is not None:
        merged = (args.records, args.tokens)
        records, tokens = train_split(args.records, args.tokens, cfg.merge.eval_fraction)
        split = (f"{args.records:,} merged records, {args.tokens:,} tokens -> about "
                 f"{records:,} train records, {tokens:,} tokens (merge.eval_fraction "
                 f"{cfg.merge.eval_fraction:g} held out for evaluation)")
    else:
        if args.workdir is None:
            raise ConfigError("--plan needs --records and --tokens, or --workdir with merged data",
                              where="eyas train --plan")
        layout = RunLayout(Path(args.workdir))
        manifest = read_manifest(layout.merged_dir)
        if manifest is None or not manifest.get("complete"):
            raise ConfigError(f"no merged data at {layout.merged_dir} (run `eyas prepare`, or pass "
                              "--records and --tokens)", where="eyas train --plan")
        stats = read_json(layout.merged_dir / "stats.json")
        records, tokens = manifest["counts"]["train_records"], stats["train"]["tokens"]
        merged = (records + int(manifest["counts"].get("eval_records", 0)), None)
        split = f"{records:,} train records, {tokens:,} tokens ({layout.merged_dir})"
    host_gpus = _host_gpus(args.host_block) if args.host_block else None
    n, source = plan_processes(cfg.train, stated=args.processes, host_gpus=host_gpus,
                               host=args.host_block, local_gpus=_local_gpus(cfg))
    tok_s, speed = args.tok_s, "stated (--tok-s)"
    if tok_s is None and args.workdir is not None:
        tok_s = measured_tok_s(RunLayout(Path(args.workdir)).history)
        speed = "measured (drafter/history.json)"
    plan = training_plan(cfg.train, records=records, tokens=tokens, processes=n, tok_s=tok_s)
    t = cfg.train
    print(f"{args.config}: {split}")
    print(f"{n} process{'es' if n != 1 else ''} ({source}) x grad_accum {t.grad_accum} x "
          f"micro_batch {t.micro_batch} = {plan['samples_per_step']} samples per step")
    print(f"{plan['steps']:,} steps = {plan['epochs']:g} epochs, about {plan['tokens']:,} tokens "
          f"({plan['tokens'] / max(1, plan['steps']):,.0f} a step); warmup "
          f"{plan['warmup_steps']:,} steps")
    count = "?" if plan["checkpoints"] is None else f"{plan['checkpoints']:,}"
    print(f"evaluations: {plan['evaluations']:,} (every {t.eval_every} steps); checkpoints: "
          f"{count} ({plan['checkpoint_basis']})")
    if host_gpus is not None and cfg.train.device != "cpu" and n > host_gpus:
        print(f"warning: {n} processes need {n} GPUs; host block {args.host_block} has "
              f"{host_gpus}: training there would refuse to start (train.processes)")
    if plan["eta_s"] is None:
        print("ETA: unknown (pass --tok-s, the training tokens/s of all GPUs together, or run "
              "preflight / a short training first)")
    else:
        print(f"ETA: {plan['eta_s'] / 3600:,.1f} h of training steps at {tok_s:,.0f} tokens/s, "
              f"{speed} (evaluations and checkpoints not included)")
    print(json.dumps({**plan, "processes": n, "processes_from": source,
                      "train_records": records, "merged_records": merged[0]}))
    return 0


def _host_gpus(name: str) -> int:
    """``num_gpus`` of the saved GpuHost block `name` (loading it needs Prefect)."""
    _need_prefect("train --plan --host-block")
    from tasks.hosts import host_spec

    return host_spec(name).num_gpus


def _local_gpus(cfg) -> int:
    """GPUs training here would use (none when ``train.device`` is the CPU)."""
    if cfg.train.device == "cpu":
        return 0
    import torch

    return torch.cuda.device_count()


def cmd_train(args: argparse.Namespace) -> int:
    from eyas.config import load_config

    if args.plan:
        return cmd_train_plan(args)
    if args.workdir is None:
        raise ConfigError("--workdir is required (except with --plan)", where="eyas train")
    cfg = load_config(args.config)  # fail fast, before Prefect starts
    _need_prefect("train")
    from flows.train import train_drafter_flow

    summary = train_drafter_flow(config=cfg, workdir=str(args.workdir),
                                 host_block=args.host_block,
                                 data="online" if args.online else "offline")
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
        return 0
    best = summary.get("best")
    if best:
        acc = " ".join(f"{a:.3f}" for a in best["acc"])
        print(f"best evaluation at step {best['step']}: loss {best['loss']:.4f}, acc_i [{acc}]")
        print(f"simulated acceptance length {best['simulated_acceptance_length']:.3f} "
              "(τ: tokens per verification, bonus token counted)")
    else:
        print("no evaluation (no eval data): the last weights were exported")
    n = summary.get("processes", 1)
    print(f"training: {summary['status']} at step {summary['steps']} ({summary['host']}, "
          f"{n} process{'es' if n != 1 else ''}); picture: {summary['picture']}")
    print(f"exported drafter: {summary['export']}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from eyas.config import load_config

    cfg = load_config(args.config)  # fail fast, before Prefect starts
    _need_prefect("evaluate")
    from flows.evaluate import evaluate_drafter_flow

    result = evaluate_drafter_flow(config=cfg, workdir=str(args.workdir),
                                   host_block=args.host_block)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return 0
    print(evaluation_lines(result))
    return 0


def evaluation_lines(result: dict) -> str:
    """What `eyas evaluate` prints: τ (95 % interval), the baselines, tokens/s, the speedups
    (this device's; serving's only from costs measured on the serving engine)."""
    def f(x, digits=3):
        return "n/a" if x is None else f"{x:.{digits}f}"

    check = ([f"accept length: SGLang {f(result['served_accept_length'])} -- FLAGGED: "
              f"{result['accept_check_note']}"] if result.get("accept_check_flagged")
             else [f"accept length: SGLang {f(result['served_accept_length'])}, training's "
                   f"simulated {f(result['simulated_acceptance_length'])}"]
             if result.get("served_accept_length") is not None else [])
    if result.get("offline", "ran") != "ran":  # the serving benchmark alone
        return "\n".join([f"offline evaluation: {result['offline']}",
                          f"serving: {result.get('serving_verdict') or 'not run'}", *check,
                          f"report: {result['html']} ({result['host']})"])
    def ci(pair):
        return f" [95 % {pair[0]:.3f}–{pair[1]:.3f}]" if pair and None not in pair else ""

    base = ", ".join(f"{name} {f(tau)}" for name, tau in result["baselines"].items())
    tps = result["tokens_per_s"]
    here = result.get("speedup_this_device") or {}
    near = result.get("lossless_near_ties") or 0
    settled = result.get("lossless_float32_rounding") or 0
    but = " and ".join([*([f"{near} near-tie divergence(s)"] if near else []),
                        *([f"{settled} within rounding in float32"] if settled else [])])
    serving = (f"serving speedup predicted {f(result['predicted_speedup'], 2)}x (costs measured "
               "on the serving engine)" if result.get("predicted_speedup") is not None else
               f"serving speedup {result.get('predicted_speedup_note') or 'not predicted'}")
    lines = [
        f"acceptance length τ {f(result['acceptance_length'])}"
        f"{ci(result.get('acceptance_length_ci95'))} ({result['mode']}, "
        f"{result['draft_tokens']} draft tokens, {result['prompts']} held-out prompts; "
        "the bonus token counted)",
        f"baselines: {base}",
        f"tokens/s: target alone {f(tps.get('target'), 1)}, with the drafter "
        f"{f(tps.get('eagle3'), 1)}",
        f"speedup on this device ({here.get('device') or 'unknown'}): predicted from its "
        f"costs {f(here.get('predicted'), 2)}x, measured {f(here.get('measured'), 2)}x; "
        + serving,
        f"training's simulated τ {f(result['simulated_acceptance_length'])}"
        + (" -- FLAGGED: far from the measured τ" if result.get("flagged") else ""),
        "lossless: " + ("not checked (sampling)" if result["lossless"] is None
                        else "OUTPUT DIFFERS from the target's own greedy output"
                        if not result["lossless"]
                        else "output equal to the target's own greedy output"
                        + (f" but for {but}" if but else "")),
        f"report: {result['html']} ({result['host']})",
    ]
    if result.get("serving_verdict"):
        lines.insert(5, f"serving: {result['serving_verdict']}")
        lines[6:6] = check
    return "\n".join(lines)


def cmd_tiny_target(args: argparse.Namespace) -> int:
    from eyas.tiny import build_tiny_target

    print(build_tiny_target(force=args.force))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """``eyas status``: print the report (`eyas.remote.probe.status`); exit 0, or 3 when the
    next phase would not fit. With ``--config`` the recipe says which datasets and shards to
    expect and how extraction sizes them."""
    from eyas.config import load_config
    from eyas.disk import DTYPE_ALIASES
    from eyas.remote.host_check import needs_for
    from eyas.remote.hosts import connect
    from eyas.remote.probe import (
        hidden_size_from_config,
        shard_expectation,
        spec_from_args,
        status,
    )

    expected, generated, shards, hidden = None, None, None, args.hidden_size
    storage, topk, dtype = args.storage, args.topk, args.dtype
    extras = ["sglang"] if args.sglang else []
    if args.config:
        cfg = load_config(args.config)
        expected = [d.name for d in cfg.datasets]
        generated = [d.name for d in cfg.datasets if d.regenerate]
        hidden = hidden or hidden_size_from_config(cfg)
        if cfg.extract.backend == "sglang":
            extras = ["sglang"]
        storage = storage or cfg.extract.storage
        topk = topk or cfg.extract.topk
        dtype = dtype or cfg.extract.dtype
        # The shards are judged by the settings the report sizes extraction with.
        x = cfg.extract.model_copy(update={"storage": storage, "topk": topk,
                                           "dtype": DTYPE_ALIASES.get(dtype, dtype)})
        shards = shard_expectation(cfg.model_copy(update={"extract": x}), args.target)
    with connect(spec_from_args(args)) as host:
        report = status(host, args.workdir, expected=expected, hidden_size=hidden,
                        captured=args.captured, dtype=dtype or "bfloat16", margin=args.margin,
                        reserve_bytes=int(args.reserve_gb * 1e9), check_hashes=args.verify_hashes,
                        storage=storage, topk=topk or 32, generated=generated, shards=shards,
                        host_needs=needs_for(extras))
    print(json.dumps(report.to_dict(), indent=2, sort_keys=True) if args.json else report.text())
    return 3 if report.fits is False else 0


def cmd_check_config(args: argparse.Namespace) -> int:
    from eyas.config import load_config

    cfg = load_config(args.config)
    print(f"{args.config}: OK ({len(cfg.datasets)} datasets; merged: {', '.join(cfg.merged_datasets())})")
    return 0


def cmd_check_export(args: argparse.Namespace) -> int:
    from eyas.config import load_config
    from eyas.train.export_check import check_run, failures

    checks = check_run(load_config(args.config), args.workdir, args.drafter)
    for c in checks:
        print(c.line())
    failed = failures(checks)
    if failed:
        print(f"check-export: {len(failed)} of {len(checks)} checks failed: "
              f"{', '.join(c.name for c in failed)}", file=sys.stderr)
        return 1
    print(f"check-export: all {len(checks)} checks passed")
    return 0


def cmd_secret(args: argparse.Namespace) -> int:
    _need_prefect("secret")
    import getpass

    from prefect.blocks.system import Secret

    value = sys.stdin.readline().rstrip("\n") if not sys.stdin.isatty() else getpass.getpass("API key: ")
    if not value:
        raise EyasError("empty key; nothing saved")
    Secret(value=value).save(args.name, overwrite=True)
    print(f"saved Prefect Secret block {args.name!r}; set generation.api_key_block: {args.name}")
    return 0


def _flow_command(sub, name: str, func, *, section: str, help: str, flow: str,
                  on_host: str, workdir_required: bool = True,
                  many_hosts: bool = False) -> argparse.ArgumentParser:
    """A subcommand running a GPU phase's flow, here or on a host: --config, --workdir,
    --host-block (one, or with `many_hosts` several), --json."""
    p = sub.add_parser(name, help=help)
    p.add_argument("--config", required=True, type=Path, help=f"pipeline YAML (its {section} section)")
    p.add_argument("--workdir", required=workdir_required, type=Path, default=None,
                   help=f"run folder (on the host with --host-block): {flow}")
    if many_hosts:
        p.add_argument("--host-block", nargs="+", default=None, metavar="NAME",
                       help=f"saved GpuHost block(s) to {on_host}; with several, the first is "
                            "where the run lives (input, every shard, training) and a relative "
                            "--workdir is taken under each host's data_root")
    else:
        p.add_argument("--host-block", default=None, help=f"saved GpuHost block to {on_host}")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=func)
    return p


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (a count: records, tokens, a hidden size)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a count: expected 1 or more")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eyas", description="Train EAGLE-3 drafters for your own LLM.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = _flow_command(sub, "pipeline", cmd_pipeline, section="every",
                      help="the whole job: phases 1-6 as one Prefect flow (cached reruns)",
                      flow="generated/ ... evaluate/", on_host="run phases 2-6 on")
    p.add_argument("--phases", nargs="+", default=None,
                   choices=["generate", "tokenize", "merge", "extract", "train", "evaluate"],
                   help="run only these phases (default: all; the others must be done)")
    p.add_argument("--online", action="store_true",
                   help="train on merged/*.jsonl with the target in process (no extraction)")
    p.add_argument("--clean", nargs="+", default=None, metavar="PATH",
                   help="obsolete outputs to delete meanwhile (under the host's data root)")
    p.add_argument("--yes", action="store_true", help="really delete --clean paths (else a dry run)")
    p.add_argument("--data-root", default=None, help="the only folder deletion may touch")
    p.add_argument("--no-preflight", action="store_true",
                   help="on a GPU host, skip the preflight stage (preflight.enabled: false in "
                        "the recipe skips it always)")

    p = sub.add_parser("prepare", help="phases 1-3: generate, tokenize, merge/shuffle (Prefect flow)")
    p.add_argument("--config", required=True, type=Path, help="pipeline YAML (see recipes/)")
    p.add_argument("--workdir", required=True, type=Path, help="run folder for all outputs")
    p.add_argument("--phases", nargs="+", choices=["generate", "tokenize", "merge"], default=None,
                   help="run only these phases (default: all)")
    p.add_argument("--json", action="store_true", help="print the merge statistics as JSON")
    p.set_defaults(func=cmd_prepare)

    p = _flow_command(sub, "preflight", cmd_preflight, section="preflight",
                      help="prove the GPU host ready in minutes: environment, disk, collectives, "
                           "capture, training, serving; GO / NO-GO table (Prefect flow)",
                      flow="merged/ -> preflight/ (a few samples, a short-trained drafter)",
                      on_host="run the checks on")

    p = _flow_command(sub, "extract", cmd_extract, section="extract",
                      help="phase 4: hidden-state extraction, one task per shard (Prefect flow)",
                      flow="merged/<split>.jsonl -> hidden/<split>/ (not needed with --plan "
                           "--records --tokens)",
                      on_host="run the shards on", workdir_required=False, many_hosts=True)
    p.add_argument("--shared-storage", action="store_true",
                   help="several hosts see the same files at --workdir (shards written in "
                        "place; nothing copied between hosts)")
    p.add_argument("--split", nargs="+", default=None, choices=list(SPLITS),
                   help="splits to extract (default: both; training evaluates on eval)")
    p.add_argument("--plan", action="store_true",
                   help="print the disk estimate only (from --records/--tokens, else the "
                        "workdir's merged data on this machine); runs nothing")
    p.add_argument("--records", type=positive_int, default=None, help="--plan: samples to extract")
    p.add_argument("--tokens", type=positive_int, default=None, help="--plan: tokens to extract")
    p.add_argument("--hidden-size", type=positive_int, default=None,
                   help="--plan: target hidden size (default: the target's config.json)")
    p.add_argument("--only-failed", action="store_true",
                   help="submit only shards that are missing, failed or corrupted")
    p.add_argument("--shards", nargs="+", type=int, default=None, help="only these shard indices")

    p = _flow_command(sub, "train", cmd_train, section="train",
                      help="phase 5: train the EAGLE-3 drafter and export it (Prefect flow)",
                      flow="hidden/ or merged/ -> drafter/ (not needed with --plan "
                           "--records --tokens)", on_host="train on", workdir_required=False)
    p.add_argument("--online", action="store_true",
                   help="run the target in process on merged/*.jsonl instead of reading hidden/ shards")
    p.add_argument("--plan", action="store_true",
                   help="print steps, epochs, tokens and the ETA only (from --records/--tokens, "
                        "else the workdir's merged data); runs nothing")
    p.add_argument("--records", type=positive_int, default=None,
                   help="--plan: merged records, both splits (the plan trains on the train "
                        "split: merge.eval_fraction of them are held out)")
    p.add_argument("--tokens", type=positive_int, default=None, help="--plan: their tokens")
    p.add_argument("--processes", type=positive_int, default=None,
                   help="--plan: training processes (default: train.processes, else one per "
                        "GPU of --host-block, else of this machine)")
    p.add_argument("--tok-s", type=float, default=None,
                   help="--plan: training tokens/s of all processes together (default: the "
                        "median of the workdir's drafter/history.json, if any)")

    p = sub.add_parser("evaluate", help="phase 6: speculative decoding with the drafter vs baselines; "
                       "τ, tokens/s, predicted speedup, HTML report (Prefect flow)")
    p.add_argument("--config", required=True, type=Path, help="pipeline YAML (its evaluate section)")
    p.add_argument("--workdir", required=True, type=Path,
                   help="run folder (on the host with --host-block): drafter/export + merged/ -> evaluate/")
    p.add_argument("--host-block", default=None, help="saved GpuHost block to evaluate on")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("tiny-target", help="build (once) the tiny demo target and print its folder")
    p.add_argument("--force", action="store_true", help="rebuild even when cached")
    p.set_defaults(func=cmd_tiny_target)

    p = sub.add_parser("check-export", help="static checks of an exported drafter against the "
                       "run that trained it: aux layers, d2t/t2d, SGLang's weights, rope, "
                       "positions, chat template; one line each, exit 1 naming failures")
    p.add_argument("--config", required=True, type=Path, help="pipeline YAML of the run")
    p.add_argument("--workdir", required=True, type=Path, help="the run folder (hidden/, drafter/)")
    p.add_argument("--drafter", type=Path, default=None,
                   help="the export folder (default: <workdir>/drafter/export)")
    p.set_defaults(func=cmd_check_export)

    p = sub.add_parser("check-config", help="validate a pipeline YAML")
    p.add_argument("--config", required=True, type=Path)
    p.set_defaults(func=cmd_check_config)

    from eyas.remote import probe

    p = sub.add_parser("status", help="what is done, partial or missing in a run on a host; disk needed next")
    probe.add_status_arguments(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("clean", help="delete obsolete outputs on a host (dry run unless --yes)")
    probe.add_clean_arguments(p)
    p.set_defaults(func=probe.clean_main)

    p = sub.add_parser("secret", help="store an API key in a Prefect Secret block")
    p.add_argument("action", choices=["set"])
    p.add_argument("name", help="block name, used as generation.api_key_block")
    p.set_defaults(func=cmd_secret)
    return parser


LOCKED_COMMANDS = ("pipeline", "prepare", "preflight", "extract", "train", "evaluate")
"""Commands that write into ``--workdir``: one at a time per folder (`eyas.workdir_lock`)."""


def _run_lock(args: argparse.Namespace):
    """The work directory's lock for a command that writes there, on this machine: not for
    ``--plan``, nor with ``--host-block`` (the folder is on the host, where the flow locks it:
    `tasks.hosts.run_lock`). Refuses a ``--workdir`` that is a file."""
    workdir = getattr(args, "workdir", None)
    if (workdir is None or args.command not in LOCKED_COMMANDS
            or getattr(args, "host_block", None)):
        return contextlib.nullcontext()
    if Path(workdir).exists() and not Path(workdir).is_dir():
        raise ConfigError(f"{workdir} is a file; expected the run's folder", where="--workdir")
    if getattr(args, "plan", False):
        return contextlib.nullcontext()
    from eyas.workdir_lock import workdir_lock

    return workdir_lock(Path(workdir), f"eyas {args.command}")


def main(argv: list[str] | None = None, *, signals: bool | None = None) -> int:
    """Run the ``eyas`` command `argv` (default: this process's arguments); its exit code.

    `signals` (default: when run as the program, `argv` None) installs the SIGTERM / Ctrl-C
    handling of `eyas.stopping`."""
    offline_defaults()
    args = build_parser().parse_args(argv)
    installed = argv is None if signals is None else signals
    if installed:
        stopping.install(deadline_s=STOP_DEADLINE_S)
    try:
        with _run_lock(args):
            return args.func(args)
    except EyasError as exc:
        print(f"eyas: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # StopRequested included
        stop = exc if isinstance(exc, stopping.StopRequested) else stopping.StopRequested(
            stopping.requested() or signal.SIGINT)
        kept = KEPT_ON_STOP.get(args.command, "finished work and checkpoints are kept")
        print(f"eyas {args.command}: {stop}; stopped cleanly ({kept}): run the same command "
              "again to resume", file=sys.stderr, flush=True)
        stopping.exit_within(EXIT_WITHIN_S, stop.exit_code)
        if installed:  # the program, not a test calling main(): skip the finalization
            stopping.exit_now(stop.exit_code)
        return stop.exit_code


if __name__ == "__main__":
    sys.exit(main())
