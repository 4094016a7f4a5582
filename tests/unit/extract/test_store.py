import json

import pytest
import torch

from eyas.errors import DataError
from eyas.extract.store import (
    DATA_NAME,
    iter_samples,
    list_shards,
    read_quarantine,
    read_shard_manifest,
    verify_shard,
    write_shard,
)

H = 8


def _samples(storage, n=3, k=4):
    torch.manual_seed(0)
    out = []
    for i in range(n):
        t = 2 + i
        s = {"id": f"s{i}", "input_ids": list(range(t)), "loss_mask": [0] + [1] * (t - 1),
             "aux_hidden": torch.randn(t, 3 * H)}
        if storage == "final":
            s["final_hidden"] = torch.randn(t, H)
        else:
            s["topk_ids"] = torch.randint(0, 100, (t, k))
            s["topk_logprobs"] = -torch.rand(t, k)
        out.append(s)
    return out


@pytest.mark.parametrize("storage", ["final", "topk"])
def test_round_trip(tmp_path, storage):
    samples = _samples(storage)
    rec = write_shard(tmp_path / "shard-00000", samples, storage=storage, aux_layers=[1, 3, 4],
                      hidden_size=H, topk=4, target_fingerprint="abc",
                      quarantined=[{"id": "bad", "reason": "NaN"}])
    shard = tmp_path / "shard-00000"
    assert verify_shard(shard) == []
    m = read_shard_manifest(shard)
    assert m == rec
    assert (m["storage"], m["aux_layers"], m["hidden_size"]) == (storage, [1, 3, 4], H)
    assert (m["num_samples"], m["num_tokens"], m["target_fingerprint"]) == (3, 9, "abc")
    assert m["sample_ids"] == ["s0", "s1", "s2"]
    assert read_quarantine(shard) == [{"id": "bad", "reason": "NaN"}]
    got = list(iter_samples(shard))
    assert len(got) == 3
    for s, g in zip(samples, got, strict=True):
        assert g["input_ids"].tolist() == s["input_ids"]
        assert g["loss_mask"].tolist() == s["loss_mask"]
        assert g["aux_hidden"].dtype == torch.bfloat16
        assert torch.equal(g["aux_hidden"], s["aux_hidden"].to(torch.bfloat16))
        if storage == "final":
            assert torch.equal(g["final_hidden"], s["final_hidden"].to(torch.bfloat16))
        else:
            assert torch.equal(g["topk_ids"], s["topk_ids"])
            assert torch.equal(g["topk_logprobs"], s["topk_logprobs"].to(torch.float16))
    assert list_shards(tmp_path) == [shard]
    # no pickle anywhere: the data file is safetensors (8-byte header length + JSON header)
    raw = (shard / DATA_NAME).read_bytes()
    header_len = int.from_bytes(raw[:8], "little")
    assert json.loads(raw[8 : 8 + header_len])["__metadata__"]["format"] == "pt"


def test_corruption_is_detected(tmp_path):
    shard = tmp_path / "shard-00000"
    write_shard(shard, _samples("final"), storage="final", aux_layers=[1, 3, 4], hidden_size=H)
    data = shard / DATA_NAME
    raw = bytearray(data.read_bytes())
    raw[-5] ^= 0xFF
    data.write_bytes(bytes(raw))
    assert any("checksum" in p for p in verify_shard(shard))
    assert list_shards(tmp_path) == []


def test_shape_mismatch_with_manifest_is_detected(tmp_path):
    shard = tmp_path / "shard-00000"
    write_shard(shard, _samples("final"), storage="final", aux_layers=[1, 3, 4], hidden_size=H)
    mpath = shard / "manifest.json"
    m = json.loads(mpath.read_text())
    m["shard"]["tensors"]["aux_hidden"]["shape"] = [9, 99]
    mpath.write_text(json.dumps(m))
    assert any("shape" in p for p in verify_shard(shard))


def test_interrupted_write_leaves_nothing_complete(tmp_path, monkeypatch):
    import eyas.extract.store as store

    def boom(*a, **k):
        raise KeyboardInterrupt  # as if the process were killed while writing the manifest

    monkeypatch.setattr(store, "write_manifest", boom)
    with pytest.raises(KeyboardInterrupt):
        write_shard(tmp_path / "shard-00000", _samples("final"), storage="final",
                    aux_layers=[1, 3, 4], hidden_size=H)
    assert list(tmp_path.iterdir()) == []
    assert list_shards(tmp_path) == []


