"""tests/support/suite_order.py, the scheduling hint for pytest-xdist: the files it names exist, and putting
them first keeps every file's own order."""

from __future__ import annotations

from types import SimpleNamespace

from support.paths import REPO
from support.suite_order import LONGEST_FIRST, longest_first


def test_the_longest_files_named_exist():
    missing = [p for p in LONGEST_FIRST if not (REPO / p).is_file()]
    assert not missing, f"renamed or gone; update LONGEST_FIRST in tests/support/suite_order.py: {missing}"


def test_longest_files_move_ahead_and_each_file_keeps_its_order():
    ids = ["tests/a.py::x", "tests/a.py::y", f"{LONGEST_FIRST[1]}::p", "tests/b.py::z",
           f"{LONGEST_FIRST[0]}::q", f"{LONGEST_FIRST[1]}::r", "tests/a.py::w"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    longest_first(items)
    assert [i.nodeid for i in items] == [
        f"{LONGEST_FIRST[0]}::q", f"{LONGEST_FIRST[1]}::p", f"{LONGEST_FIRST[1]}::r",
        "tests/a.py::x", "tests/a.py::y", "tests/a.py::w", "tests/b.py::z"]
