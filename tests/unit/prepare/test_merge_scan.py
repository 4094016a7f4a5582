"""The merge's record work (eyas.prepare.merge_scan): validating a line without building Python
lists, scanning a file into counts and a profile, rendering a routed record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eyas.errors import DataError
from eyas.prepare.merge_scan import KEEP, REWRITE, ScanTask, decode_record, render, scan_file

P = Path("prepared/x/tokenized_data.jsonl")


def _line(**rec) -> bytes:
    return (json.dumps(rec, separators=(",", ":")) + "\n").encode()


def test_decode_returns_the_raw_arrays_and_the_mask_digits():
    sid, clean, ids, mask, n, digits = decode_record(
        _line(id="a", input_ids=[5, 6, 7], loss_mask=[0, 1, 1]), P, 1)
    assert (sid, clean, ids, mask, n, digits) == ("a", True, b"[5,6,7]", b"[0,1,1]", 3, b"011")
    # Spaces are fine; an extra field makes the record one to rebuild, not to splice.
    sid, clean, _, _, n, digits = decode_record(
        b'{"id": 3, "input_ids": [1, 2], "loss_mask": [1, 0], "source": "x"}\n', P, 2)
    assert (sid, clean, n, digits) == (3, False, 2, b"10")


@pytest.mark.parametrize("raw, field, words", [
    (b'{"id": "a", "input_ids": [1, 2]}', "loss_mask", "missing"),
    (b'{"id": "a", "input_ids": "12", "loss_mask": [1]}', "input_ids", "got a string"),
    (b'{"id": "a", "input_ids": [1, -2], "loss_mask": [1, 1]}', "input_ids", "non-negative"),
    (b'{"id": "a", "input_ids": [1.5], "loss_mask": [1]}', "input_ids", "non-negative"),
    (b'{"id": "a", "input_ids": [], "loss_mask": []}', "input_ids", "is empty"),
    (b'{"id": "a", "input_ids": [1, 2], "loss_mask": [1, 2]}', "loss_mask", "other than 0 and 1"),
    (b'{"id": "a", "input_ids": [1, 2], "loss_mask": [1]}', "loss_mask", "has 1 entries"),
    (b'{"id": "a", "input_ids": [1, 2], "loss_mask": [[1], [0]]}', "loss_mask", "other than 0"),
    (b'{"id": ["a"], "input_ids": [1], "loss_mask": [1]}', "id", "string or integer"),
])
def test_bad_records_name_the_file_line_and_field(raw, field, words):
    with pytest.raises(DataError) as info:
        decode_record(raw, P, 7)
    assert f"{P}:7" in str(info.value) and field in str(info.value) and words in str(info.value)


def test_malformed_json_names_the_line():
    with pytest.raises(DataError, match=rf"{P}:3.*malformed JSON"):
        decode_record(b'{"id": "a", "input_ids": [1,', P, 3)


def test_scan_profiles_counts_and_routes(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"".join([
        _line(id="keep", input_ids=[1, 2, 3], loss_mask=[0, 1, 1]),
        _line(id="long", input_ids=list(range(10)), loss_mask=[0] * 5 + [1] * 5),
        _line(id="long-unsupervised-head", input_ids=list(range(10)), loss_mask=[0] * 8 + [1] * 2),
        _line(id="none", input_ids=[1, 2], loss_mask=[0, 0]),
        _line(input_ids=[4, 5], loss_mask=[1, 1]),  # no id: rebuilt with <dataset>-<line>
        b"\n",
    ]))
    profile_only = scan_file(ScanTask(0, "d", str(path), route=False))
    assert profile_only.error is None and profile_only.truncated == 0
    assert (profile_only.profile.samples, profile_only.profile.tokens) == (5, 27)
    (tmp_path / "b").mkdir()
    routed = scan_file(ScanTask(0, "d", str(path), route=True, bucket_dir=str(tmp_path / "b"),
                                max_seq_len=6))
    assert routed.error is None and routed.sha256 == profile_only.sha256
    assert (routed.truncated, routed.dropped_after_truncation, routed.dropped_unsupervised) == (2, 1, 2)
    assert routed.rewritten == 2  # the truncated one and the one without an id
    out = routed.out["train"]
    assert (out["records"], out["tokens"], out["supervised_tokens"]) == (3, 3 + 6 + 2, 2 + 1 + 2)
    assert routed.out["eval"]["records"] == 0


def test_scan_returns_a_bad_record_instead_of_raising(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(_line(id="a", input_ids=[1], loss_mask=[1]) + b'{"id": "b"}\n')
    result = scan_file(ScanTask(0, "d", str(path), route=False))
    assert result.error["line"] == 2 and result.error["field"] == "input_ids"
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    assert "no records" in scan_file(ScanTask(1, "e", str(empty), route=False)).error["error"]


def test_render_splices_the_dataset_or_rebuilds_the_line():
    raw = _line(id="a", input_ids=[1, 2, 3], loss_mask=[0, 1, 1])
    kept = b"".join(render(raw.rstrip(b"\n"), KEEP, dataset="ds", lineno=1, max_seq_len=8, path=P))
    assert json.loads(kept) == {"id": "a", "input_ids": [1, 2, 3], "loss_mask": [0, 1, 1],
                                "dataset": "ds"}
    cut = b"".join(render(_line(input_ids=list(range(10)), loss_mask=[1] * 10), REWRITE,
                          dataset="ds", lineno=4, max_seq_len=3, path=P))
    assert json.loads(cut) == {"id": "ds-4", "input_ids": [0, 1, 2], "loss_mask": [1, 1, 1],
                               "dataset": "ds"}
    with pytest.raises(DataError, match="changed while the merge was running"):
        render(b'{"id": "a", "input_ids": [1', KEEP, dataset="ds", lineno=1, max_seq_len=8,
               path=P)
