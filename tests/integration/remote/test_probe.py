"""Status probe: manifest verdicts (same as eyas.manifest), counts, estimates, disk refusal."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from support.paths import REPO

from eyas.cli import cmd_status as status_main
from eyas.extract.plan import DiskSpaceError
from eyas.io import write_json
from eyas.manifest import verify_manifest, write_manifest
from eyas.remote._probe_script import verify
from eyas.remote.hosts import HostSpec, LocalHost, SSHHost
from eyas.remote.probe import (
    add_clean_arguments,
    add_status_arguments,
    check_fits,
    clean_main,
    hidden_state_bytes,
    status,
)


def _prepared(workdir: Path, name: str, records: int, tokens: int) -> Path:
    d = workdir / "prepared" / name
    d.mkdir(parents=True)
    (d / "tokenized_data.jsonl").write_text("".join('{"input_ids": [1]}\n' for _ in range(records)))
    write_json(d / "stats.json", {"samples": records, "tokens": tokens})
    write_manifest(d, phase="tokenize", outputs=["tokenized_data.jsonl", "stats.json"],
                   counts={"samples": records, "tokens": tokens})
    return d


def _workdir(base: Path) -> Path:
    wd = base / "run"
    _prepared(wd, "B1_glaive", 3, 300)
    bad = _prepared(wd, "B2_corrupt", 2, 200)
    (bad / "tokenized_data.jsonl").write_text("")  # emptied after the manifest: not complete
    partial = wd / "prepared" / "B3_partial"
    partial.mkdir(parents=True)
    (partial / ".tmp-tokenized_data.jsonl.abc").write_text('{"input_ids": [1]}\n')
    return wd


def _merged(wd: Path, train_tokens: int) -> None:
    m = wd / "merged"
    m.mkdir()
    (m / "train.jsonl").write_text("{}\n")
    write_json(m / "stats.json", {"records": 5, "tokens": train_tokens + 10,
                                  "train": {"records": 4, "tokens": train_tokens}})
    write_manifest(m, phase="merge", outputs=["train.jsonl", "stats.json"],
                   counts={"records": 5, "tokens": train_tokens + 10})


def test_probe_script_agrees_with_verify_manifest(tmp_path):
    wd = _workdir(tmp_path)
    for folder in sorted((wd / "prepared").iterdir()):
        for hashes in (False, True):
            assert (not verify(str(folder), hashes)[1]) == (not verify_manifest(folder, check_hashes=hashes))
    # Same size, different bytes: only the hash check sees it, in both implementations.
    good = wd / "prepared" / "B1_glaive" / "tokenized_data.jsonl"
    good.write_text(good.read_text().replace("1", "2"))
    assert not verify(str(good.parent), False)[1] and verify(str(good.parent), True)[1]
    assert verify_manifest(good.parent, check_hashes=True)


def test_hidden_state_estimate_kimi():
    # 87.8M tokens x (3 aux + 1 final) x 7168 x 2 bytes (bf16)
    assert hidden_state_bytes(87_800_000, 7168) == 87_800_000 * 4 * 7168 * 2
    assert round(hidden_state_bytes(87_800_000, 7168) / 1e12, 2) == 5.03
    assert hidden_state_bytes(10, 4096, captured=3, bytes_per_value=1) == 10 * 3 * 4096


def test_check_fits_margin_and_reserve():
    check_fits(100, 110, margin=0.10)
    with pytest.raises(DiskSpaceError, match="needs 100 B"):
        check_fits(100, 109, margin=0.10)
    with pytest.raises(DiskSpaceError, match="reserve"):
        check_fits(100, 200, margin=0.0, reserve_bytes=101)


def test_local_status_reports_phases_partials_and_next(tmp_path):
    wd = _workdir(tmp_path)
    host = LocalHost(HostSpec(kind="local", data_root=str(tmp_path), known_hosts=None))
    rep = status(host, str(wd), expected=["B1_glaive", "B2_corrupt", "B3_partial", "B4_missing"])
    rows = {(r["phase"], r["name"]): r for r in rep.rows()}
    assert rows[("prepared", "B1_glaive")]["state"] == "complete"
    assert (rows[("prepared", "B1_glaive")]["records"], rows[("prepared", "B1_glaive")]["tokens"]) == (3, 300)
    assert rows[("prepared", "B2_corrupt")]["state"] == "partial"
    assert "bytes, manifest says" in rows[("prepared", "B2_corrupt")]["problems"]
    assert rows[("prepared", "B3_partial")]["state"] == "partial"
    assert rows[("prepared", "B4_missing")]["state"] == "missing"
    assert rep.next_phase == "generate/tokenize" and rep.free_bytes > 0
    assert "B3_partial" in rep.text()

    # Everything prepared and merged: the next phase is extraction, sized by the train tokens.
    import shutil
    for n in ("B2_corrupt", "B3_partial"):
        shutil.rmtree(wd / "prepared" / n)
    _merged(wd, train_tokens=1000)
    rep = status(host, str(wd), hidden_size=64)
    assert rep.next_phase == "extract" and rep.needed_bytes == 1000 * 4 * 64 * 2 and rep.fits
    # A reserve larger than the disk: refused, with the figures.
    rep = status(host, str(wd), hidden_size=64, reserve_bytes=2 * rep.free_bytes + 1)  # free space moves
    assert rep.fits is False and "only" in rep.refusal and "DOES NOT FIT" in rep.text()
    json.dumps(rep.to_dict())


def test_status_counts_answers_cut_at_max_tokens(tmp_path, capsys):
    wd = tmp_path / "run"
    gen = wd / "generated" / "B1_glaive"
    gen.mkdir(parents=True)
    (gen / "responses.jsonl").write_text("{}\n" * 20)
    write_manifest(gen, phase="generate", outputs=["responses.jsonl"],
                   counts={"samples": 20, "cut_answers": 5})
    d = _prepared(wd, "B1_glaive", 15, 1500)
    write_json(d / "stats.json", {"samples": 15, "tokens": 1500, "cut_answers": 5,
                                  "cut_answers_dropped": 5})
    write_manifest(d, phase="tokenize", outputs=["tokenized_data.jsonl", "stats.json"],
                   counts={"samples": 15, "tokens": 1500})
    _prepared(wd, "B2_clean", 3, 300)
    rep = status(LocalHost(HostSpec.local(data_root=str(tmp_path))), str(wd))
    rows = {(r["phase"], r["name"]): r for r in rep.rows()}
    assert rows[("generated", "B1_glaive")]["cut_answers"] == 5
    assert rows[("prepared", "B1_glaive")]["cut_answers"] == 5
    assert rows[("prepared", "B1_glaive")]["detail"] == "5 answer(s) cut at max_tokens, 5 dropped"
    assert rows[("prepared", "B2_clean")]["cut_answers"] is None  # not counted: unknown
    assert "5 answer(s) cut at max_tokens" in rep.text()
    # `eyas status --json` carries the count in each row.
    p = argparse.ArgumentParser()
    add_status_arguments(p)
    assert status_main(p.parse_args(["--workdir", str(wd), "--json", "--data-root", str(tmp_path)])) == 0
    out = json.loads(capsys.readouterr().out)
    assert {(r["phase"], r["name"]): r["cut_answers"] for r in out["outputs"]}[
        ("generated", "B1_glaive")] == 5


def test_status_and_clean_cli_entry_points(tmp_path, capsys):
    wd = _workdir(tmp_path)
    p = argparse.ArgumentParser()
    add_status_arguments(p)
    args = p.parse_args(["--workdir", str(wd), "--json", "--data-root", str(tmp_path)])
    assert status_main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["next_phase"] == "generate/tokenize"
    c = argparse.ArgumentParser()
    add_clean_arguments(c)
    target = str(wd / "prepared" / "B3_partial")
    assert clean_main(c.parse_args([target, "--data-root", str(tmp_path)])) == 0
    assert "DRY RUN" in capsys.readouterr().out and Path(target).exists()
    assert clean_main(c.parse_args([target, "--data-root", str(tmp_path), "--yes"])) == 0
    assert not Path(target).exists()
    assert clean_main(c.parse_args([str(tmp_path), "--data-root", str(tmp_path)])) == 2


@pytest.mark.ssh
def test_ssh_status(sshd, tmp_path):
    base = sshd.data_root.parent / "probe-case"
    base.mkdir()
    wd = _workdir(base)
    with SSHHost(sshd.spec(data_root=str(base))) as host:
        rep = status(host, str(wd), expected=["B1_glaive"], check_hashes=True)
    rows = {r["name"]: r["state"] for r in rep.rows()}
    assert rows == {"B1_glaive": "complete", "B2_corrupt": "partial", "B3_partial": "partial"}


# ---------------------------------------------------------------- phases 4 and 5: shards, drafter

H = 4  # hidden size of the tiny shards


def _shard(root: Path, index: int, n: int = 2, *, seed: int = 0) -> Path:
    """A real shard (storage "final", hidden size H) of `n` samples of 3 + i tokens."""
    import torch

    from eyas.extract.store import shard_name, write_shard

    g = torch.Generator().manual_seed(seed + index)
    samples = []
    for i in range(n):
        t = 3 + i
        samples.append({"id": f"s{index}-{i}", "input_ids": list(range(t)),
                        "loss_mask": [0] + [1] * (t - 1),
                        "aux_hidden": torch.randn(t, 3 * H, generator=g),
                        "final_hidden": torch.randn(t, H, generator=g)})
    shard = root / shard_name(index)
    write_shard(shard, samples, storage="final", aux_layers=[0, 1, 2], hidden_size=H)
    return shard


def _split_merged(wd: Path, splits: dict[str, tuple[int, int]]) -> None:
    """A complete merged output whose stats give (records, tokens) per split."""
    m = wd / "merged"
    m.mkdir(parents=True)
    (m / "train.jsonl").write_text("{}\n")
    write_json(m / "stats.json", {
        "records": sum(r for r, _ in splits.values()), "tokens": sum(t for _, t in splits.values()),
        **{s: {"records": r, "tokens": t} for s, (r, t) in splits.items()}})
    write_manifest(m, phase="merge", outputs=["train.jsonl", "stats.json"])


def _export(drafter_dir: Path) -> Path:
    """A real exported drafter (eyas.train.export), tiny."""
    import torch

    from eyas.train.export import export_drafter
    from eyas.train.model import Drafter, DrafterConfig
    from eyas.train.vocab import DraftVocab

    cfg = DrafterConfig(hidden_size=8, target_hidden_size=H, intermediate_size=16,
                        num_attention_heads=2, num_key_value_heads=1, vocab_size=20,
                        draft_vocab_size=10)
    drafter = Drafter(cfg, torch.zeros(cfg.vocab_size, cfg.hidden_size))
    vocab = DraftVocab(torch.arange(10, dtype=torch.int64), cfg.vocab_size)
    return export_drafter(drafter_dir / "export", drafter, vocab, [0, 1, 2])


def test_probe_shard_check_agrees_with_verify_shard(tmp_path):
    from eyas.extract.store import DATA_NAME, verify_shard
    from eyas.remote._probe_script import verify_shard as probe_verify_shard

    shard = _shard(tmp_path, 0, n=3)
    record, problems = probe_verify_shard(str(shard), True)
    assert problems == [] == verify_shard(shard)
    assert (record["num_samples"], record["num_tokens"], record["storage"]) == (3, 12, "final")
    data = shard / DATA_NAME
    raw = bytearray(data.read_bytes())
    raw[-3] ^= 0xFF  # same size, other bytes: only the hash check sees it
    data.write_bytes(bytes(raw))
    for hashes in (False, True):
        assert (not probe_verify_shard(str(shard), hashes)[1]) == (
            not verify_shard(shard, check_hashes=hashes))
    assert "checksum" in probe_verify_shard(str(shard), True)[1][0]
    data.write_bytes(bytes(raw[:100]))  # truncated
    got = probe_verify_shard(str(shard), False)
    assert got[0] is None and "bytes, manifest says" in got[1][0] and verify_shard(shard)
    # A manifest whose tensor shapes disagree with the data file's header: both refuse.
    other = _shard(tmp_path / "b", 0)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["shard"]["tensors"]["aux_hidden"]["shape"] = [99, 3 * H]
    write_json(other / "manifest.json", manifest)
    assert "has shape" in probe_verify_shard(str(other), False)[1][0]
    assert any("has shape" in p for p in verify_shard(other, check_hashes=False))


def test_local_status_hidden_shards_drafter_and_next_phase(tmp_path):
    import shutil

    import torch

    from eyas.extract.plan import bytes_per_token
    from eyas.extract.store import DATA_NAME

    wd = tmp_path / "run"
    _prepared(wd, "B1", 3, 300)
    # train: 2 shards of 2 samples (3 + 4 tokens each); eval: 1 shard of 2 samples.
    _split_merged(wd, {"train": (4, 14), "eval": (2, 7)})
    host = LocalHost(HostSpec(kind="local", data_root=str(tmp_path), known_hosts=None))
    rep = status(host, str(wd), expected=["B1"], hidden_size=H)
    rows = {(r["phase"], r["name"]): r for r in rep.rows()}
    assert rows[("hidden", "train")]["state"] == rows[("hidden", "eval")]["state"] == "missing"
    assert rep.next_phase == "extract" and rep.needed_bytes == 21 * 4 * H * 2
    rep = status(host, str(wd), expected=["B1"], hidden_size=H, storage="compact", topk=4)
    assert rep.needed_bytes == 21 * bytes_per_token(H, "compact", topk=4)

    hidden = wd / "hidden"
    _shard(hidden / "train", 0)
    _shard(hidden / "train", 1)
    (hidden / "train" / ".tmp-shard-00002-123-abcd").mkdir()  # an interrupted writer
    bad = _shard(hidden / "eval", 0)
    raw = bytearray((bad / DATA_NAME).read_bytes())
    raw[-3] ^= 0xFF
    (bad / DATA_NAME).write_bytes(bytes(raw))
    rep = status(host, str(wd), expected=["B1"], hidden_size=H, check_hashes=True)
    rows = {(r["phase"], r["name"]): r for r in rep.rows()}
    train, ev = rows[("hidden", "train")], rows[("hidden", "eval")]
    assert (train["state"], train["records"], train["tokens"]) == ("partial", 4, 14)
    assert "2 shards complete, 1 partial" in train["detail"] and "interrupted" in train["problems"]
    assert (ev["state"], ev["records"], ev["tokens"]) == ("partial", 0, 0)
    assert "0 shards complete, 1 partial" in ev["detail"] and "checksum" in ev["problems"]
    assert train["bytes"] > 0 and ev["bytes"] > 0
    # Still to extract: the eval tokens only (the train tokens are in complete shards).
    assert rep.next_phase == "extract" and rep.needed_bytes == 7 * 4 * H * 2 and rep.fits
    assert ("drafter", "drafter") not in rows
    assert "1 partial" in rep.text()

    # Every split complete: training is next, needs no disk to speak of, and has no output yet.
    (hidden / "train" / ".tmp-shard-00002-123-abcd").rmdir()
    _shard(hidden / "eval", 0)
    rep = status(host, str(wd), expected=["B1"], hidden_size=H, check_hashes=True)
    rows = {(r["phase"], r["name"]): r for r in rep.rows()}
    assert rows[("hidden", "train")]["state"] == rows[("hidden", "eval")]["state"] == "complete"
    assert "4 of 4 records" in rows[("hidden", "train")]["detail"]
    assert (rep.next_phase, rep.needed_bytes, rep.fits) == ("train", 0, True)
    assert rows[("drafter", "drafter")]["state"] == "missing"

    # Training under way: a checkpoint with its step.
    ck = wd / "drafter" / "checkpoint"
    ck.mkdir(parents=True)
    torch.save({"state": {"step": 7}}, ck / "state.pt")
    write_json(ck / "meta.json", {"step": 7, "config": {}})
    rep = status(host, str(wd), expected=["B1"], hidden_size=H)
    row = next(r for r in rep.rows() if r["phase"] == "drafter")
    assert row["state"] == "partial" and "checkpoint at step 7" in row["detail"]
    assert "no export" in row["detail"] and rep.next_phase == "train"

    # Exported: done, even once the hidden states are cleaned away.
    _export(wd / "drafter")
    rep = status(host, str(wd), expected=["B1"], hidden_size=H, check_hashes=True)
    row = next(r for r in rep.rows() if r["phase"] == "drafter")
    assert row["state"] == "complete" and "export verified" in row["detail"]
    assert (rep.next_phase, rep.needed_bytes, rep.fits) == ("done", None, None)
    assert "next phase: done" in rep.text()
    shutil.rmtree(hidden)
    assert status(host, str(wd), expected=["B1"]).next_phase == "done"
    # A damaged export is not done.
    (wd / "drafter" / "export" / "config.json").write_text("{}")
    rep = status(host, str(wd), expected=["B1"])
    assert rep.next_phase == "extract"
    assert "export incomplete" in next(r for r in rep.rows() if r["phase"] == "drafter")["detail"]


def test_hidden_split_without_merged_figures_needs_its_summary(tmp_path):
    wd = tmp_path / "run"
    _prepared(wd, "B1", 3, 300)
    m = wd / "merged"
    m.mkdir()
    (m / "train.jsonl").write_text("{}\n")
    write_manifest(m, phase="merge", outputs=["train.jsonl"])  # no stats.json, no counts
    _shard(wd / "hidden" / "train", 0)
    host = LocalHost(HostSpec(kind="local", data_root=str(tmp_path), known_hosts=None))
    rep = status(host, str(wd), hidden_size=H)
    assert rep.next_phase == "extract" and rep.needed_bytes is None  # more shards may follow
    write_json(wd / "hidden" / "train" / "extract_summary.json", {"num_shards": 1})
    assert status(host, str(wd), hidden_size=H).next_phase == "train"
    write_json(wd / "hidden" / "train" / "extract_summary.json", {"num_shards": 2})
    assert status(host, str(wd), hidden_size=H).next_phase == "extract"


def test_status_cli_sizes_extraction_by_the_configured_storage(tmp_path, capsys):
    import yaml

    from eyas.extract.plan import bytes_per_token

    raw = yaml.safe_load((REPO / "recipes" / "tiny-demo.yaml")
                         .read_text())
    raw.setdefault("extract", {}).update({"storage": "compact", "topk": 4})
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    wd = tmp_path / "run"
    for d in raw["datasets"]:
        _prepared(wd, d["name"], 1, 10)
    _split_merged(wd, {"train": (4, 14), "eval": (0, 0)})
    p = argparse.ArgumentParser()
    add_status_arguments(p)
    base = ["--workdir", str(wd), "--json", "--data-root", str(tmp_path), "--hidden-size", str(H)]
    assert status_main(p.parse_args([*base, "--config", str(cfg)])) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["next_phase"] == "extract"
    assert out["needed_bytes"] == 14 * bytes_per_token(H, "compact", topk=4)
    # An explicit --storage wins over the config; without either, 3 aux + 1 final in bf16.
    assert status_main(p.parse_args([*base, "--config", str(cfg), "--storage", "final"])) == 0
    assert json.loads(capsys.readouterr().out)["needed_bytes"] == 14 * bytes_per_token(H, "final")
    assert status_main(p.parse_args(base)) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["needed_bytes"] == 14 * 4 * H * 2
    # Backward compatible JSON: the old keys are all still there, each row gains "detail".
    assert {"host", "workdir", "free_bytes", "next_phase", "needed_bytes", "fits", "refusal",
            "outputs", "stray", "raw"} <= set(out)
    assert all({"phase", "name", "state", "records", "tokens", "bytes", "problems",
                "detail"} <= set(r) for r in out["outputs"])
    assert {"generated", "prepared", "merged", "hidden", "drafter"} <= set(out["raw"]["phases"])


@pytest.mark.ssh
def test_ssh_status_hidden_and_export(sshd, tmp_path):
    base = sshd.data_root.parent / "probe-phases"
    base.mkdir()
    wd = base / "run"
    _prepared(wd, "B1", 3, 300)
    _split_merged(wd, {"train": (4, 14)})
    _shard(wd / "hidden" / "train", 0)
    _shard(wd / "hidden" / "train", 1)
    (wd / "hidden" / "train" / ".tmp-shard-00002-1-abcd").mkdir()
    with SSHHost(sshd.spec(data_root=str(base))) as host:
        rep = status(host, str(wd), expected=["B1"], hidden_size=H, check_hashes=True)
        assert next(r for r in rep.rows() if r["phase"] == "hidden")["state"] == "partial"
        (wd / "hidden" / "train" / ".tmp-shard-00002-1-abcd").rmdir()
        assert status(host, str(wd), expected=["B1"]).next_phase == "train"
        _export(wd / "drafter")
        assert status(host, str(wd), expected=["B1"], check_hashes=True).next_phase == "done"


# ---------------------------------------------------------------- what a config expects

def test_datasets_kept_as_given_are_not_missing_under_generated(tmp_path, capsys):
    import yaml

    raw = yaml.safe_load((REPO / "recipes" / "tiny-demo.yaml")
                         .read_text())
    kept = [d["name"] for d in raw["datasets"] if d.get("regenerate") is False]
    answered = [d["name"] for d in raw["datasets"] if d.get("regenerate", True)]
    assert kept and answered  # the demo has both kinds
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    wd = tmp_path / "run"
    for d in raw["datasets"]:
        _prepared(wd, d["name"], 1, 10)
    p = argparse.ArgumentParser()
    add_status_arguments(p)
    assert status_main(p.parse_args(["--workdir", str(wd), "--json", "--data-root",
                                     str(tmp_path), "--config", str(cfg)])) == 0
    rows = {(r["phase"], r["name"]): r["state"]
            for r in json.loads(capsys.readouterr().out)["outputs"]}
    assert not any(("generated", n) in rows for n in kept)  # kept as given: nothing to generate
    assert all(rows[("generated", n)] == "missing" for n in answered)
    assert all(rows[("prepared", n)] == "complete" for n in kept)
    host = LocalHost(HostSpec.local(data_root=str(tmp_path)))
    rep = status(host, str(wd), expected=kept + answered, generated=answered)
    assert {n for p, n in ((r["phase"], r["name"]) for r in rep.rows()) if p == "generated"} == set(answered)


def test_probe_expects_what_the_extraction_records(tiny_target, tmp_path):
    """The stdlib probe's view of a shard's settings equals `shard_settings` (eyas), for a
    real shard of the tiny target, and its default layers equal `default_aux_layers`."""
    from support.extract_fixtures import write_merged

    from eyas.extract.config import ExtractConfig
    from eyas.extract.shards import plan_shards, shard_settings
    from eyas.extract.target import resolve_aux_layers, target_fingerprint
    from eyas.layers import default_aux_layers
    from eyas.remote import _probe_script as probe

    for layers in range(3, 130):
        assert probe.default_aux_layers(layers) == default_aux_layers(layers)
    assert probe.target_fingerprint(str(tiny_target)) == target_fingerprint(tiny_target)
    wd = tmp_path / "run"
    merged = write_merged(wd / "merged" / "train.jsonl", 7, vocab=4100)
    for storage in ("final", "compact"):
        cfg = ExtractConfig(shard_size=3, storage=storage, topk=8)
        expect = {"shard_size": 3, "storage": storage, "topk": 8 if storage == "compact" else None,
                  "dtype": "float8_e4m3fn" if storage == "compact" else "bfloat16",
                  "aux_layers": None, "target": str(tiny_target)}
        common, hashes, notes = probe.expected_settings(str(wd), expect)
        assert notes == []
        layers, _ = resolve_aux_layers(tiny_target, None)
        for spec in plan_shards(merged, cfg):
            want = shard_settings(spec, cfg, layers, target_fingerprint(tiny_target))
            assert {**common, "content_hash": hashes["train"][spec.index]} == want


def test_status_counts_shards_made_otherwise_as_stale(tiny_target, tmp_path):
    """A shard that verifies but was extracted with other settings, or from other records,
    is not complete: `eyas status` says so, as the extraction would (it redoes it)."""
    import yaml
    from support.extract_fixtures import write_merged

    from eyas.config import load_config
    from eyas.extract.run import extract
    from eyas.io import dumps_line, iter_jsonl
    from eyas.remote.probe import shard_expectation

    raw = yaml.safe_load((REPO / "recipes" / "tiny-demo.yaml")
                         .read_text())
    raw["extract"] = {"shard_size": 2, "storage": "final", "device": "cpu", "batch_tokens": 256}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(raw))
    cfg = load_config(tmp_path / "cfg.yaml")
    wd = tmp_path / "run"
    merged = write_merged(wd / "merged" / "train.jsonl", 4, vocab=4100, max_len=12)
    _split_merged_stats(wd, {"train": (4, sum(len(o["input_ids"]) for _, o in iter_jsonl(merged)))})
    extract(merged, wd / "hidden" / "train", model_dir=tiny_target, cfg=cfg.extract)
    host = LocalHost(HostSpec.local(data_root=str(tmp_path)))

    def hidden_row(config) -> dict:
        rep = status(host, str(wd), hidden_size=256, shards=shard_expectation(config))
        return next(r for r in rep.rows() if r["phase"] == "hidden")

    row = hidden_row(cfg)
    assert row["state"] == "complete" and "2 shards complete" in row["detail"], row
    # Other settings: every shard is stale.
    other = cfg.model_copy(update={"extract": cfg.extract.model_copy(update={"storage": "topk"})})
    row = hidden_row(other)
    assert row["state"] == "partial" and "2 made with other settings" in row["detail"]
    assert "storage 'final', expected 'topk'" in row["problems"]
    assert row["records"] == 0
    layers = cfg.model_copy(update={"extract": cfg.extract.model_copy(update={"aux_layers": [0, 1, 3]})})
    assert "aux_layers" in hidden_row(layers)["problems"]
    # Other records in shard 1 (the merged file changed since): that shard only is stale.
    records = [o for _, o in iter_jsonl(merged)]
    records[3]["id"] = "changed"
    merged.write_bytes(b"".join(dumps_line(r) for r in records))
    row = hidden_row(cfg)
    assert "1 shards complete" in row["detail"] and "1 made with other settings" in row["detail"]
    assert "shard-00001" in row["problems"] and "content_hash" in row["problems"]
    # Without the expectation (no --config), the old verdict: verified = complete.
    rep = status(host, str(wd), hidden_size=256)
    assert next(r for r in rep.rows() if r["phase"] == "hidden")["state"] == "complete"
    # A target the host cannot read: said so, and the rest still checked.
    rep = status(host, str(wd), hidden_size=256,
                 shards={**shard_expectation(other), "target": str(tmp_path / "nowhere")})
    assert any("not readable" in n for n in rep.raw["notes"]) and "note: target" in rep.text()
    assert "storage 'final', expected 'topk'" in next(
        r for r in rep.rows() if r["phase"] == "hidden")["problems"]


def _split_merged_stats(wd: Path, splits: dict[str, tuple[int, int]]) -> None:
    """A merged manifest and stats beside an existing ``merged/train.jsonl``."""
    m = wd / "merged"
    write_json(m / "stats.json", {
        "records": sum(r for r, _ in splits.values()), "tokens": sum(t for _, t in splits.values()),
        **{s: {"records": r, "tokens": t} for s, (r, t) in splits.items()}})
    write_manifest(m, phase="merge", outputs=["train.jsonl", "stats.json"])


@pytest.mark.parametrize("line", [
    '{"id": 7, "input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}',
    '{"id":"s1","dataset":"B1","input_ids":[5,6],"loss_mask":[0,1]}',  # eyas's own layout
    '{"loss_mask":[1,1],"id":"a\\"b","input_ids":[1,2]}',
    '{"meta":{"id":1,"input_ids":[9]},"id":"y","input_ids":[1,2],"loss_mask":[1,0]}',
    ' { "id" : 1.5 , "input_ids" : [ 1 , 2 ] , "loss_mask" : [ 0 , 1 ] }',
    '{"id":"\u00e9 \\u00fc","input_ids":[1,2],"loss_mask":[true,false]}',  # text id, bool mask
    '{"id":"n","input_ids":[1,2],"loss_mask":[0, 1]}',  # one array not compact: full parse
    '{"id":"big","input_ids":[163839,0],"loss_mask":[1,1],"extra":{"input_ids":[5]}}',
])
def test_probe_hashes_records_as_the_shard_plan_does(line, tmp_path):
    """The host-side probe (stdlib only) hashes a merged record as `plan_shards` does, in
    whatever layout the record is written: its id, token ids and loss mask."""
    from eyas.extract.config import ExtractConfig
    from eyas.extract.shards import plan_shards
    from eyas.remote._probe_script import content_hashes

    merged = tmp_path / "m.jsonl"
    merged.write_text(line + "\n" + line + "\n")
    (spec,) = plan_shards(merged, ExtractConfig(shard_size=2))
    assert content_hashes(str(merged), 2) == {0: spec.content_hash}
