import json

import pytest
import torch
from support.extract_fixtures import build_llama, llama8, write_merged  # noqa: F401

from eyas.errors import ConfigError, DataError
from eyas.extract.config import ExtractConfig
from eyas.extract.plan import DiskSpaceError, bytes_per_token, check_disk, specforge_bytes_per_token
from eyas.extract.run import SUMMARY_NAME, extract, main
from eyas.extract.shards import extract_shard, plan_shards
from eyas.extract.store import DATA_NAME, iter_samples, list_shards, read_shard_manifest
from eyas.extract.target import (
    load_target_embeddings,
    load_target_lm_head,
    target_fingerprint,
)

CFG = ExtractConfig(shard_size=4, batch_tokens=256, device="cpu")


@pytest.fixture
def merged(tmp_path):
    return write_merged(tmp_path / "merged" / "train.jsonl", 10)


def test_plan_is_deterministic_and_covers_every_record(merged):
    a, b = plan_shards(merged, CFG), plan_shards(merged, CFG)
    assert a == b
    assert [(s.start, s.stop) for s in a] == [(0, 4), (4, 8), (8, 10)]
    assert sum(s.num_samples for s in a) == 10


def test_malformed_record_names_file_and_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"id": "a", "input_ids": [1, 2], "loss_mask": [0, 1]}\n'
                    '{"id": "b", "input_ids": [1, 2], "loss_mask": [1]}\n')
    with pytest.raises(DataError, match=r"m.jsonl:2: field 'loss_mask'"):
        plan_shards(path, CFG)


def test_extract_resume_and_corruption(merged, llama8, tmp_path):  # noqa: F811
    out = tmp_path / "hidden" / "train"
    summary = extract(merged, out, model_dir=llama8, cfg=CFG)
    assert (summary["extracted"], summary["skipped"], summary["samples"]) == (3, 0, 10)
    assert json.loads((out / SUMMARY_NAME).read_text())["actual_bytes"] == summary["actual_bytes"]
    assert 0.95 < summary["actual_over_estimate"] < 1.05
    shards = list_shards(out)
    assert [p.name for p in shards] == ["shard-00000", "shard-00001", "shard-00002"]
    m = read_shard_manifest(shards[0])
    assert m["aux_layers"] == [1, 3, 4] and m["hidden_size"] == 64
    assert m["target_fingerprint"] == target_fingerprint(llama8)
    sample = next(iter_samples(shards[0]))
    assert sample["aux_hidden"].shape[1] == 192 and sample["final_hidden"].shape[1] == 64

    # rerun: everything verifies, nothing is extracted again
    again = extract(merged, out, model_dir=llama8, cfg=CFG)
    assert (again["extracted"], again["skipped"]) == (0, 3)

    # corrupt shard 1: detected by checksum, extracted again, identical to the first time
    data = out / "shard-00001" / DATA_NAME
    good = data.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x01
    data.write_bytes(bytes(bad))
    third = extract(merged, out, model_dir=llama8, cfg=CFG)
    states = {r["shard"]: (r["status"], r["previous"]) for r in third["shards"]}
    assert states["shard-00001"] == ("extracted", "corrupt")
    assert states["shard-00000"] == ("skipped", "complete")
    assert data.read_bytes() == good  # deterministic extraction


def test_only_selected_shards_and_stale_settings(merged, llama8, tmp_path):  # noqa: F811
    out = tmp_path / "h"
    s = extract(merged, out, model_dir=llama8, cfg=CFG, shards=[2])
    assert [r["shard"] for r in s["shards"]] == ["shard-00002"]
    topk = CFG.model_copy(update={"storage": "topk", "topk": 4})
    (spec,) = [x for x in plan_shards(merged, topk) if x.index == 2]
    r = extract_shard(spec, llama8, out, topk)
    assert (r["status"], r["previous"]) == ("extracted", "stale")
    assert read_shard_manifest(out / "shard-00002")["storage"] == "topk"
    with pytest.raises(ConfigError, match="shard"):
        extract(merged, out, model_dir=llama8, cfg=CFG, shards=[7])


