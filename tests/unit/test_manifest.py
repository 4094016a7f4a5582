from eyas.manifest import is_up_to_date, read_manifest, verify_manifest, write_manifest


def _make(tmp_path, config=None):
    src = tmp_path / "in.jsonl"
    src.write_text('{"x": 1}\n')
    out = tmp_path / "out"
    out.mkdir()
    (out / "data.jsonl").write_text('{"y": 2}\n')
    write_manifest(out, phase="t", inputs={"in": src}, outputs=["data.jsonl"], config=config or {"k": 1},
                   counts={"n": 1})
    return src, out


def test_manifest_verifies_and_detects_corruption(tmp_path):
    _, out = _make(tmp_path)
    assert verify_manifest(out) == []
    assert read_manifest(out)["counts"] == {"n": 1}
    (out / "data.jsonl").write_text('{"y": 3}\n')  # same size, other bytes
    assert "checksum" in verify_manifest(out)[0]
    (out / "data.jsonl").write_text("")
    assert "bytes" in verify_manifest(out)[0]
    (out / "data.jsonl").unlink()
    assert "missing" in verify_manifest(out)[0]


def test_folder_without_manifest_is_partial(tmp_path):
    assert "no manifest.json" in verify_manifest(tmp_path)[0]


def test_up_to_date_tracks_inputs_config_and_outputs(tmp_path):
    src, out = _make(tmp_path)
    assert is_up_to_date(out, {"in": src}, {"k": 1})
    assert not is_up_to_date(out, {"in": src}, {"k": 2})
    src.write_text('{"x": 2}\n')
    assert not is_up_to_date(out, {"in": src}, {"k": 1})


def test_a_manifest_input_counts_by_what_was_made_not_when_or_where(tmp_path):
    """The same output made again, in another folder and later, has the same identity (so a
    drafter trained from it stays valid); other bytes in an output change it."""
    import json

    from eyas.manifest import input_hashes, manifest_identity

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (_, a), (_, b) = _make(tmp_path / "a"), _make(tmp_path / "b")
    ma, mb = a / "manifest.json", b / "manifest.json"
    record = json.loads(mb.read_text())
    record["created"], record["code_version"] = "2030-01-01T00:00:00+00:00", "9.9.9"
    mb.write_text(json.dumps(record))
    assert ma.read_bytes() != mb.read_bytes()
    assert manifest_identity(ma) == manifest_identity(mb)
    assert input_hashes({"x": ma}) == input_hashes({"x": mb})
    record["outputs"]["data.jsonl"]["sha256"] = "0" * 64
    mb.write_text(json.dumps(record))
    assert manifest_identity(ma) != manifest_identity(mb)
