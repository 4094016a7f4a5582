"""Benchmark phase 3 (merge and shuffle) against the users' load-everything script.

    python benchmarks/merge.py --quick        # 5% of the users' size, well under 2 minutes
    python benchmarks/merge.py                # the users' size: the merge keeps 24,773 records, ~87.8M tokens
    python benchmarks/merge.py --scale 10     # ten times that (naive run skipped if RAM is short)

It writes synthetic prepared datasets shaped like the users' (`_synth.py`: at scale 1 the merge
keeps their 24,773 records and ~87.8M tokens; A1 holds 2,800 samples of ~16K tokens, ~30% of
the tokens before the merge) into a temporary folder, then runs, each in a fresh
subprocess so that peak memory is measured separately:

- **ours**: ``eyas.prepare.merge.merge_datasets`` with ``exclude=[A1]``, ``max_seq_len=8192`` and the
  default config (1% eval split, 512 MB memory budget), writing train/eval/stats/manifest;
- **naive**: what the users' script does: read every line of every dataset but A1 with the
  stdlib ``json``, truncate to 8192 (both arrays), drop samples with no supervised token,
  ``random.shuffle`` the list in memory, ``json.dumps`` each record to ``train.jsonl``.
  (Skipping A1's file entirely is kinder to naive than their script, which read it.)

Peak memory is ``ru_maxrss`` from ``getrusage`` of the child. Ours runs pass 1 in worker
processes (one per file, up to the cores) while the main process waits, so its figure is
the larger of the main process's ``ru_maxrss`` and a psutil sample (every 50 ms) of the
summed RSS of the whole process tree. CPU seconds (user + system, workers included) are
printed too: on a shared machine they are steadier than wall times.
Both runs must produce the same number of records and tokens, or the benchmark fails.
The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synth import OUTLIER, make_datasets, text_table  # noqa: E402

MAX_SEQ_LEN = 8192
BYTES_PER_TOKEN = 8.5  # compact JSON: ~6.5 for an id, 2 for a mask entry
NAIVE_BYTES_PER_TOKEN = 60  # Python ints in lists, plus the dicts, measured roughly at 1x


def _rss_mb(kb: int) -> float:
    return kb / 1024  # Linux reports ru_maxrss in KiB


def _cpu_s() -> float:
    """User + system CPU seconds of this process and its finished children (workers)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


# --------------------------------------------------------------------------- children