def test_disk_refusal_before_any_work(merged, llama8, tmp_path):  # noqa: F811
    out = tmp_path / "h"
    with pytest.raises(DiskSpaceError, match="extraction needs .*, but only"):
        extract(merged, out, model_dir=llama8, cfg=CFG, free_bytes=1000)
    assert list_shards(out) == []
    with pytest.raises(DiskSpaceError, match="10% margin"):
        check_disk(tmp_path, 1000, 0.10, free=1050)
    assert check_disk(tmp_path, 1000, 0.10, free=1100) == 1100


def test_bytes_per_token_figures():
    assert specforge_bytes_per_token(7168) == 57344
    assert bytes_per_token(7168, "final") == 8 * 7168 + 5
    assert bytes_per_token(7168, "topk", topk=32) == 6 * 7168 + 6 * 32 + 5


def test_contradicting_depth_refused_up_front(merged, llama8, tmp_path):  # noqa: F811
    cfg = CFG.model_copy(update={"aux_layers": [2, 30, 58]})
    with pytest.raises(ConfigError, match="layer 30 does not exist.*8 decoder layers"):
        extract(merged, tmp_path / "h", model_dir=llama8, cfg=cfg)
    assert not (tmp_path / "h").exists()


def test_other_hidden_size_in_same_output_refused(merged, llama8, tmp_path):  # noqa: F811
    out = tmp_path / "h"
    extract(merged, out, model_dir=llama8, cfg=CFG, shards=[0])
    wide = build_llama(tmp_path / "wide", hidden=128)
    with pytest.raises(ConfigError, match="hidden size 128.*hidden size 64"):
        extract(merged, out, model_dir=wide, cfg=CFG)


def test_target_head_tensors_read_alone(llama8, tmp_path):  # noqa: F811
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(llama8)
    assert torch.equal(load_target_embeddings(llama8), model.model.embed_tokens.weight)
    assert torch.equal(load_target_lm_head(llama8), model.lm_head.weight)
    tied = build_llama(tmp_path / "tied", tied=True, layers=3)
    assert torch.equal(load_target_lm_head(tied), load_target_embeddings(tied))


def test_cli_runs(merged, llama8, tmp_path, capsys):  # noqa: F811
    rc = main(["--merged", str(merged), "--out", str(tmp_path / "o"), "--model", str(llama8),
               "--storage", "topk", "--topk", "4", "--shard-size", "5", "--device", "cpu"])
    assert rc == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["num_shards"] == 2 and line["storage"] == "topk"


@pytest.mark.slow
def test_tiny_target_extraction(tiny_target, tmp_path):
    merged = write_merged(tmp_path / "m.jsonl", 6, vocab=200)
    s = extract(merged, tmp_path / "h", model_dir=tiny_target, cfg=CFG)
    assert s["samples"] == 6 and s["hidden_size"] == 256
    assert s["aux_layers"] == [0, 1, 2]  # 4-layer target: the small-depth default


