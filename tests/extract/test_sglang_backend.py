"""SGLang backend: arguments, response conversion, quarantine, errors; the engine on a GPU.

SGLang cannot run here (no GPU; it pins its own torch, so it is not installed in this
environment). Tests named ``..._with_stand_in_engine_outputs`` feed `convert_output` responses
built from a real HF forward of the same target, laid out exactly as SGLang 0.5.23 builds
them (``meta_info["hidden_states"]``: one list of 3H-float rows per prefill;
``input_top_logprobs``: None, then (logprob, token_id, text) tuples for positions 0..T-2;
``output_top_logprobs[0]``: the last position). The real engine runs only in the ``gpu`` test.
"""

import pytest
import torch
from extract_fixtures import llama8  # noqa: F401
from transformers import AutoModelForCausalLM

from eyas.errors import ConfigError, EyasError
from eyas.extract.config import ExtractConfig
from eyas.extract.hf_backend import HFBackend
from eyas.extract.sglang_backend import (
    SGLangBackend,
    build_sglang_plan,
    check_sglang_layers,
    convert_output,
    request_kwargs,
    sglang_available,
)
from eyas.extract.shards import make_backend
from eyas.extract.store import dequantize_aux
from eyas.layers import default_aux_layers, hf_hidden_states_index

AUX = [1, 3, 4]
H = 64
NO_SGLANG = ("SGLang is not installed in this environment (it pins its own torch; install "
             "eyas[sglang] in a separate environment on a GPU host)")


