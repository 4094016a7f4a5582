"""The order pytest-xdist workers take test files in (tests/conftest.py applies it): the
longest files first, so no worker is left with an 8-minute file at the end while the others
idle. Only the order of files changes, never the order within a file; a file missing here
runs in collection order."""

from __future__ import annotations

# Seconds per file (setup included) in the 4-worker run of 2026-12-06 from a fresh clone
# (--junitxml; the fault drill's includes waiting for the reference the stop drill's worker
# makes); files run slower side by side, so these are an order, not timings.
# scripts/test.sh passes --no-loadscope-reorder: pytest-xdist otherwise reorders files by
# their number of tests, which put the drills (2-4 tests each) last.
LONGEST_FIRST = (
    "tests/integration/test_stop_drill.py",              # 472
    "tests/integration/test_fault_drill.py",             # 360
    "tests/integration/test_flow_pipeline_whole.py",     # 244
    "tests/integration/test_serving_ssh.py",             # 153
    "tests/integration/test_ui_browser.py",              # 147
    "tests/integration/test_flow_extract_hosts.py",      # 147
    "tests/integration/test_serving_local.py",           # 140
    "tests/integration/remote/test_flow_train_ssh.py",   # 122
    "tests/unit/preflight/test_collectives.py",          # 122
    "tests/integration/remote/test_flow_evaluate_ssh.py",  # 107
    "tests/integration/test_flow_train.py",              # 107
    "tests/integration/test_stopping.py",                # 98
    "tests/unit/train/test_train_ddp.py",                # 79
    "tests/unit/train/test_train_launch.py",             # 60
    "tests/unit/prepare/test_tokenize.py",               # 52
    "tests/integration/test_preflight_flow.py",          # 50
    "tests/integration/test_serve.py",                   # 43
    "tests/unit/evaluate/test_speculate.py",             # 40
    "tests/unit/extract/test_gpu_check_sglang.py",       # 39
    "tests/unit/tiny/test_kimi_replica_build.py",        # 37
)


def longest_first(items: list) -> None:
    """Sort `items` (in place) so the files of `LONGEST_FIRST` come first, in its order."""
    rank = {path: n for n, path in enumerate(LONGEST_FIRST)}
    order = {}  # each file at its first item's place, files in LONGEST_FIRST ahead
    for n, item in enumerate(items):
        path = item.nodeid.split("::", 1)[0]
        order.setdefault(path, (rank.get(path, len(rank)), n))
    items.sort(key=lambda item: order[item.nodeid.split("::", 1)[0]])  # stable: a file's order kept
