"""Benchmark: would polars speed up eyas's tabular work? (issue 29 point 5)

    python benchmarks/polars_tables.py --quick   # 5% of the users' size, about 10 s
    python benchmarks/polars_tables.py           # the users' size (24,773 records kept, ~87.8M tokens)

polars is in the user's stack; this measures the three places where eyas does table-like work
by hand against a polars version of each, checks that both give identical results (the
benchmark fails otherwise) and prints both times and their ratio:

1. **The merge's length scan** (per file: samples, tokens, supervised tokens, longest record).
   eyas: ``eyas.prepare.merge_scan.scan_file`` profiling only (``route=False``, what the merge
   does for an excluded dataset: it also validates every line and hashes the file, which the
   polars arm does not). polars: ``scan_ndjson`` of ``input_ids``/``loss_mask`` as list
   columns, ``list.len()`` and ``list.sum()``, aggregated. Each arm runs over the ten synthetic
   datasets of ``_synth.py`` in a fresh interpreter (polars with its default thread pool, and
   with ``POLARS_MAX_THREADS=1``: the merge already runs one worker process per file on every
   core), so peak memory (``ru_maxrss``) and CPU seconds are the arm's own.
2. **The outlier profile and the composition table** (``find_outliers``, ``report.dataset_rows``)
   over the ten datasets' figures: pure Python against a polars DataFrame version (written
   here), median time of many calls, plus the one-off cost of ``import polars``.
3. **The bucket sort of pass 2** (``iter_buckets``: ``list.sort`` of ``(key, source, line,
   split, payload)`` tuples) at a real bucket's size (the users' records over the buckets the
   default memory budget makes), all the users' records and ten times that, against a polars
   sort of the same columns that hands back the tuples pass 2 consumes, and a polars sort of the
   three key columns only whose row order gathers the tuples (the kindest polars form).

polars is not an eyas dependency (this measured why): it comes with the ``dev`` extra.
The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synth import OUTLIER, SHAPE, make_datasets, text_table  # noqa: E402

USERS_RECORDS = 24_773


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# --------------------------------------------------------------------------- 1. length scan


def _scan_eyas(paths: dict[str, str]) -> dict[str, list[int]]:
    from eyas.prepare.merge_scan import ScanTask, scan_file

    out = {}
    for i, (name, path) in enumerate(paths.items()):
        r = scan_file(ScanTask(index=i, name=name, path=path, route=False))
        if r.error:
            raise SystemExit(f"eyas scan failed: {r.error}")
        p = r.profile
        out[name] = [p.samples, p.tokens, p.supervised_tokens, p.max_len]
    return out


def _scan_polars(paths: dict[str, str]) -> dict[str, list[int]]:
    import polars as pl

    schema = {"input_ids": pl.List(pl.Int64), "loss_mask": pl.List(pl.Int64)}
    out = {}
    for name, path in paths.items():
        row = (
            pl.scan_ndjson(path, schema=schema)
            .select(n=pl.col("input_ids").list.len(), sup=pl.col("loss_mask").list.sum())
            .select(samples=pl.len(), tokens=pl.col("n").sum(), sup=pl.col("sup").sum(),
                    max_len=pl.col("n").max())
            .collect()
            .row(0)
        )
        out[name] = [int(v) for v in row]
    return out


def _child_scan(arm: str, paths: dict[str, str]) -> dict:
    t = time.perf_counter()
    if arm.startswith("polars"):
        import polars as pl

        threads = pl.thread_pool_size()
    else:
        import eyas.prepare.merge_scan  # noqa: F401

        threads = 1
    import_s = time.perf_counter() - t
    rss0 = _maxrss_mb()
    cpu0 = _cpu_s()
    t = time.perf_counter()
    profiles = _scan_polars(paths) if arm.startswith("polars") else _scan_eyas(paths)
    return {"arm": arm, "wall_s": time.perf_counter() - t, "cpu_s": _cpu_s() - cpu0,
            "import_s": import_s, "maxrss_mb": _maxrss_mb(), "maxrss_after_import_mb": rss0,
            "threads": threads, "profiles": profiles}


def _run_scan(arm: str, paths: dict[str, str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if arm == "polars-1thread":
        env["POLARS_MAX_THREADS"] = "1"
    out = subprocess.run([sys.executable, __file__, "--child", arm, "--inputs", json.dumps(paths)],
                         check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- 2. tables


def _outliers_polars(profiles: dict, cfg) -> list:
    """`find_outliers` written with a polars DataFrame (the numbers; the sentences are Python)."""
    import polars as pl

    from eyas.prepare.outliers import Outlier, selected_datasets

    names = list(profiles)
    df = pl.DataFrame({"dataset": names,
                       "samples": [profiles[n].samples for n in names],
                       "tokens": [profiles[n].tokens for n in names]},
                      schema={"dataset": pl.String, "samples": pl.Int64, "tokens": pl.Int64})
    df = df.filter(pl.col("samples") > 0)
    if df.height < 2:
        return []
    df = df.with_columns(
        mean_len=pl.col("tokens") / pl.col("samples"),
        sample_share=pl.col("samples") / pl.col("samples").sum(),
        token_share=pl.when(pl.col("tokens").sum() > 0)
        .then(pl.col("tokens") / pl.col("tokens").sum()).otherwise(0.0),
    ).with_columns(share_ratio=pl.col("token_share") / pl.col("sample_share"))
    others = (
        df.select("dataset", "mean_len")
        .join(df.select(other=pl.col("dataset"), other_mean=pl.col("mean_len")), how="cross")
        .filter(pl.col("dataset") != pl.col("other"))
        .group_by("dataset", maintain_order=True)
        .agg(median=pl.col("other_mean").median())
    )
    df = df.join(others, on="dataset", how="left", maintain_order="left").with_columns(
        len_ratio=pl.when(pl.col("median") > 0).then(pl.col("mean_len") / pl.col("median"))
        .otherwise(0.0))
    selected = set(selected_datasets(names, cfg))
    found = []
    for r in df.iter_rows(named=True):
        reasons, checks = [], []
        if r["share_ratio"] >= cfg.outlier_token_share_ratio:
            checks.append("token_share")
            reasons.append(
                f"{r['token_share']:.1%} of tokens from {r['sample_share']:.1%} of samples "
                f"({r['share_ratio']:.1f}x; threshold outlier_token_share_ratio="
                f"{cfg.outlier_token_share_ratio:g})")
        if r["len_ratio"] >= cfg.outlier_mean_len_ratio:
            checks.append("mean_len")
            reasons.append(
                f"mean length {r['mean_len']:,.0f} tokens is {r['len_ratio']:.1f}x the median of "
                f"the other datasets' means ({r['median']:,.0f}; threshold outlier_mean_len_ratio="
                f"{cfg.outlier_mean_len_ratio:g})")
        if reasons:
            found.append(Outlier(dataset=r["dataset"], reasons=reasons,
                                 sample_share=r["sample_share"], token_share=r["token_share"],
                                 share_ratio=r["share_ratio"], mean_len=r["mean_len"],
                                 others_median_mean_len=r["median"],
                                 mean_len_ratio=r["len_ratio"],
                                 excluded=r["dataset"] not in selected, checks=checks))
    return found


def _rows_polars(tokenized: dict, merge_stats: dict) -> list[dict]:
    """`report.dataset_rows` with the numeric columns computed by polars."""
    import polars as pl

    outliers = {o["dataset"] for o in merge_stats.get("outliers", [])}
    excluded = set(merge_stats.get("excluded") or {})
    names = list(tokenized)

    def col(key, default=0, cast=None):
        vals = [tokenized[n].get(key, default) for n in names]
        return [cast(v) if cast else v for v in vals]

    df = pl.DataFrame({
        "dataset": names, "samples": col("samples"), "tokens": col("tokens"),
        "mean_len": col("mean_len", 0.0, float), "max_len": col("max_len"),
        "supervised_fraction": col("supervised_fraction", 0.0, float),
        "cut_answers": col("cut_answers"),
        "final_reasoning_tokens": col("final_reasoning_tokens"),
        "cut_share": col("cut_answer_share", 0.0, float), "rejected": col("rejected"),
    })
    total_s = max(int(df["samples"].sum()), 1)
    total_t = max(int(df["tokens"].sum()), 1)
    df = df.with_columns(
        pl.col("mean_len").round(1), pl.col("supervised_fraction").round(3),
        pl.col("cut_share").round(4),
        sample_share=(pl.col("samples") / total_s).round(4),
        token_share=(pl.col("tokens") / total_t).round(4),
    )
    rows = []
    for r in df.iter_rows(named=True):
        s = tokenized[r["dataset"]]
        frs = s.get("final_reasoning_supervised_fraction")
        rows.append({
            "dataset": r["dataset"], "samples": r["samples"], "tokens": r["tokens"],
            "mean_len": r["mean_len"], "max_len": r["max_len"],
            "supervised_fraction": r["supervised_fraction"], "cut_answers": r["cut_answers"],
            "final_reasoning_tokens": r["final_reasoning_tokens"],
            "final_reasoning_supervised": "" if frs is None else round(float(frs), 3),
            "cut_share": r["cut_share"], "rejected": r["rejected"],
            "reject_reasons": "; ".join(f"{k} ({n:,})" for k, n in
                                        (s.get("rejected_reasons") or {}).items()),
            "sample_share": r["sample_share"], "token_share": r["token_share"],
            "outlier": "yes" if r["dataset"] in outliers else "",
            "merged": "excluded" if r["dataset"] in excluded else "yes",
        })
    return rows


def _best_us(fn, reps: int) -> float:
    """Median microseconds per call over `reps` calls (after one warm-up)."""
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def _tables(profiles_raw: dict[str, list[int]]) -> dict:
    from eyas.config import MergeConfig
    from eyas.prepare.outliers import DatasetProfile, find_outliers
    from eyas.prepare.report import dataset_rows

    profiles = {n: DatasetProfile(*v) for n, v in profiles_raw.items()}
    cfg = MergeConfig(exclude=[OUTLIER])
    ours = [o.to_dict() for o in find_outliers(profiles, cfg)]
    theirs = [o.to_dict() for o in _outliers_polars(profiles, cfg)]
    if ours != theirs or not ours:
        raise SystemExit(f"outlier profiles disagree:\n eyas   {ours}\n polars {theirs}")
    rng = random.Random(0)
    tokenized = {}
    for n, p in profiles.items():  # phase-2 stats shaped like tokenize_dataset's
        cut = rng.randrange(0, max(1, p.samples // 20))
        tokenized[n] = {**p.to_dict(), "mean_len": p.mean_len,
                        "supervised_fraction": p.supervised_tokens / p.tokens,
                        "rejected": rng.randrange(0, 30),
                        "rejected_reasons": {"template refused": rng.randrange(1, 9)},
                        "cut_answers": cut, "cut_answer_share": cut / p.samples,
                        "final_reasoning_tokens": 0}
    merge_stats = {"outliers": ours, "excluded": {OUTLIER: "merge.exclude"}}
    rows = dataset_rows(tokenized, merge_stats)
    rows_pl = _rows_polars(tokenized, merge_stats)
    if rows != rows_pl:
        diff = [(a, b) for a, b in zip(rows, rows_pl, strict=True) if a != b]
        raise SystemExit(f"composition tables disagree: {diff[:2]}")
    return {
        "outliers_eyas_us": _best_us(lambda: find_outliers(profiles, cfg), 2000),
        "outliers_polars_us": _best_us(lambda: _outliers_polars(profiles, cfg), 300),
        "rows_eyas_us": _best_us(lambda: dataset_rows(tokenized, merge_stats), 2000),
        "rows_polars_us": _best_us(lambda: _rows_polars(tokenized, merge_stats), 300),
    }


# --------------------------------------------------------------------------- 3. bucket sort


def _entries(n: int, seed: int = 0) -> list[tuple[int, int, int, int, bytes]]:
    rng = random.Random(seed)
    return [(rng.getrandbits(64), rng.randrange(10), i + 1, int(rng.random() < 0.01),
             rng.randbytes(13)) for i in range(n)]


def _sort_polars(entries: list[tuple]) -> list[tuple]:
    import polars as pl

    key, source, line, split, payload = zip(*entries, strict=True)
    df = pl.DataFrame({"key": key, "source": source, "line": line, "split": split,
                       "payload": payload},
                      schema={"key": pl.UInt64, "source": pl.Int64, "line": pl.Int64,
                              "split": pl.Int64, "payload": pl.Binary})
    return df.sort("key", "source", "line").rows()


def _argsort_polars(entries: list[tuple]) -> list[tuple]:
    """polars sorts only the three key columns; the tuples are gathered in its order."""
    import polars as pl

    key, source, line = zip(*((e[0], e[1], e[2]) for e in entries), strict=True)
    order = (pl.DataFrame({"key": key, "source": source, "line": line},
                          schema={"key": pl.UInt64, "source": pl.Int64, "line": pl.Int64})
             .with_row_index().sort("key", "source", "line")["index"].to_list())
    return [entries[i] for i in order]


def _sort(n: int, reps: int) -> dict:
    """Best wall and CPU milliseconds of each arm, the arms interleaved `reps` times (the CPU
    figure counts polars' threads too)."""
    entries = _entries(n)
    ours = sorted(entries)
    arms = {"eyas": sorted, "polars": _sort_polars, "polars_argsort": _argsort_polars}
    for name, fn in arms.items():
        if fn(entries) != ours:
            raise SystemExit(f"bucket sorts disagree at {n:,} entries ({name})")
    wall = {name: [] for name in arms}
    cpu = {name: [] for name in arms}
    for _ in range(reps):
        for name, fn in arms.items():
            t, c = time.perf_counter(), time.process_time()
            fn(entries)
            wall[name].append((time.perf_counter() - t) * 1e3)
            cpu[name].append((time.process_time() - c) * 1e3)
    return {"entries": n} | {f"{name}_ms": min(wall[name]) for name in arms} | {
        f"{name}_cpu_ms": min(cpu[name]) for name in arms}


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="5%% of the users' size")
    ap.add_argument("--scale", type=float, default=1.0, help="multiple of the users' size")
    ap.add_argument("--workdir", type=Path, default=None, help="where the temp data goes")
    ap.add_argument("--child", choices=["eyas", "polars", "polars-1thread"], help=argparse.SUPPRESS)
    ap.add_argument("--inputs", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child_scan(args.child, json.loads(args.inputs))))
        return

    import polars as pl

    scale = 0.05 if args.quick else args.scale
    base = args.workdir or Path(tempfile.gettempdir())
    work = Path(tempfile.mkdtemp(prefix="eyas-polars-bench-", dir=base))
    try:
        t = time.perf_counter()
        paths = {k: str(v) for k, v in make_datasets(work / "prepared", scale=scale).items()}
        in_mb = sum(Path(p).stat().st_size for p in paths.values()) / 1e6
        print(f"polars {pl.__version__}; {len(paths)} datasets, {in_mb:,.0f} MB of JSONL "
              f"(scale {scale:g}) written in {time.perf_counter() - t:.1f} s; "
              f"{len(os.sched_getaffinity(0))} usable CPUs", flush=True)

        scans = {arm: _run_scan(arm, paths) for arm in ("eyas", "polars", "polars-1thread")}
        ref = scans["eyas"]["profiles"]
        for arm, r in scans.items():
            if r["profiles"] != ref:
                raise SystemExit(f"length scans disagree: eyas {ref}, {arm} {r['profiles']}")
        e = scans["eyas"]
        rows = [("length scan", "threads", "wall s", "CPU s", "MB/s", "peak RSS MB", "x eyas wall")]
        for arm, r in scans.items():
            rows.append((arm, str(r["threads"]), f"{r['wall_s']:.2f}", f"{r['cpu_s']:.2f}",
                         f"{in_mb / r['wall_s']:,.0f}", f"{r['maxrss_mb']:,.0f}",
                         f"{r['wall_s'] / e['wall_s']:.2f}"))
        print(f"\n1. length scan of all {len(paths)} files "
              f"({sum(v[0] for v in ref.values()):,} records, "
              f"{sum(v[1] for v in ref.values()):,} tokens; identical profiles)")
        print(text_table(rows))

        tables = _tables(ref)
        print(f"\n2. tables over {len(SHAPE)} datasets (identical outputs); "
              f"import polars: {scans['polars']['import_s'] * 1e3:.0f} ms once")
        print(text_table([
            ("table", "eyas us", "polars us", "polars / eyas"),
            ("find_outliers", f"{tables['outliers_eyas_us']:.1f}",
             f"{tables['outliers_polars_us']:.1f}",
             f"{tables['outliers_polars_us'] / tables['outliers_eyas_us']:.1f}"),
            ("dataset_rows", f"{tables['rows_eyas_us']:.1f}", f"{tables['rows_polars_us']:.1f}",
             f"{tables['rows_polars_us'] / tables['rows_eyas_us']:.1f}"),
        ]))

        from eyas.config import MergeConfig
        from eyas.prepare.shuffle import bucket_count

        n1 = max(2, round(USERS_RECORDS * scale))
        # a real merge sorts one bucket at a time; the count comes from the selected bytes
        # (A1 excluded) and the default memory budget
        selected = sum(Path(p).stat().st_size for n, p in paths.items() if n != OUTLIER)
        k = bucket_count(selected, MergeConfig().memory_budget_mb)
        sorts = [_sort(max(2, n1 // k), 15), _sort(n1, 9), _sort(10 * n1, 5)]
        print(f"\n3. pass 2's sort of one bucket ({k} bucket(s) in a real merge; identical order; "
              "best of interleaved runs)")
        print(text_table([("entries", "eyas ms", "CPU", "polars ms", "CPU", "polars argsort ms", "CPU",
                       "argsort / eyas")] + [
            (f"{s['entries']:,}", f"{s['eyas_ms']:.1f}", f"{s['eyas_cpu_ms']:.1f}",
             f"{s['polars_ms']:.1f}", f"{s['polars_cpu_ms']:.1f}",
             f"{s['polars_argsort_ms']:.1f}", f"{s['polars_argsort_cpu_ms']:.1f}",
             f"{s['polars_argsort_ms'] / s['eyas_ms']:.2f}") for s in sorts]))

        result = {
            "scale": scale, "input_mb": round(in_mb, 1), "polars": pl.__version__,
            "scan": {arm: {k: round(r[k], 3) for k in ("wall_s", "cpu_s", "maxrss_mb", "import_s")}
                     | {"threads": r["threads"]} for arm, r in scans.items()},
            "scan_polars_over_eyas": round(scans["polars"]["wall_s"] / e["wall_s"], 2),
            "scan_polars1_over_eyas": round(scans["polars-1thread"]["wall_s"] / e["wall_s"], 2),
            "tables_us": {k: round(v, 1) for k, v in tables.items()},
            "buckets": k,
            "sort_ms": [{k: round(v, 2) for k, v in s.items()} for s in sorts],
        }
        print(json.dumps(result))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