def _records(n=4, vocab=300, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        t = 3 + 4 * i
        ids = torch.randint(1, vocab, (t,), generator=g).tolist()
        out.append({"id": f"r{i}", "input_ids": ids, "loss_mask": [0] + [1] * (t - 1)})
    return out


@pytest.fixture(scope="module")
def model(llama8):  # noqa: F811
    return AutoModelForCausalLM.from_pretrained(llama8, dtype=torch.float32).eval()


def stand_in_output(model, ids, *, topk=None, extra_decode_row=False):
    """What ``Engine.generate`` returns for one request, built from an HF forward (see the
    module docstring for the layout, read from SGLang's scheduler and tokenizer manager)."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    aux = torch.cat([out.hidden_states[hf_hidden_states_index(i)][0] for i in AUX], -1)
    rows = aux.to(torch.bfloat16).tolist()  # SGLang runs bf16 and sends .tolist() floats
    hidden = [rows]
    if extra_decode_row:
        hidden.append(rows[-1])  # a decode step appends single rows
    meta = {"id": "x", "finish_reason": {"type": "length", "length": 1},
            "prompt_tokens": len(ids), "completion_tokens": 1, "hidden_states": hidden}
    if topk is not None:
        values, indices = torch.log_softmax(out.logits[0].float(), -1).topk(topk, -1)
        per_pos = [[(float(v), int(i), None) for v, i in zip(vr, ir, strict=True)]
                   for vr, ir in zip(values, indices, strict=True)]
        meta["input_top_logprobs"] = [None, *per_pos[:-1]]
        meta["output_top_logprobs"] = [per_pos[-1]]
    return {"output_ids": [int(out.logits[0, -1].argmax())], "meta_info": meta}


# -- arguments -------------------------------------------------------------------------------
def test_plan_uses_sglang_numbering(tmp_path):
    plan = build_sglang_plan(tmp_path, aux_layers=default_aux_layers(61), tp_size=8,
                             context_length=8192)
    assert plan.eagle3_layer_ids == [1, 29, 57]
    assert plan.server_args["return_aux_hidden_state_layer_ids"] == [1, 29, 57]
    assert plan.server_args["enable_return_aux_hidden_states"] is True
    assert plan.server_args["speculative_algorithm"] == "EAGLE3"
    cli = plan.cli_args()
    assert cli[:2] == ["--model-path", str(tmp_path)]
    i = cli.index("--return-aux-hidden-state-layer-ids")
    assert cli[i + 1: i + 4] == ["1", "29", "57"]
    assert "--tp-size" in cli and "8" in cli and "--disable-radix-cache" in cli
    assert cli[cli.index("--chunked-prefill-size") + 1] == "-1"


def test_request_asks_for_logprobs_only_for_a_teacher(tmp_path):
    plan = build_sglang_plan(tmp_path, aux_layers=AUX)
    recs = _records(2)
    kw = request_kwargs(recs, plan, "topk", 7)
    assert kw["input_ids"] == [r["input_ids"] for r in recs]
    assert kw["return_hidden_states"] is True and kw["sampling_params"][0]["max_new_tokens"] == 1
    assert (kw["return_logprob"], kw["logprob_start_len"], kw["top_logprobs_num"]) == (True, 0, 7)
    assert "return_logprob" not in request_kwargs(recs, plan, None, 7)


@pytest.mark.skipif(not sglang_available(), reason=NO_SGLANG)
def test_sglang_server_args_accept_our_arguments(tmp_path):
    import argparse

    from sglang.srt.server_args import ServerArgs

    plan = build_sglang_plan(tmp_path, aux_layers=[1, 15, 28], context_length=4096)
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(plan.cli_args())
    for key, value in plan.server_args.items():
        assert getattr(ns, key) == value, key


@pytest.mark.skipif(not sglang_available(), reason=NO_SGLANG)
def test_sglang_accepts_capture_without_a_draft(tmp_path):
    """SGLang's own check of the capture-only flags turns them into EAGLE-3 aux capture."""
    from sglang.srt.server_args import ServerArgs

    try:
        from sglang.srt.arg_groups.model_override_base import resolving_view
        from sglang.srt.arg_groups.validation_hook import handle_aux_hidden_state_capture
    except ImportError as exc:  # internal module layout of SGLang 0.5.23
        pytest.skip(f"this SGLang version lays out its argument checks otherwise: {exc}")
    args = ServerArgs(**build_sglang_plan(tmp_path, aux_layers=[1, 15, 28]).server_args)
    handle_aux_hidden_state_capture(args)
    view = resolving_view(args)
    assert view.aux_hidden_state_capture == "eagle3"
    assert view.speculative_algorithm is None  # no draft model is loaded


# -- conversion --------------------------------------------------------------------------------
@pytest.mark.parametrize("storage", ["topk", "compact", None])
def test_conversion_equals_hf_backend_with_stand_in_engine_outputs(model, storage):
    """SGLang cannot run here: responses are stand-ins built from the same HF forward."""
    recs = _records()
    hf = HFBackend(None, model=model, aux_layers=AUX, storage=storage or "topk", topk=5,
                   device="cpu")
    want = {s["id"]: s for b in hf.extract(recs, 10_000) for s in b.samples}
    for r in recs:
        out = stand_in_output(model, r["input_ids"], topk=5 if storage else None,
                              extra_decode_row=True)
        got = convert_output(r, out, storage=storage, topk=5, hidden_size=H)["sample"]
        ref = want[r["id"]]
        t = len(r["input_ids"])
        assert got["input_ids"] == r["input_ids"] and got["loss_mask"] == r["loss_mask"]
        if storage == "compact":
            assert "aux_hidden" not in got and got["aux_fp8"].dtype == torch.float8_e4m3fn
            assert got["aux_scale"].shape == (t, 3)
            aux = dequantize_aux(got["aux_fp8"], got["aux_scale"]).float()
            ref_aux = dequantize_aux(ref["aux_fp8"], ref["aux_scale"]).float()
            torch.testing.assert_close(aux, ref_aux, rtol=0.1, atol=0.1)
        else:
            assert got["aux_hidden"].dtype == torch.bfloat16
            assert got["aux_hidden"].shape == (t, 3 * H)  # the decode row was dropped
            # equal up to one bf16 step (HF batched the records with padding, here one each)
            torch.testing.assert_close(got["aux_hidden"], ref["aux_hidden"], rtol=8e-3, atol=1e-4)
        if storage is None:
            assert "topk_ids" not in got
            continue
        assert got["topk_ids"].dtype == torch.int32 and got["topk_ids"].shape == (t, 5)
        assert torch.equal(got["topk_ids"], ref["topk_ids"])  # row t predicts token t + 1
        torch.testing.assert_close(got["topk_logprobs"], ref["topk_logprobs"], rtol=2e-3,
                                   atol=1e-3)


def test_nonfinite_states_are_quarantined_with_stand_in_engine_outputs(model):
    """SGLang cannot run here: a stand-in response with NaN aux rows / an inf teacher."""
    r = _records(3)[2]
    out = stand_in_output(model, r["input_ids"], topk=4)
    out["meta_info"]["hidden_states"][0][2][7] = float("nan")
    res = convert_output(r, out, storage="topk", topk=4, hidden_size=H)
    assert res["quarantined"]["id"] == "r2"
    assert "NaN in aux_hidden at 1 position(s), first [2]" in res["quarantined"]["reason"]

    out = stand_in_output(model, r["input_ids"], topk=4)
    lp, tid, text = out["meta_info"]["input_top_logprobs"][3][0]
    out["meta_info"]["input_top_logprobs"][3][0] = (float("-inf"), tid, text)
    res = convert_output(r, out, storage="compact", topk=4, hidden_size=H)
    assert "inf in topk_logprobs" in res["quarantined"]["reason"] and "[2]" in res["quarantined"]["reason"]


def test_misshapen_responses_name_the_cause_with_stand_in_engine_outputs(model):
    """SGLang cannot run here: stand-in responses of an engine started with other flags."""
    r = _records(2)[1]
    out = stand_in_output(model, r["input_ids"], topk=3)
    out["meta_info"]["hidden_states"] = [[row[:H] for row in out["meta_info"]["hidden_states"][0]]]
    with pytest.raises(EyasError, match="enable_return_aux_hidden_states"):
        convert_output(r, out, storage="topk", topk=3, hidden_size=H)

    out = stand_in_output(model, r["input_ids"], topk=3)
    out["meta_info"]["hidden_states"] = [out["meta_info"]["hidden_states"][0][:3]]
    with pytest.raises(EyasError, match="r1: SGLang returned 3 hidden-state rows for 7"):
        convert_output(r, out, storage="topk", topk=3, hidden_size=H)

    out = stand_in_output(model, r["input_ids"], topk=3)
    out["meta_info"]["input_top_logprobs"] = out["meta_info"]["input_top_logprobs"][-2:]
    with pytest.raises(EyasError, match="logprob_start_len must be 0"):
        convert_output(r, out, storage="topk", topk=3, hidden_size=H)

    out = stand_in_output(model, r["input_ids"], topk=3)
    with pytest.raises(EyasError, match="position 0 has 3 top logprobs, expected 8"):
        convert_output(r, out, storage="topk", topk=8, hidden_size=H)

    del out["meta_info"]["hidden_states"]
    with pytest.raises(EyasError, match="no hidden states"):
        convert_output(r, out, storage=None, topk=3, hidden_size=H)


# -- backend ------------------------------------------------------------------------------------
def test_backend_refuses_what_sglang_cannot_give(llama8):  # noqa: F811
    with pytest.raises(ConfigError, match="post-norm") as exc:
        SGLangBackend(llama8, aux_layers=AUX, storage="final")
    assert exc.value.where == "extract.storage"
    with pytest.raises(ConfigError, match="layer 7 is the last of 8"):
        SGLangBackend(llama8, aux_layers=[1, 3, 7], storage="topk")
    assert check_sglang_layers([1, 3, 6], 8) == [1, 3, 6]


@pytest.mark.skipif(sglang_available(), reason="SGLang is installed here; the error is for "
                                               "environments without it")
def test_missing_sglang_is_a_clear_error(llama8):  # noqa: F811
    backend = SGLangBackend(llama8, aux_layers=AUX, storage="compact")  # no import yet
    with pytest.raises(EyasError, match=r"own environment on a GPU host: `pip install .eyas\[sglang\]."):
        backend.run_batch(_records(1))
    backend.close()  # nothing started, nothing to stop


def test_config_selects_the_backend(llama8):  # noqa: F811
    assert ExtractConfig().backend == "hf"
    assert isinstance(make_backend(llama8, AUX, ExtractConfig(storage="topk")), HFBackend)
    sg = make_backend(llama8, AUX, ExtractConfig(backend="sglang", storage="topk", tp_size=2))
    assert isinstance(sg, SGLangBackend) and sg.plan.server_args["tp_size"] == 2
    with pytest.raises(Exception, match="backend"):
        ExtractConfig(backend="vllm")


# -- the real engine ----------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not sglang_available(), reason=NO_SGLANG)
def test_engine_aux_equals_hf_backend(tiny_target):
    """SGLang's engine and the HF backend (both bf16 on the GPU) give the same aux states and
    the same top-1 teacher token on the tiny target (tolerance: bf16 kernels differ)."""
    from eyas.extract.target import resolve_aux_layers

    aux, _ = resolve_aux_layers(tiny_target, None)
    recs = _records(6, vocab=200)
    hf = HFBackend(tiny_target, aux_layers=aux, storage="topk", topk=8, device="cuda")
    want = {s["id"]: s for b in hf.extract(recs, 4096) for s in b.samples}
    del hf
    torch.cuda.empty_cache()
    with SGLangBackend(tiny_target, aux_layers=aux, storage="topk", topk=8,
                       mem_fraction_static=0.3) as sg:
        got = {s["id"]: s for b in sg.extract(recs, 4096) for s in b.samples}
    assert sorted(got) == sorted(want)
    for sid, s in got.items():
        ref = want[sid]
        torch.testing.assert_close(s["aux_hidden"].float(), ref["aux_hidden"].float(),
                                   rtol=5e-2, atol=5e-2)
        top1 = (s["topk_ids"][:, 0] == ref["topk_ids"][:, 0]).float().mean().item()
        assert top1 >= 0.9, (sid, top1)
