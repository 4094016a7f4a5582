"""Check 4 on the tiny target with the HF backend: a few merged samples through the capture
path, read back and compared with transformers' own hidden states; a missing target fails
naming the fix."""

from pathlib import Path

from eyas.extract.config import ExtractConfig
from eyas.preflight.capture import check_capture
from eyas.preflight.result import bounded
from eyas.train.tiny_data import tiny_records, write_jsonl


def test_a_missing_target_folder_fails_naming_the_fix(tmp_path):
    merged = write_jsonl(tmp_path / "merged.jsonl", [{"id": "a", "input_ids": [1, 2],
                                                      "loss_mask": [0, 1]}])
    r = bounded("capture", lambda: check_capture(
        merged=merged, work=tmp_path / "pf", model_dir=tmp_path / "no-such-target",
        cfg=ExtractConfig(device="cpu"), samples=8, total_tokens=2), 30)
    assert not r.ok and f"target folder {tmp_path / 'no-such-target'} does not exist" in r.detail
    assert "set target.model" in r.fix


def test_samples_go_through_the_capture_path_and_match_the_target(tmp_path, tiny_target: Path):
    merged = write_jsonl(tmp_path / "merged.jsonl", tiny_records(tiny_target, 3))
    r = check_capture(merged=merged, work=tmp_path / "pf", model_dir=tiny_target,
                      cfg=ExtractConfig(device="cpu"), samples=2, total_tokens=10_000)
    assert r.ok, r.detail
    assert "2 samples" in r.detail and "rows line up, values finite" in r.detail
    assert "equal to transformers' own hidden states" in r.detail
    assert r.data["tok_s"] > 0 and r.data["extract_s"] == 10_000 / r.data["tok_s"]
    # One shard a sample: the first (the engine's start) is left out of the speed.
    assert sorted(p.name for p in (tmp_path / "pf" / "hidden" / "train").glob("shard-*")) == [
        "shard-00000", "shard-00001"]
    assert "then" in r.detail and "one sample at a time" in r.detail
    assert "engine memory headroom not measured" in r.partial
