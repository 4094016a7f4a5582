"""Phase 3 (merge and shuffle) on small real files: selection, truncation, shuffle, atomicity."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from eyas.config import MergeConfig
from eyas.errors import ConfigError, DataError, EyasError
from eyas.io import sha256_file
from eyas.manifest import read_manifest, verify_manifest
from eyas.prepare.merge import OUTPUT_FILES, dataset_profile, merge_datasets


def _record(rng: random.Random, sid: str, length: int, prompt: int) -> dict:
    return {
        "id": sid,
        "input_ids": [rng.randrange(50_000) for _ in range(length)],
        "loss_mask": [0] * prompt + [1] * (length - prompt),
    }


def _write(path: Path, records: list[dict], *, spaced: bool = False) -> Path:
    """One JSONL file; `spaced` writes like stdlib json.dumps (", " separators)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sep = (", ", ": ") if spaced else (",", ":")
    path.write_text("".join(json.dumps(r, separators=sep) + "\n" for r in records))
    return path


def _datasets(root: Path, sizes: dict[str, tuple[int, int]], seed: int = 0) -> dict[str, Path]:
    """name -> (samples, length) datasets under root/prepared/<name>/tokenized_data.jsonl."""
    out = {}
    for i, (name, (samples, length)) in enumerate(sizes.items()):
        rng = random.Random(seed * 1000 + i)
        recs = [_record(rng, f"{name}-{j}", length + rng.randrange(length // 2 + 1), 2)
                for j in range(samples)]
        out[name] = _write(root / "prepared" / name / "tokenized_data.jsonl", recs,
                           spaced=i % 2 == 1)
    return out


SIZES = {"A1_long": (8, 600), "B1": (60, 40), "B2": (50, 60), "B3": (40, 30)}


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    return _datasets(tmp_path, SIZES)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _ids(out: Path) -> list[str]:
    return [r["id"] for r in _lines(out / "train.jsonl") + _lines(out / "eval.jsonl")]


def _input_ids(paths: list[Path]) -> list[str]:
    return [r["id"] for p in paths for r in _lines(p)]


def test_same_inputs_and_config_give_identical_files_whatever_buckets_or_workers(
    tmp_path: Path, inputs: dict[str, Path]
) -> None:
    cfg = MergeConfig(max_seq_len=512, eval_fraction=0.1, seed=7)
    merge_datasets(inputs, tmp_path / "a", cfg, workers=1)
    merge_datasets(inputs, tmp_path / "b", cfg, workers=2, buckets=13)
    merge_datasets(inputs, tmp_path / "c", cfg, workers=1, buckets=1)
    for name in ("train.jsonl", "eval.jsonl", "stats.json"):
        a = (tmp_path / "a" / name).read_bytes()
        assert a == (tmp_path / "b" / name).read_bytes(), name
        assert a == (tmp_path / "c" / name).read_bytes(), name
    assert verify_manifest(tmp_path / "a") == []


def test_a_different_seed_shuffles_differently(tmp_path: Path, inputs: dict[str, Path]) -> None:
    merge_datasets(inputs, tmp_path / "s1", MergeConfig(seed=1, eval_fraction=0.0), workers=1)
    merge_datasets(inputs, tmp_path / "s2", MergeConfig(seed=2, eval_fraction=0.0), workers=1)
    one, two = _ids(tmp_path / "s1"), _ids(tmp_path / "s2")
    assert sorted(one) == sorted(two)
    assert one != two
    # shuffled: not grouped by dataset in file order
    assert one != _input_ids(list(inputs.values()))


def test_every_selected_record_appears_exactly_once_across_train_and_eval(
    tmp_path: Path, inputs: dict[str, Path]
) -> None:
    stats = merge_datasets(inputs, tmp_path / "m", MergeConfig(eval_fraction=0.2), workers=1)
    train, evals = _lines(tmp_path / "m" / "train.jsonl"), _lines(tmp_path / "m" / "eval.jsonl")
    got = [r["id"] for r in train + evals]
    assert len(got) == len(set(got))
    assert sorted(got) == sorted(_input_ids(list(inputs.values())))
    assert 0 < len(evals) < len(train)
    assert stats["train"]["records"] == len(train) and stats["eval"]["records"] == len(evals)
    for r in train + evals:
        assert set(r) == {"id", "input_ids", "loss_mask", "dataset"}
        assert r["id"].startswith(r["dataset"] + "-")
        assert len(r["input_ids"]) == len(r["loss_mask"])


def test_eval_membership_depends_on_seed_and_id_not_on_other_datasets(
    tmp_path: Path, inputs: dict[str, Path]
) -> None:
    cfg = MergeConfig(eval_fraction=0.3, exclude=["B3"])
    merge_datasets(inputs, tmp_path / "all", MergeConfig(eval_fraction=0.3), workers=1)
    merge_datasets(inputs, tmp_path / "some", cfg, workers=1)
    eval_all = {r["id"] for r in _lines(tmp_path / "all" / "eval.jsonl")}
    eval_some = {r["id"] for r in _lines(tmp_path / "some" / "eval.jsonl")}
    assert eval_some == {i for i in eval_all if not i.startswith("B3-")}


def test_exclude_and_include_are_honoured_and_reported(
    tmp_path: Path, inputs: dict[str, Path]
) -> None:
    stats = merge_datasets(inputs, tmp_path / "x", MergeConfig(exclude=["B2"]), workers=1)
    assert not any(i.startswith("B2-") for i in _ids(tmp_path / "x"))
    assert stats["excluded"] == {"B2": "exclude"}
    assert stats["datasets"]["B2"]["selected"] is False
    assert stats["datasets"]["B2"]["before"]["samples"] == 50  # still profiled

    stats = merge_datasets(inputs, tmp_path / "i", MergeConfig(include=["B1", "B3"]), workers=1)
    assert {i.split("-")[0] for i in _ids(tmp_path / "i")} == {"B1", "B3"}
    assert stats["excluded"] == {"A1_long": "not in include", "B2": "not in include"}
    assert stats["selected"] == ["B1", "B3"]


def test_unknown_dataset_names_and_empty_selection_are_config_errors(
    tmp_path: Path, inputs: dict[str, Path]
) -> None:
    with pytest.raises(ConfigError, match="merge.exclude.*'B9'"):
        merge_datasets(inputs, tmp_path / "m", MergeConfig(exclude=["B9"]))
    with pytest.raises(ConfigError, match="selects no dataset"):
        merge_datasets(inputs, tmp_path / "m", MergeConfig(include=["B1"], exclude=["B1"]))
    assert not (tmp_path / "m").exists()


def test_outlier_like_a1_is_flagged_with_reasons_but_kept_unless_excluded(
    tmp_path: Path, inputs: dict[str, Path]
) -> None:
    stats = merge_datasets(inputs, tmp_path / "m", MergeConfig(max_seq_len=4096), workers=1)
    (outlier,) = stats["outliers"]
    assert outlier["dataset"] == "A1_long"
    assert outlier["excluded"] is False
    assert set(outlier["checks"]) == {"token_share", "mean_len"}
    assert any("of tokens from" in r and "outlier_token_share_ratio" in r
               for r in outlier["reasons"])
    assert outlier["sample_share"] < 0.1 < outlier["token_share"]
    assert sum(i.startswith("A1_long-") for i in _ids(tmp_path / "m")) == 8

    stats = merge_datasets(inputs, tmp_path / "m", MergeConfig(exclude=["A1_long"]), workers=1)
    assert stats["outliers"][0]["excluded"] is True
    assert not any(i.startswith("A1_long-") for i in _ids(tmp_path / "m"))


def test_truncation_cuts_both_arrays_keeps_mask_values_and_counts_drops(tmp_path: Path) -> None:
    recs = [
        {"id": "long", "input_ids": list(range(100, 110)), "loss_mask": [0, 0, 1, 1, 0, 1, 1, 1, 1, 1],
         "extra": "dropped field"},
        {"id": "late", "input_ids": list(range(10)), "loss_mask": [0] * 7 + [1] * 3},
        {"id": "none", "input_ids": [1, 2, 3], "loss_mask": [0, 0, 0]},
        {"id": "short", "input_ids": [5, 6], "loss_mask": [0, 1]},
        {"id": "exact", "input_ids": [1] * 6, "loss_mask": [1] * 6, "dataset": "spoofed"},
    ]
    src = _write(tmp_path / "d" / "tokenized_data.jsonl", recs, spaced=True)
    stats = merge_datasets({"d": src}, tmp_path / "m", MergeConfig(max_seq_len=6, eval_fraction=0))
    by_id = {r["id"]: r for r in _lines(tmp_path / "m" / "train.jsonl")}
    assert set(by_id) == {"long", "short", "exact"}
    assert by_id["long"] == {"id": "long", "input_ids": list(range(100, 106)),
                             "loss_mask": [0, 0, 1, 1, 0, 1], "dataset": "d"}
    assert by_id["exact"]["dataset"] == "d"
    assert stats["truncated"] == 2  # long, late
    assert stats["dropped_unsupervised"] == 2  # late (after the cut), none
    assert stats["dropped_after_truncation"] == 1
    assert stats["tokens"] == 6 + 2 + 6
    assert stats["supervised_tokens"] == 3 + 1 + 6
    assert stats["datasets"]["d"]["before"]["tokens"] == 10 + 10 + 3 + 2 + 6


@pytest.mark.parametrize(
    ("line", "field", "expect"),
    [
        ('{"id": "x", "input_ids": [1, 2], "loss_mask": [1, 1]', None, "malformed JSON"),
        ('{"id": "x", "loss_mask": [1]}', "input_ids", "missing"),
        ('{"id": "x", "input_ids": [1]}', "loss_mask", "missing"),
        ('{"id": "x", "input_ids": [1, 2], "loss_mask": [1]}', "loss_mask", "1 entries but input_ids has 2"),
        ('{"id": "x", "input_ids": [1, 2], "loss_mask": [1, 2]}', "loss_mask", "0 and 1"),
        ('{"id": "x", "input_ids": [1, 2], "loss_mask": [1, 10]}', "loss_mask", "0 and 1"),
        ('{"id": "x", "input_ids": [[1], [2]], "loss_mask": [[1], [0]]}', "input_ids", "integers"),
        ('{"id": "x", "input_ids": [1, "2"], "loss_mask": [1, 1]}', "input_ids", "integers"),
        ('{"id": "x", "input_ids": [1, -2], "loss_mask": [1, 1]}', "input_ids", "integers"),
        ('{"id": "x", "input_ids": [1.5], "loss_mask": [1]}', "input_ids", "integers"),
        ('{"id": "x", "input_ids": [], "loss_mask": []}', "input_ids", "empty"),
        ('{"id": "x", "input_ids": "1 2", "loss_mask": [1]}', "input_ids", "got a string"),
        ('{"id": {"a": 1}, "input_ids": [1], "loss_mask": [1]}', "id", "string or integer"),
        ('[1, 2, 3]', None, "JSON object"),
    ],
)
def test_bad_records_name_file_line_and_field(
    tmp_path: Path, inputs: dict[str, Path], line: str, field: str | None, expect: str
) -> None:
    bad = tmp_path / "prepared" / "B9" / "tokenized_data.jsonl"
    bad.parent.mkdir(parents=True)
    good = '{"id": "ok", "input_ids": [1, 2], "loss_mask": [0, 1]}\n'
    bad.write_text(good + "\n" + good + line + "\n")
    with pytest.raises(DataError) as info:
        merge_datasets({**inputs, "B9": bad}, tmp_path / "m", MergeConfig(), workers=1)
    err = info.value
    assert (err.path, err.line, err.field) == (str(bad), 4, field)
    assert expect in str(err)
    assert str(err).startswith(f"{bad}:4: ")
    assert not (tmp_path / "m").exists()


def test_missing_or_empty_selected_file_is_a_data_error(tmp_path: Path, inputs: dict[str, Path]) -> None:
    with pytest.raises(DataError, match="file not found"):
        merge_datasets({**inputs, "B9": tmp_path / "nope.jsonl"}, tmp_path / "m", MergeConfig())
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match="no records"):
        merge_datasets({**inputs, "B9": empty}, tmp_path / "m", MergeConfig(), workers=1)


def test_a_broken_excluded_dataset_is_reported_not_fatal(tmp_path: Path, inputs: dict[str, Path]) -> None:
    bad = _write(tmp_path / "bad.jsonl", [{"id": "x", "input_ids": [1]}])
    stats = merge_datasets({**inputs, "B9": bad}, tmp_path / "m", MergeConfig(exclude=["B9"]),
                           workers=2)  # its scan overlaps pass 2
    assert stats["datasets"]["B9"]["scan_error"]["field"] == "loss_mask"
    assert stats["datasets"]["B9"]["before"] is None


def test_an_interrupted_merge_leaves_the_previous_output_intact(
    tmp_path: Path, inputs: dict[str, Path]
) -> None:
    out = tmp_path / "merged"
    merge_datasets(inputs, out, MergeConfig(), workers=1)
    before = {name: (out / name).read_bytes() for name in OUTPUT_FILES}
    # a bad record at the very end of the last file: fails after everything else was routed
    last = list(inputs.values())[-1]
    with open(last, "a") as fh:
        fh.write('{"id": "late", "input_ids": [1, 2, 3], "loss_mask": [1, 1]}\n')
    with pytest.raises(DataError, match="loss_mask"):
        merge_datasets(inputs, out, MergeConfig(seed=5), workers=2)
    assert {name: (out / name).read_bytes() for name in OUTPUT_FILES} == before
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUT_FILES)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged", "prepared"]
    assert verify_manifest(out) == []


