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
