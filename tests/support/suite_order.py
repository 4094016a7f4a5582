"""The order pytest-xdist workers take test files in (tests/conftest.py applies it): the
longest files first, so no worker is left with an 8-minute file at the end while the others
idle. Only the order of files changes, never the order within a file; a file missing here
runs in collection order."""

from __future__ import annotations

# Serial seconds on 2 cores, measured 2026-12-03 with --durations.
LONGEST_FIRST = (
    "tests/integration/test_stop_drill.py",                 # 506
    "tests/integration/test_fault_drill.py",                # 492
    "tests/integration/test_flow_pipeline_whole.py",        # 273
    "tests/integration/test_ui_browser.py",                 # 174
    "tests/integration/test_flow_extract_hosts.py",         # 158
    "tests/integration/test_serving_ssh.py",       # 147
    "tests/integration/test_serving_local.py",     # 133
    "tests/integration/test_stopping.py",                   # 127
    "tests/unit/preflight/test_collectives.py",      # 124
    "tests/integration/remote/test_flow_evaluate_ssh.py",   # 101
    "tests/integration/remote/test_flow_train_ssh.py",      # 94
    "tests/integration/test_flow_train.py",                 # 92
)


def longest_first(items: list) -> None:
    """Sort `items` (in place) so the files of `LONGEST_FIRST` come first, in its order."""
    rank = {path: n for n, path in enumerate(LONGEST_FIRST)}
    order = {}  # each file at its first item's place, files in LONGEST_FIRST ahead
    for n, item in enumerate(items):
        path = item.nodeid.split("::", 1)[0]
        order.setdefault(path, (rank.get(path, len(rank)), n))
    items.sort(key=lambda item: order[item.nodeid.split("::", 1)[0]])  # stable: a file's order kept
