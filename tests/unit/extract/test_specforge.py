import pickle

import pytest
import torch

from eyas.errors import DataError
from eyas.extract.specforge import export_specforge, import_specforge, read_specforge_sample
from eyas.extract.store import iter_samples, list_shards, read_shard_manifest


def _write_specforge(folder, n=5, h=8):
    torch.manual_seed(0)
    originals = []
    for i in range(n):
        t = 3 + i
        sample = {"input_ids": torch.randint(0, 100, (t,)), "loss_mask": torch.ones(t, dtype=torch.long),
                  "hidden_state": torch.randn(1, t, h).to(torch.bfloat16),
                  "aux_hidden_state": torch.randn(1, t, 3 * h).to(torch.bfloat16)}
        sub = folder / f"rows_0-{n}"
        sub.mkdir(parents=True, exist_ok=True)
        torch.save(sample, sub / f"data_{i}.ckpt")
        originals.append(sample)
    return originals


def test_specforge_round_trip(tmp_path):
    originals = _write_specforge(tmp_path / "sf")
    shards = import_specforge(tmp_path / "sf", tmp_path / "ours", aux_layers=[1, 15, 28], shard_size=2)
    assert [p.name for p in shards] == ["shard-00000", "shard-00001", "shard-00002"]
    assert list_shards(tmp_path / "ours") == shards
    assert read_shard_manifest(shards[0])["storage"] == "final"
    ours = [s for sh in shards for s in iter_samples(sh)]
    for o, s in zip(originals, ours, strict=True):
        assert torch.equal(s["input_ids"], o["input_ids"])
        assert torch.equal(s["final_hidden"], o["hidden_state"][0])
        assert torch.equal(s["aux_hidden"], o["aux_hidden_state"][0])
    files = export_specforge(shards, tmp_path / "back")
    assert len(files) == 5
    for o, f in zip(originals, files, strict=True):
        back = torch.load(f, weights_only=True)
        for key in o:
            assert torch.equal(back[key], o[key]), key


class _Payload:
    def __reduce__(self):  # what a malicious pickle does: call something on load
        return (print, ("code ran",))


def test_untrusted_pickle_is_refused(tmp_path):
    path = tmp_path / "data_0.ckpt"
    with open(path, "wb") as fh:
        pickle.dump({"input_ids": _Payload()}, fh)
    with pytest.raises(DataError, match="weights-only"):
        read_specforge_sample(path)


def test_inconsistent_sample_names_the_file(tmp_path):
    path = tmp_path / "data_0.ckpt"
    torch.save({"input_ids": torch.arange(4), "loss_mask": torch.ones(3),
                "hidden_state": torch.randn(4, 8), "aux_hidden_state": torch.randn(4, 24)}, path)
    with pytest.raises(DataError, match="data_0.ckpt.*token counts differ"):
        read_specforge_sample(path)


def test_export_writes_each_sample_alone_not_its_shard(tmp_path):
    # Rows read from a shard are views of the shard's whole tensor; torch.save writes a view's
    # entire storage, so without a copy every file holds the whole shard.
    from eyas.extract.store import write_shard

    h, t, n = 64, 10, 20
    samples = [{"id": f"s{i}", "input_ids": torch.arange(t), "loss_mask": torch.ones(t, dtype=torch.long),
                "aux_hidden": torch.randn(t, 3 * h), "final_hidden": torch.randn(t, h)} for i in range(n)]
    write_shard(tmp_path / "shard-00000", samples, storage="final", aux_layers=[1, 2, 3], hidden_size=h)
    files = export_specforge([tmp_path / "shard-00000"], tmp_path / "out")
    assert len(files) == n
    payload = t * 8 * 2 + t * 4 * h * 2  # int64 ids + mask, bf16 final + aux
    shard_bytes = (tmp_path / "shard-00000" / "data.safetensors").stat().st_size
    assert shard_bytes > 10 * payload
    for f in files:
        size = f.stat().st_size
        assert payload < size < payload + 4096, (f.name, size, payload)
    back = torch.load(files[3], weights_only=True)
    assert torch.equal(back["hidden_state"][0], samples[3]["final_hidden"].bfloat16())