def test_rerun_replaces_output_and_manifest_records_every_input(
    tmp_path: Path, inputs: dict[str, Path]
) -> None:
    out = tmp_path / "merged"
    merge_datasets(inputs, out, MergeConfig(seed=1), workers=1)
    cfg = MergeConfig(seed=2, exclude=["B1"])
    stats = merge_datasets(inputs, out, cfg, workers=1)
    assert verify_manifest(out) == []
    manifest = read_manifest(out)
    assert manifest["phase"] == "merge"
    assert manifest["config"] == cfg.model_dump(mode="json")
    assert {k: v["sha256"] for k, v in manifest["inputs"].items()} == {
        k: sha256_file(p) for k, p in inputs.items()
    }
    assert manifest["counts"]["records"] == stats["records"]
    assert json.loads((out / "stats.json").read_text()) == stats


def test_foreign_files_in_out_dir_stop_the_merge(tmp_path: Path, inputs: dict[str, Path]) -> None:
    out = tmp_path / "merged"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(EyasError, match="notes.txt"):
        merge_datasets(inputs, out, MergeConfig(), workers=1)
    assert (out / "notes.txt").read_text() == "mine"


def test_staging_folders_of_dead_merges_are_removed(tmp_path: Path, inputs: dict[str, Path]) -> None:
    # pid 2**22 + 1 is above Linux's pid_max ceiling, so it can belong to no live process
    stale = tmp_path / f".tmp-merge-merged-{2**22 + 1}-abcd1234"
    (stale / "buckets").mkdir(parents=True)
    merge_datasets(inputs, tmp_path / "merged", MergeConfig(), workers=1)
    assert not stale.exists()


