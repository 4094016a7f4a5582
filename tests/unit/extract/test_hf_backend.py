import pytest
import torch
from support.extract_fixtures import llama8  # noqa: F401
from transformers import AutoModelForCausalLM

from eyas.extract.hf_backend import HFBackend, plan_batches
from eyas.layers import hf_hidden_states_index

AUX = [1, 3, 4]


def _records(n=5, vocab=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        t = 4 + 5 * i
        ids = torch.randint(1, vocab, (t,), generator=g).tolist()
        out.append({"id": f"r{i}", "input_ids": ids, "loss_mask": [1] * t})
    return out


def _reference(model, ids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    aux = torch.cat([out.hidden_states[hf_hidden_states_index(i)][0] for i in AUX], -1)
    return aux, out.hidden_states[-1][0], out.logits[0]


def _close(a, b):
    torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)


@pytest.fixture(scope="module")
def model(llama8):  # noqa: F811
    return AutoModelForCausalLM.from_pretrained(llama8, dtype=torch.float32).eval()


@pytest.mark.parametrize("batch_tokens", [1, 10_000], ids=["single", "batched"])
def test_aux_and_final_equal_plain_hf_forward(model, batch_tokens):
    backend = HFBackend(None, model=model, aux_layers=AUX, storage="final", device="cpu")
    records = _records()
    results = {s["id"]: s for b in backend.extract(records, batch_tokens) for s in b.samples}
    assert len(results) == len(records)
    for r in records:
        aux, final, _ = _reference(model, r["input_ids"])
        got = results[r["id"]]
        assert got["aux_hidden"].dtype == torch.bfloat16
        assert got["aux_hidden"].shape == (len(r["input_ids"]), 3 * 64)
        _close(got["aux_hidden"], aux)
        _close(got["final_hidden"], final)  # HF's last hidden state is after the final norm


def test_batches_are_padded_together_and_match_single():
    assert plan_batches([3, 10, 5, 10], 20) == [[1, 3], [2, 0]]
    assert plan_batches([50, 2], 10) == [[0], [1]]


def test_topk_matches_log_softmax_of_logits(model):
    backend = HFBackend(None, model=model, aux_layers=AUX, storage="topk", topk=5, device="cpu")
    records = _records(3)
    results = {s["id"]: s for b in backend.extract(records, 10_000) for s in b.samples}
    for r in records:
        _, _, logits = _reference(model, r["input_ids"])
        values, indices = torch.log_softmax(logits, -1).topk(5, -1)
        got = results[r["id"]]
        assert torch.equal(got["topk_ids"].long(), indices)
        torch.testing.assert_close(got["topk_logprobs"].float(), values, rtol=1e-2, atol=1e-2)


def test_aux_only_stops_after_last_needed_layer(model):
    ran = []
    handles = [layer.register_forward_hook(lambda m, a, o, i=i: ran.append(i))
               for i, layer in enumerate(model.model.layers)]
    try:
        backend = HFBackend(None, model=model, aux_layers=AUX, storage=None, device="cpu")
        (batch,) = list(backend.extract(_records(2), 10_000))
    finally:
        for h in handles:
            h.remove()
    assert max(ran) == AUX[-1]  # layers 5..7 never ran
    assert "final_hidden" not in batch.samples[0] and batch.samples[0]["aux_hidden"].shape[1] == 192


def test_nan_in_one_sample_is_quarantined(model):
    marker = 299
    records = _records(4)
    records[2]["input_ids"][0] = marker
    seen = {}

    def remember(_m, args):
        seen["ids"] = args[0]

    def poison(_m, _a, out):
        rows = (seen["ids"][:, 0] == marker).nonzero().flatten()
        out[rows] = float("nan")
        return out

    h1 = model.model.embed_tokens.register_forward_pre_hook(remember)
    h2 = model.model.layers[2].register_forward_hook(poison)
    try:
        backend = HFBackend(None, model=model, aux_layers=AUX, storage="final", device="cpu")
        batches = list(backend.extract(records, 10_000))
    finally:
        h1.remove()
        h2.remove()
    stored = [s["id"] for b in batches for s in b.samples]
    quarantined = [q for b in batches for q in b.quarantined]
    assert sorted(stored) == ["r0", "r1", "r3"]
    assert [q["id"] for q in quarantined] == ["r2"]
    assert "NaN" in quarantined[0]["reason"]


def test_compact_quantises_on_device_with_same_teacher_as_topk(model):
    from eyas.extract.store import dequantize_aux

    recs = _records()
    topk = HFBackend(None, model=model, aux_layers=AUX, storage="topk", topk=5, device="cpu")
    compact = HFBackend(None, model=model, aux_layers=AUX, storage="compact", topk=5, device="cpu")
    ref = {s["id"]: s for b in topk.extract(recs, 10_000) for s in b.samples}
    got = [s for b in compact.extract(recs, 10_000) for s in b.samples]
    assert len(got) == len(ref) == 5
    for s in got:
        r = ref[s["id"]]
        assert "aux_hidden" not in s and s["aux_fp8"].dtype == torch.float8_e4m3fn
        assert s["aux_scale"].shape == (len(s["input_ids"]), 3)
        assert torch.equal(s["topk_ids"], r["topk_ids"])
        assert torch.equal(s["topk_logprobs"], r["topk_logprobs"])
        aux = dequantize_aux(s["aux_fp8"], s["aux_scale"]).float()
        want = r["aux_hidden"].float()
        row_max = want.reshape(len(want), 3, -1).abs().amax(-1)
        err = (aux - want).abs().reshape(len(want), 3, -1).amax(-1)
        assert bool((err <= 0.07 * row_max + 1e-6).all())


def test_compute_dtype_loads_the_target_in_it_and_joins_the_shard_settings(llama8):  # noqa: F811
    from eyas.extract.config import ExtractConfig
    from eyas.extract.shards import make_backend, storage_settings

    auto, bf16 = ExtractConfig(), ExtractConfig(compute_dtype="bfloat16")
    assert "compute_dtype" not in storage_settings(auto)  # shards made before it still hold
    assert storage_settings(bf16)["compute_dtype"] == "bfloat16"
    assert next(make_backend(llama8, AUX, auto).model.parameters()).dtype == torch.float32
    backend = make_backend(llama8, AUX, bf16)
    assert next(backend.model.parameters()).dtype == torch.bfloat16
    (batch,) = list(backend.extract(_records(n=1), 10_000))
    aux, _, _ = _reference(AutoModelForCausalLM.from_pretrained(llama8).eval(),
                           _records(n=1)[0]["input_ids"])
    torch.testing.assert_close(batch.samples[0]["aux_hidden"].float(), aux, rtol=5e-2, atol=5e-2)