def test_plan_mode_and_config_json(merged, llama8, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "o"
    cfg = CFG.model_copy(update={"storage": "compact", "topk": 4, "shard_size": 5})
    base = ["--merged", str(merged), "--out", str(out), "--model", str(llama8),
            "--config-json", cfg.model_dump_json()]
    assert main([*base, "--plan"]) == 0
    plan = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert plan["todo"] == [0, 1] and plan["storage"] == "compact" and plan["free_bytes"] > 0
    assert plan["needed_bytes"] == plan["estimated_bytes"] > 0
    assert not out.exists()  # planning writes nothing
    assert main([*base, "--shards", "1"]) == 0
    done = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(r["shard"], r["status"]) for r in done["shards"]] == [("shard-00001", "extracted")]
    assert read_shard_manifest(out / "shard-00001")["storage"] == "compact"
    assert main([*base, "--plan"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["todo"] == [0]


def test_one_process_many_shards_reports_each_and_keeps_going(merged, llama8, tmp_path,  # noqa: F811
                                                                capsys):
    """What an engine job runs: ``--shards a,b,c --keep-going`` prints one event per shard as
    it ends, goes on past a failed shard, exits 1; the plan then names only that shard."""
    from eyas.extract.run import SHARD_DONE, SHARD_FAILED, command, shards_of_command
    from eyas.io import dumps_line, iter_jsonl

    records = [o for _, o in iter_jsonl(merged)]
    records[5]["input_ids"][0] = 10_000  # shard 1 (records 4-7): no embedding for it
    merged.write_bytes(b"".join(dumps_line(r) for r in records))
    out = tmp_path / "o"
    base = ["--merged", str(merged), "--out", str(out), "--model", str(llama8),
            "--config-json", CFG.model_dump_json()]
    assert main([*base, "--shards", "0,1,2", "--keep-going"]) == 1
    lines = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    events = [(e["event"], e["index"]) for e in lines if "event" in e]
    assert events == [(SHARD_DONE, 0), (SHARD_FAILED, 1), (SHARD_DONE, 2)]
    failed = next(e for e in lines if e.get("event") == SHARD_FAILED)
    assert failed["shard"] == "shard-00001" and "index" in failed["error"].lower()
    assert lines[0]["status"] == "extracted" and lines[0]["samples"] == 4
    summary = lines[-1]
    assert summary["failed"] == 1 and summary["extracted"] == 2
    assert [p.name for p in list_shards(out)] == ["shard-00000", "shard-00002"]
    # Without --keep-going the first failure ends the run (after its event).
    with pytest.raises(IndexError):
        main([*base, "--shards", "1,2"])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["event"] == SHARD_FAILED
    # A configuration error stops a keep-going run at once: every shard would meet it.
    bad = CFG.model_copy(update={"aux_layers": [0, 1, 99]})
    with pytest.raises(ConfigError):
        extract(merged, tmp_path / "p", model_dir=llama8, cfg=bad, keep_going=True)
    cmd = command("/venv/bin/python", merged="/m", out="/o", model="/t", cfg=CFG,
                  shards=[3, 7, 11], keep_going=True)
    assert cmd.endswith("--shards 3,7,11 --keep-going") and shards_of_command(cmd) == [3, 7, 11]
    assert shards_of_command(command("p", merged="/m", out="/o", model="/t", cfg=CFG)) is None
    plan = json.loads(_plan_line(base, capsys))
    assert plan["todo"] == [1] and sorted(plan["complete"]) == ["0", "2"]
    assert plan["complete"]["0"]["status"] == "skipped" and plan["complete"]["0"]["bytes"] > 0


def _plan_line(base, capsys) -> str:
    assert main([*base, "--plan"]) == 0
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_a_stop_request_ends_the_extraction_at_a_shard_boundary(merged, llama8, tmp_path):  # noqa: F811
    """SIGTERM / Ctrl-C (`eyas.stopping`) during shard 0: it is finished and kept, no other
    starts; a rerun does the rest."""
    import signal

    from eyas import stopping

    out = tmp_path / "h"
    done: list[int] = []

    def stop_after_the_first(record: dict) -> None:
        done.append(record["index"])
        stopping.request(signal.SIGTERM)  # as the handler, or its watcher, does

    try:
        with pytest.raises(stopping.StopRequested, match="extraction stopped before shard-"):
            extract(merged, out, model_dir=llama8, cfg=CFG, on_shard=stop_after_the_first)
    finally:
        stopping.reset()
    assert done == [0] and [s.name for s in list_shards(out)] == ["shard-00000"]
    again = extract(merged, out, model_dir=llama8, cfg=CFG)
    assert again["skipped"] == 1 and again["extracted"] == len(list_shards(out)) - 1


def test_a_changed_mask_or_token_re_extracts_exactly_the_shards_it_touches(merged, llama8,  # noqa: F811
                                                                            tmp_path):
    """A shard's identity covers its records' token ids and loss masks, not only their ids
    and lengths: a merge that changes one mask (shard 0) and one token (shard 2), lengths
    kept, makes those two shards stale; shard 1 is kept, and the redone shard 2 holds the
    new token's states (the same as a fresh extraction's)."""
    from eyas.io import dumps_line, iter_jsonl

    out = tmp_path / "hidden" / "train"
    extract(merged, out, model_dir=llama8, cfg=CFG)
    kept = (out / "shard-00001" / DATA_NAME).read_bytes()
    manifests = {n: (out / n / "manifest.json").read_bytes()
                 for n in ("shard-00000", "shard-00001", "shard-00002")}
    records = [o for _, o in iter_jsonl(merged)]
    records[1]["loss_mask"] = [1 - m for m in records[1]["loss_mask"]]
    records[9]["input_ids"][0] = records[9]["input_ids"][0] % 250 + 1
    merged.write_bytes(b"".join(dumps_line(r) for r in records))
    again = extract(merged, out, model_dir=llama8, cfg=CFG)
    states = {r["shard"]: (r["status"], r["previous"]) for r in again["shards"]}
    assert states == {"shard-00000": ("extracted", "stale"), "shard-00001": ("skipped", "complete"),
                      "shard-00002": ("extracted", "stale")}
    assert (out / "shard-00001" / DATA_NAME).read_bytes() == kept
    # Training's cache key hashes the shards' manifests (tasks/train.py `train_output`): the
    # redone shards' differ, so a training made from the old ones is not found "finished".
    now = {n: (out / n / "manifest.json").read_bytes() for n in manifests}
    assert [n for n in manifests if now[n] != manifests[n]] == ["shard-00000", "shard-00002"]
    fresh = tmp_path / "fresh"
    extract(merged, fresh, model_dir=llama8, cfg=CFG, shards=[2])
    assert (out / "shard-00002" / DATA_NAME).read_bytes() == (fresh / "shard-00002" / DATA_NAME).read_bytes()
    sample = list(iter_samples(out / "shard-00000"))[1]  # record 1
    assert sample["loss_mask"].tolist() == records[1]["loss_mask"]


DEAD_PID = 2**22 + 12345
"""Above the kernel's pid limit on this machine: a process that is certainly gone."""


def test_folders_of_killed_shard_writers_are_removed_a_live_writers_kept(merged, llama8,  # noqa: F811
                                                                         tmp_path):
    """A writer killed mid-shard leaves ``.tmp-shard-*`` (and, killed mid-swap,
    ``.old-shard-*``) folders of the size of a shard. The next extraction deletes those of
    dead processes -- also beside a shard it finds complete -- and leaves a live one's."""
    import os

    out = tmp_path / "hidden" / "train"
    extract(merged, out, model_dir=llama8, cfg=CFG)
    dead = [out / f".tmp-shard-00001-{DEAD_PID}-0a1b2c3d", out / f".old-shard-00000-{DEAD_PID}-ab12"]
    live = out / f".tmp-shard-00002-{os.getpid()}-ffff0000"
    for folder in [*dead, live]:
        folder.mkdir()
        (folder / DATA_NAME).write_bytes(b"x" * 1000)
    again = extract(merged, out, model_dir=llama8, cfg=CFG)
    assert (again["extracted"], again["skipped"]) == (0, 3)
    assert not any(f.exists() for f in dead) and live.is_dir()
def _stopped_after_batch(n: int, merged, out, model_dir, cfg, monkeypatch):
    """`extract` into `out` with a stop requested (SIGTERM, as its handler does) during the
    `n`-th forward batch (the real one); returns the StopRequested's ExceptionInfo and the
    first sample id of each batch run."""
    import signal

    from eyas import stopping
    from eyas.extract.hf_backend import HFBackend

    real = HFBackend.run_batch
    batches: list[str] = []

    def run_batch(self, records):
        result = real(self, records)  # the real forward pass
        batches.append(records[0]["id"])
        if len(batches) == n:
            stopping.request(signal.SIGTERM)
        return result

    monkeypatch.setattr(HFBackend, "run_batch", run_batch)
    try:
        with pytest.raises(stopping.StopRequested) as info:
            extract(merged, out, model_dir=model_dir, cfg=cfg)
    finally:
        stopping.reset()
    return info, batches


def test_a_stop_mid_shard_abandons_it_after_the_batch_under_way_and_the_rerun_equals_an_uninterrupted_run(  # noqa: E501
        llama8, tmp_path, monkeypatch):  # noqa: F811
    """SIGTERM / Ctrl-C during a shard (`eyas.stopping.request`, what their handler calls,
    made after the second forward batch of shard 1): the extraction stops after that batch,
    shard 0 stays complete, shard 1 is not written at all, and the rerun extracts only shard
    1 and 2, byte for byte what an uninterrupted run writes."""
    import hashlib

    from eyas.extract.hf_backend import plan_batches

    merged = write_merged(tmp_path / "merged" / "train.jsonl", 15)
    cfg = ExtractConfig(shard_size=5, batch_tokens=40, device="cpu")

    def digests(out):
        return {p.name: hashlib.sha256((p / DATA_NAME).read_bytes()).hexdigest()
                for p in list_shards(out)}

    reference = tmp_path / "reference"
    extract(merged, reference, model_dir=llama8, cfg=cfg)

    specs = plan_shards(merged, cfg)
    lengths = [len(json.loads(line)["input_ids"]) for line in merged.read_text().splitlines()]
    shard0_batches = len(plan_batches(lengths[:5], cfg.batch_tokens))
    assert len(plan_batches(lengths[5:10], cfg.batch_tokens)) > 2  # the stop lands mid-shard

    out = tmp_path / "stopped"
    info, batches = _stopped_after_batch(shard0_batches + 2, merged, out, llama8, cfg, monkeypatch)
    assert info.value.exit_code == 143
    assert len(batches) == shard0_batches + 2  # no forward batch after the one under way
    assert "shard-00001 abandoned after" in str(info.value)
    assert [p.name for p in list_shards(out)] == ["shard-00000"]
    assert sorted(p.name for p in out.iterdir()) == ["shard-00000"]  # nothing of shard 1

    monkeypatch.undo()  # the real forward passes again
    again = extract(merged, out, model_dir=llama8, cfg=cfg)
    assert [r["status"] for r in again["shards"]] == ["skipped", "extracted", "extracted"]
    assert specs[1].name == "shard-00001"
    assert digests(out) == digests(reference)


def test_a_stop_during_a_shards_last_batch_writes_that_shard_and_starts_no_other(
        llama8, tmp_path, monkeypatch):  # noqa: F811
    """A stop that lands while a shard's last forward batch runs: every sample is in hand, so
    the shard is written whole (not abandoned "after 5 of 5 samples"); the next shard is not
    started (no forward batch after the stop), and the rerun extracts only it, byte for byte
    what an uninterrupted run writes."""
    import hashlib

    from eyas.extract.hf_backend import plan_batches

    merged = write_merged(tmp_path / "merged" / "train.jsonl", 10)
    cfg = ExtractConfig(shard_size=5, batch_tokens=40, device="cpu")
    reference = tmp_path / "reference"
    extract(merged, reference, model_dir=llama8, cfg=cfg)
    lengths = [len(json.loads(line)["input_ids"]) for line in merged.read_text().splitlines()]
    shard0_batches = len(plan_batches(lengths[:5], cfg.batch_tokens))

    out = tmp_path / "stopped"  # the stop comes during shard 0's last batch
    info, batches = _stopped_after_batch(shard0_batches, merged, out, llama8, cfg, monkeypatch)
    assert len(batches) == shard0_batches  # shard 1 never ran a forward batch
    assert "stopped before shard-00001" in str(info.value)
    assert [p.name for p in list_shards(out)] == ["shard-00000"]  # written whole
    assert sorted(p.name for p in out.iterdir()) == ["shard-00000"]

    def digest(root):
        return hashlib.sha256((root / "shard-00000" / DATA_NAME).read_bytes()).hexdigest()
    assert digest(out) == digest(reference)
    monkeypatch.undo()  # the real forward passes again
    again = extract(merged, out, model_dir=llama8, cfg=cfg)
    assert [r["status"] for r in again["shards"]] == ["skipped", "extracted"]