def test_tiny_memory_budget_many_buckets_gives_the_same_valid_permutation(
    tmp_path: Path, inputs: dict[str, Path]
) -> None:
    cfg = MergeConfig(memory_budget_mb=16, eval_fraction=0.05)
    merge_datasets(inputs, tmp_path / "one", cfg, workers=1, buckets=1)
    merge_datasets(inputs, tmp_path / "many", cfg, workers=1, buckets=200)
    assert (tmp_path / "many" / "train.jsonl").read_bytes() == (
        tmp_path / "one" / "train.jsonl").read_bytes()
    got = _ids(tmp_path / "many")
    assert sorted(got) == sorted(_input_ids(list(inputs.values())))


def test_dataset_profile_counts_before_truncation(tmp_path: Path) -> None:
    src = _write(tmp_path / "d.jsonl", [
        {"id": 1, "input_ids": [1, 2, 3, 4], "loss_mask": [0, 1, 1, 1]},
        {"id": 2, "input_ids": [7], "loss_mask": [0]},
    ])
    p = dataset_profile(src)
    assert (p.samples, p.tokens, p.supervised_tokens, p.max_len, p.mean_len) == (2, 5, 3, 4, 2.5)
    broken = _write(tmp_path / "e.jsonl", [{"id": 1, "input_ids": [1], "loss_mask": [3]}])
    with pytest.raises(DataError) as info:
        dataset_profile(broken)
    assert (info.value.line, info.value.field) == (1, "loss_mask")


