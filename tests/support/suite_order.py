"""The order pytest-xdist workers take test files in (tests/conftest.py applies it): the
longest files first, so no worker is left with an 8-minute file at the end while the others
idle. Only the order of files changes, never the order within a file; a file missing here
runs in collection order."""

from __future__ import annotations

# Seconds per file (setup included) in the 4-worker run of 2026-12-06, --junitxml; files run
# slower side by side, so these are an order, not timings.
LONGEST_FIRST = (
    "tests/integration/test_fault_drill.py",                # 709
    "tests/integration/test_stop_drill.py",                 # 621
    "tests/integration/test_flow_pipeline_whole.py",        # 459
    "tests/integration/test_stopping.py",                   # 300
    "tests/unit/prepare/test_generate.py",                  # 273
    "tests/integration/test_preflight_flow.py",             # 265
    "tests/integration/test_ui_browser.py",                 # 230
    "tests/integration/test_flow_extract_hosts.py",         # 205
    "tests/integration/remote/test_flow_evaluate_ssh.py",   # 164
    "tests/unit/train/test_train_ddp.py",                   # 160
    "tests/integration/remote/test_flow_train_ssh.py",      # 153
    "tests/unit/evaluate/test_speculate.py",                # 148
    "tests/integration/test_serving_local.py",              # 141
    "tests/unit/preflight/test_collectives.py",             # 120
    "tests/integration/test_flow_train.py",                 # 111
)


def longest_first(items: list) -> None:
    """Sort `items` (in place) so the files of `LONGEST_FIRST` come first, in its order."""
    rank = {path: n for n, path in enumerate(LONGEST_FIRST)}
    order = {}  # each file at its first item's place, files in LONGEST_FIRST ahead
    for n, item in enumerate(items):
        path = item.nodeid.split("::", 1)[0]
        order.setdefault(path, (rank.get(path, len(rank)), n))
    items.sort(key=lambda item: order[item.nodeid.split("::", 1)[0]])  # stable: a file's order kept
