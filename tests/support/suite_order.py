"""The order pytest-xdist workers take test files in (tests/conftest.py applies it): the
longest files first, so no worker is left with an 8-minute file at the end while the others
idle. Only the order of files changes, never the order within a file; a file missing here
runs in collection order."""

from __future__ import annotations

# Seconds per file (setup included) in the 4-worker run of 2026-12-06 with one OpenMP thread
# per process (--junitxml; test_serving_ssh without a failure's extra 45 s); files run slower
# side by side, so these are an order, not timings. scripts/test.sh passes
# --no-loadscope-reorder: pytest-xdist otherwise reorders files by their number of tests,
# which put the drills (2-4 tests each) last.
LONGEST_FIRST = (
    "tests/integration/test_stop_drill.py",                 # 360
    "tests/integration/test_fault_drill.py",                # 326
    "tests/integration/test_flow_pipeline_whole.py",        # 237
    "tests/integration/test_ui_browser.py",                 # 160
    "tests/integration/test_serving_ssh.py",                # 150
    "tests/integration/test_flow_extract_hosts.py",         # 143
    "tests/integration/test_stopping.py",                   # 140
    "tests/integration/test_serving_local.py",              # 129
    "tests/integration/remote/test_flow_evaluate_ssh.py",   # 128
    "tests/unit/preflight/test_collectives.py",             # 116
    "tests/integration/remote/test_flow_train_ssh.py",      # 107
    "tests/unit/train/test_train_ddp.py",                   # 90
    "tests/integration/test_kimi_replica.py",               # 76
    "tests/integration/test_preflight_flow.py",             # 75
    "tests/unit/train/test_train_launch.py",                # 72
    "tests/integration/test_flow_train.py",                 # 72
    "tests/unit/evaluate/test_speculate.py",                # 57
    "tests/integration/test_serve.py",                      # 45
    "tests/integration/test_flow_lock.py",                  # 44
    "tests/integration/test_flow_prepare.py",               # 41
)


def longest_first(items: list) -> None:
    """Sort `items` (in place) so the files of `LONGEST_FIRST` come first, in its order."""
    rank = {path: n for n, path in enumerate(LONGEST_FIRST)}
    order = {}  # each file at its first item's place, files in LONGEST_FIRST ahead
    for n, item in enumerate(items):
        path = item.nodeid.split("::", 1)[0]
        order.setdefault(path, (rank.get(path, len(rank)), n))
    items.sort(key=lambda item: order[item.nodeid.split("::", 1)[0]])  # stable: a file's order kept
