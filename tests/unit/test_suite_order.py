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


def _first_files_handed_out(flags: list[str], collection: list[str], workers: int) -> list[str]:
    """The files pytest-xdist's own file scheduler hands `workers` workers first (one each),
    with the scheduling flags `flags` of scripts/test.sh and the (already sorted) `collection`."""
    from xdist.scheduler import LoadFileScheduling

    option = SimpleNamespace(loadscopereorder="--no-loadscope-reorder" not in flags)
    config = SimpleNamespace(option=option, getvalue=lambda name: [f"{workers}*popen"])
    sched = LoadFileScheduling(config)
    handed: list[str] = []

    class Worker:
        shutting_down = False

        def __init__(self, n):
            self.gateway = SimpleNamespace(id=f"gw{n}")

        def send_runtest_some(self, indexes):
            handed.append(collection[indexes[0]].split("::", 1)[0])

        def shutdown(self):
            self.shutting_down = True

    nodes = [Worker(n) for n in range(workers)]
    for node in nodes:
        sched.add_node(node)
    for node in nodes:
        sched.add_node_collection(node, collection)
    sched.schedule()
    return handed[:workers]


def test_the_test_command_keeps_the_longest_files_first_under_pytest_xdist():
    """pytest-xdist (3.x) reorders files by how many tests each has unless told not to, which
    put the drills (2-4 tests, the longest files) last: scripts/test.sh must tell it."""
    exec_line = [line for line in (REPO / "scripts" / "test.sh").read_text().splitlines()
                 if line.startswith("exec ") and " -n " in line]
    assert len(exec_line) == 1, exec_line
    flags = exec_line[0].split()
    assert "loadfile" in flags
    many = [f"tests/many.py::t{i}" for i in range(5)]
    items = [SimpleNamespace(nodeid=i) for i in
             [*many, f"{LONGEST_FIRST[1]}::a", f"{LONGEST_FIRST[0]}::b"]]
    longest_first(items)
    collection = [i.nodeid for i in items]
    assert _first_files_handed_out(flags, collection, 2) == list(LONGEST_FIRST[:2])
    # What the flag prevents: xdist's default order, the file with most tests first.
    assert _first_files_handed_out([], collection, 2)[0] == "tests/many.py"
