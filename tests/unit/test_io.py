import pytest

from eyas.errors import DataError
from eyas.io import AtomicJsonlWriter, atomic_write, iter_jsonl, read_json, write_json


def test_atomic_write_leaves_old_file_on_error(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_write(path) as fh:
        fh.write("half")
        raise RuntimeError("boom")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_jsonl_writer_commits_or_discards(tmp_path):
    path = tmp_path / "d.jsonl"
    with AtomicJsonlWriter(path) as w:
        w.write({"a": 1})
        w.write({"a": 2})
    assert [o for _, o in iter_jsonl(path)] == [{"a": 1}, {"a": 2}]
    with pytest.raises(KeyError), AtomicJsonlWriter(path) as w:
        w.write({"a": 3})
        raise KeyError
    assert [o["a"] for _, o in iter_jsonl(path)] == [1, 2]
    assert len(list(tmp_path.iterdir())) == 1


def test_iter_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n\n{"a": \n')
    with pytest.raises(DataError, match=r"bad.jsonl:3: malformed JSON"):
        list(iter_jsonl(path))
    path.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: expected a JSON object, got list"):
        list(iter_jsonl(path))


def test_empty_and_missing_files_are_errors(tmp_path):
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(DataError, match="file is empty"):
        list(iter_jsonl(tmp_path / "e.jsonl"))
    with pytest.raises(DataError, match="file not found"):
        list(iter_jsonl(tmp_path / "missing.jsonl"))


def test_json_roundtrip_and_error(tmp_path):
    write_json(tmp_path / "x.json", {"b": 1, "a": [1]})
    assert read_json(tmp_path / "x.json") == {"a": [1], "b": 1}
    (tmp_path / "y.json").write_text('{\n  "a": ,\n}')
    with pytest.raises(DataError, match=r"y.json:2: not valid JSON"):
        read_json(tmp_path / "y.json")


def test_a_killed_writers_temp_file_is_removed_by_the_next_writer_of_that_file(tmp_path):
    """A writer killed with SIGKILL cannot remove its temporary file (the fault drill's
    ``.tmp-tokenized_data.jsonl.*`` after a kill mid-tokenization); the next writer of the same
    file on this machine does, and leaves a live writer's and another file's alone."""
    import os
    import signal
    import subprocess
    import sys

    path = tmp_path / "tokenized_data.jsonl"
    script = ("import sys, time\nfrom eyas.io import AtomicJsonlWriter\n"
              "w = AtomicJsonlWriter(sys.argv[1]); w.write({'a': 1}); w._fh.flush()\n"
              "print('open', flush=True); time.sleep(60)\n")

    def writer(target):
        proc = subprocess.Popen([sys.executable, "-c", script, str(target)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "open\n"
        return proc

    killed, alive, other = writer(path), writer(path), writer(tmp_path / "other.jsonl")
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        temps = sorted(p.name for p in tmp_path.iterdir())
        assert len(temps) == 3 and all(n.startswith(".tmp-") for n in temps), temps
        assert sum(f"-{killed.pid}." in n for n in temps) == 1, temps
        with AtomicJsonlWriter(path) as w:
            w.write({"a": 2})
        left = sorted(p.name for p in tmp_path.iterdir())
        assert [n for n in left if f"-{killed.pid}." in n] == [], left
        assert sum(f"-{alive.pid}." in n for n in left) == 1, left  # a live writer's stays
        assert sum(n.startswith(".tmp-other.jsonl.") for n in left) == 1, left
        assert [o for _, o in iter_jsonl(path)] == [{"a": 2}]
    finally:
        for proc in (killed, alive, other):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
