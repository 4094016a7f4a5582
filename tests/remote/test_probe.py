"""Status probe: manifest verdicts (same as eyas.manifest), counts, estimates, disk refusal."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

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
    status_main,
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
    rep = status(host, str(wd), hidden_size=64, reserve_bytes=rep.free_bytes + 1)
    assert rep.fits is False and "only" in rep.refusal and "DOES NOT FIT" in rep.text()
    json.dumps(rep.to_dict())


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