def test_leftover_temp_folder_is_not_listed(tmp_path):
    (tmp_path / ".tmp-shard-00000-1-abc").mkdir()
    (tmp_path / ".tmp-shard-00000-1-abc" / DATA_NAME).write_bytes(b"partial")
    (tmp_path / "shard-00001").mkdir()  # a folder without a manifest
    assert list_shards(tmp_path) == []


def test_shape_errors_name_the_sample(tmp_path):
    bad = _samples("final")
    bad[1]["aux_hidden"] = torch.randn(3, 2 * H)
    with pytest.raises(DataError, match="sample s1.*aux_hidden|aux_hidden.*sample s1"):
        write_shard(tmp_path / "shard-00000", bad, storage="final", aux_layers=[1, 3, 4],
                    hidden_size=H)


def _compact_samples(n=3, k=4, hidden=H, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        t = 3 + 4 * i
        # layers of very different magnitude, as real residual streams are
        aux = torch.cat([torch.randn(t, hidden, generator=g) * m for m in (0.05, 3.0, 200.0)], -1)
        aux[0, hidden:2 * hidden] = 0.0  # an all-zero row of one layer
        out.append({"id": f"c{i}", "input_ids": list(range(t)), "loss_mask": [1] * t,
                    "aux_hidden": aux, "topk_ids": torch.randint(0, 100, (t, k), generator=g),
                    "topk_logprobs": -torch.rand(t, k, generator=g)})
    return out


def test_compact_round_trip_is_bf16_within_error_bound(tmp_path):
    samples = _compact_samples()
    shard = tmp_path / "shard-00000"
    rec = write_shard(shard, samples, storage="compact", aux_layers=[1, 3, 4], hidden_size=H,
                      topk=4)
    assert verify_shard(shard) == []
    assert rec["dtype"] == "float8_e4m3fn" and rec["topk"] == 4
    assert rec["tensors"]["aux_fp8"]["dtype"] == "float8_e4m3fn"
    assert rec["tensors"]["aux_scale"]["shape"] == [rec["num_tokens"], 3]
    assert "aux_hidden" not in rec["tensors"]
    got = list(iter_samples(shard))
    assert len(got) == 3
    for s, g in zip(samples, got, strict=True):
        assert set(g) == {"input_ids", "loss_mask", "aux_hidden", "topk_ids", "topk_logprobs"}
        assert g["aux_hidden"].dtype == torch.bfloat16
        assert torch.equal(g["topk_ids"], s["topk_ids"])
        want = s["aux_hidden"].reshape(len(s["input_ids"]), 3, H)
        err = (g["aux_hidden"].float().reshape_as(want) - want).abs().amax(-1)
        row_max = want.abs().amax(-1)
        rel = err / row_max.clamp_min(1e-30)
        assert float(rel.max()) < 0.07, float(rel.max())
        assert bool((row_max == 0).any()) and float(err[row_max == 0].sum()) == 0.0  # zeros stay 0


def test_compact_accepts_prequantised_rows_identically(tmp_path):
    from eyas.extract.store import quantize_aux

    samples = _compact_samples(n=2)
    pre = []
    for s in samples:
        q, sc = quantize_aux(s["aux_hidden"])
        pre.append({k: v for k, v in s.items() if k != "aux_hidden"} | {"aux_fp8": q, "aux_scale": sc})
    write_shard(tmp_path / "a", samples, storage="compact", aux_layers=[1, 3, 4], hidden_size=H,
                topk=4)
    write_shard(tmp_path / "b", pre, storage="compact", aux_layers=[1, 3, 4], hidden_size=H, topk=4)
    assert (tmp_path / "a" / DATA_NAME).read_bytes() == (tmp_path / "b" / DATA_NAME).read_bytes()


def test_compact_stores_under_half_of_specforge(tmp_path):
    from eyas.extract.plan import bytes_per_token, specforge_bytes_per_token

    hidden = 512
    samples = _compact_samples(n=4, k=32, hidden=hidden)
    shard = tmp_path / "shard-00000"
    rec = write_shard(shard, samples, storage="compact", aux_layers=[1, 3, 4], hidden_size=hidden,
                      topk=32)
    measured = (shard / DATA_NAME).stat().st_size / rec["num_tokens"]
    planned = bytes_per_token(hidden, "compact", topk=32)
    assert planned <= measured < planned * 1.2  # + offsets and the header
    assert measured <= 0.5 * specforge_bytes_per_token(hidden)
    for h in (4096, 7168):
        assert bytes_per_token(h, "compact", topk=32) <= 0.5 * specforge_bytes_per_token(h)