def test_missing_ids_odd_line_endings_and_extra_fields_still_give_valid_lines(tmp_path: Path) -> None:
    src = tmp_path / "d" / "tokenized_data.jsonl"
    src.parent.mkdir()
    src.write_bytes(
        b'{"input_ids": [1, 2], "loss_mask": [0, 1]}\r\n'  # no id, CRLF
        b'{"id": 7, "input_ids":[3,4],"loss_mask":[1,1]}   \n'  # int id, trailing blanks
        b'\n'
        b'{"id": "x", "input_ids": [5], "loss_mask": [1], "text": "{\\"a\\": 1}"}\n'
        b'{"id": "last", "input_ids": [6], "loss_mask": [1]}'  # no final newline
    )
    merge_datasets({"d": src}, tmp_path / "m", MergeConfig(eval_fraction=0), workers=1)
    rows = {r["id"]: r for r in _lines(tmp_path / "m" / "train.jsonl")}
    assert rows == {
        "d-1": {"id": "d-1", "input_ids": [1, 2], "loss_mask": [0, 1], "dataset": "d"},
        7: {"id": 7, "input_ids": [3, 4], "loss_mask": [1, 1], "dataset": "d"},
        "x": {"id": "x", "input_ids": [5], "loss_mask": [1], "dataset": "d"},
        "last": {"id": "last", "input_ids": [6], "loss_mask": [1], "dataset": "d"},
    }