def _child_ours(inputs: dict[str, str], out: Path, workers: int | None) -> dict:
    from eyas.config import MergeConfig
    from eyas.prepare.merge import merge_datasets

    cfg = MergeConfig(exclude=[OUTLIER], max_seq_len=MAX_SEQ_LEN)
    inherited = _rss_mb(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    start = time.perf_counter()
    stats = merge_datasets({k: Path(v) for k, v in inputs.items()}, out, cfg, workers=workers)
    wall = time.perf_counter() - start
    return {
        "work_s": wall,
        "cpu_s": _cpu_s(),
        "start_maxrss_mb": inherited,
        "self_maxrss_mb": _rss_mb(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss),
        "records": stats["records"],
        "tokens": stats["tokens"],
        "outliers": [o["dataset"] for o in stats["outliers"]],
        "truncated": stats["truncated"],
        "dropped": stats["dropped_unsupervised"],
    }


def _child_naive(inputs: dict[str, str], out: Path) -> dict:
    start = time.perf_counter()
    records = []
    for name, path in inputs.items():
        if name == OUTLIER:
            continue
        with open(path) as fh:
            for line in fh:
                rec = json.loads(line)
                rec["input_ids"] = rec["input_ids"][:MAX_SEQ_LEN]
                rec["loss_mask"] = rec["loss_mask"][:MAX_SEQ_LEN]
                if sum(rec["loss_mask"]) == 0:
                    continue
                records.append(rec)
    random.seed(42)
    random.shuffle(records)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train.jsonl", "w") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
    wall = time.perf_counter() - start
    return {
        "work_s": wall,
        "cpu_s": _cpu_s(),
        "self_maxrss_mb": _rss_mb(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss),
        "records": len(records),
        "tokens": sum(len(r["input_ids"]) for r in records),
    }


# --------------------------------------------------------------------------- parent


def _run_child(kind: str, inputs: dict[str, Path], out: Path, workers: int | None) -> dict:
    """Run one side in a fresh interpreter; return its report plus wall time and sampled RSS."""
    import psutil

    cmd = [sys.executable, __file__, "--child", kind, "--out", str(out),
           "--inputs", json.dumps({k: str(v) for k, v in inputs.items()})]
    if workers:
        cmd += ["--workers", str(workers)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, text=True)
    peak = [0.0]
    done = threading.Event()

    def sample() -> None:
        try:
            parent = psutil.Process(proc.pid)
            while not done.is_set():
                total = 0
                for p in [parent, *parent.children(recursive=True)]:
                    try:
                        total += p.memory_info().rss
                    except psutil.Error:
                        pass
                peak[0] = max(peak[0], total / 2**20)
                done.wait(0.05)
        except psutil.Error:
            pass

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, _ = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{kind} run failed (exit {proc.returncode})")
    report = json.loads(stdout.strip().splitlines()[-1])
    report["wall_s"] = wall
    report["sampled_peak_mb"] = peak[0]
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="5%% of the users' size")
    ap.add_argument("--scale", type=float, default=1.0, help="multiple of the users' size")
    ap.add_argument("--workdir", type=Path, default=None, help="where the temp data goes")
    ap.add_argument("--no-naive", action="store_true", help="skip the naive run")
    ap.add_argument("--workers", type=int, default=None, help="pass-1 processes (default: cores)")
    ap.add_argument("--keep", action="store_true", help="keep the generated data")
    ap.add_argument("--child", choices=["gen", "ours", "naive"], help=argparse.SUPPRESS)
    ap.add_argument("--inputs", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child == "gen":
        made = make_datasets(args.out, scale=args.scale)
        print(json.dumps({k: str(v) for k, v in made.items()}))
        return
    if args.child:
        inputs = json.loads(args.inputs)
        report = (_child_ours(inputs, args.out, args.workers) if args.child == "ours"
                  else _child_naive(inputs, args.out))
        print(json.dumps(report))
        return

    import psutil

    scale = 0.05 if args.quick else args.scale
    est_bytes = 147e6 * scale * BYTES_PER_TOKEN  # all ten datasets' tokens before the merge
    base = args.workdir or Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(base).free
    if free < 3.2 * est_bytes:
        raise SystemExit(f"{base}: {free / 1e9:.1f} GB free, need about {3.2 * est_bytes / 1e9:.1f} GB "
                         "(inputs, bucket files and outputs)")
    work = Path(tempfile.mkdtemp(prefix="eyas-merge-bench-", dir=base))
    try:
        # generated in a child: a child's ru_maxrss starts at its parent's RSS when the
        # parent forks, so the parent must stay small for the measured children
        t = time.perf_counter()
        made = subprocess.run([sys.executable, __file__, "--child", "gen", "--scale", str(scale),
                               "--out", str(work / "prepared")],
                              check=True, capture_output=True, text=True)
        inputs = {k: Path(v) for k, v in json.loads(made.stdout.strip().splitlines()[-1]).items()}
        gen_s = time.perf_counter() - t
        in_bytes = sum(p.stat().st_size for p in inputs.values())
        print(f"generated {len(inputs)} datasets, {in_bytes / 1e6:,.0f} MB of JSONL in {gen_s:.1f} s "
              f"(scale {scale:g}) under {work}", flush=True)

        ours = _run_child("ours", inputs, work / "merged", args.workers)
        shutil.rmtree(work / "merged")
        nproc = args.workers or min(len(os.sched_getaffinity(0)), len(inputs))
        # the merge's processes overlap only in pass 1 (main waits while workers scan), so the
        # peak is the larger of main's own ru_maxrss and the sampled sum over the tree
        ours_peak = max(ours["self_maxrss_mb"], ours["sampled_peak_mb"])
        print(f"ours:  {ours['wall_s']:.2f} s, {ours['records']:,} records, {ours['tokens']:,} tokens, "
              f"outliers flagged {ours['outliers']}", flush=True)

        selected_bytes = sum(p.stat().st_size for n, p in inputs.items() if n != OUTLIER)
        naive_need_mb = selected_bytes / BYTES_PER_TOKEN * NAIVE_BYTES_PER_TOKEN / 2**20
        avail_mb = psutil.virtual_memory().available / 2**20
        naive = None
        skip_reason = None
        if args.no_naive:
            skip_reason = "--no-naive"
        elif naive_need_mb > 0.6 * avail_mb:
            skip_reason = (f"naive would need ~{naive_need_mb:,.0f} MB of RAM, "
                           f"{avail_mb:,.0f} MB available")
        else:
            naive = _run_child("naive", inputs, work / "naive", None)
            shutil.rmtree(work / "naive")
            if (naive["records"], naive["tokens"]) != (ours["records"], ours["tokens"]):
                raise SystemExit(f"outputs disagree: naive {naive['records']} records "
                                 f"{naive['tokens']} tokens, ours {ours['records']} {ours['tokens']}")
            print(f"naive: {naive['wall_s']:.2f} s (same records and tokens as ours)", flush=True)
        if skip_reason:
            print(f"naive run skipped: {skip_reason}")

        rows = [("", "wall s", "CPU s", "peak RSS MB", "main ru_maxrss MB", "sampled tree MB")]
        rows.append(("ours", f"{ours['wall_s']:.2f}", f"{ours['cpu_s']:.2f}", f"{ours_peak:,.0f}",
                     f"{ours['self_maxrss_mb']:,.0f}", f"{ours['sampled_peak_mb']:,.0f}"))
        if naive:
            rows.append(("naive", f"{naive['wall_s']:.2f}", f"{naive['cpu_s']:.2f}",
                         f"{naive['self_maxrss_mb']:,.0f}", f"{naive['self_maxrss_mb']:,.0f}",
                         f"{naive['sampled_peak_mb']:,.0f}"))
        print()
        print(f"merge of {ours['records']:,} records / {ours['tokens']:,} tokens "
              f"({selected_bytes / 1e6:,.0f} MB selected of {in_bytes / 1e6:,.0f} MB), "
              f"{os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB RAM")
        print(text_table(rows))
        result = {
            "scale": scale,
            "records": ours["records"],
            "tokens": ours["tokens"],
            "input_mb": round(in_bytes / 1e6, 1),
            "ours_s": round(ours["wall_s"], 2),
            "naive_s": round(naive["wall_s"], 2) if naive else None,
            "speedup": round(naive["wall_s"] / ours["wall_s"], 2) if naive else None,
            "ours_peak_rss_mb": round(ours_peak, 1),
            "ours_main_rss_mb": round(ours["self_maxrss_mb"], 1),
            "ours_main_rss_at_start_mb": round(ours["start_maxrss_mb"], 1),
            "ours_cpu_s": round(ours["cpu_s"], 2),
            "naive_cpu_s": round(naive["cpu_s"], 2) if naive else None,
            "ours_sampled_peak_mb": round(ours["sampled_peak_mb"], 1),
            "naive_peak_rss_mb": round(naive["self_maxrss_mb"], 1) if naive else None,
            "memory_ratio": round(ours_peak / naive["self_maxrss_mb"], 3) if naive else None,
            "naive_skipped": skip_reason,
            "workers": nproc,
        }
        print(json.dumps(result))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