def test_disk_full_while_writing_is_one_clear_error_naming_the_folder_injected(
        tmp_path: Path, inputs: dict[str, Path], monkeypatch) -> None:
    """ENOSPC (injected into the writes of pass 2: a full volume cannot be made here) ends the
    merge with one error that names the output folder and the free space, not a traceback;
    the staging folder is gone and the output folder is as it was."""
    import errno

    import eyas.prepare.merge as merge

    def full(fd, pieces):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(merge, "_writev_all", full)
    out = tmp_path / "m"
    with pytest.raises(EyasError, match=r"no space left on the device of .*m.*free") as err:
        merge_datasets(inputs, out, MergeConfig(), workers=1)
    assert str(out) in str(err.value) and err.value.__cause__ is None
    assert not out.exists() and not list(tmp_path.glob(".tmp-merge-*"))


def test_small_inputs_are_scanned_in_this_process_large_ones_by_workers(monkeypatch):
    """Below `PROCESS_MIN_BYTES` of input the merge starts no worker process (one would cost
    more than the scan); above it, one per input up to the usable cores."""
    from eyas.prepare import merge

    monkeypatch.setattr(merge.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert merge._default_workers(3, merge.PROCESS_MIN_BYTES - 1) == 1
    assert merge._default_workers(3, merge.PROCESS_MIN_BYTES) == 3
    assert merge._default_workers(8, 10 * merge.PROCESS_MIN_BYTES) == 4
