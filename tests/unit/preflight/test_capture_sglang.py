"""Check 4 with the SGLang backend, standing in for SGLang (it cannot run here): the capture
hook's aux rows for one sample against SGLang's own ``return_hidden_states`` output for it
(``tests/unit/extract/sglang_stand_ins.py``: the shapes and format SGLang 0.5.23 returns), and the
engine's memory figures."""

from pathlib import Path

import pytest
import torch
from extract.sglang_stand_ins import stand_in_sglang  # tests/ is on the path (rootdir)
from transformers import AutoModelForCausalLM

from eyas.extract import sglang_backend
from eyas.extract.config import ExtractConfig
from eyas.layers import to_sglang_ids
from eyas.preflight.capture import check_capture
from eyas.preflight.result import bounded
from eyas.train.tiny_data import tiny_records, write_jsonl


@pytest.fixture(scope="module")
def model(tiny_target):
    return AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32).eval()


def _check(tmp_path, tiny_target, monkeypatch, module, **cfg):
    monkeypatch.setattr(sglang_backend, "import_sglang", lambda: module)
    merged = write_jsonl(tmp_path / "merged.jsonl", tiny_records(tiny_target, 3))
    return bounded("capture", lambda: check_capture(
        merged=merged, work=tmp_path / "pf", model_dir=tiny_target,
        cfg=ExtractConfig(backend="sglang", storage="topk", topk=8, **cfg), samples=3,
        total_tokens=10_000, architecture="LlamaForCausalLM"), 120)


@pytest.mark.parametrize("chunk", [None, 16])
def test_hook_rows_equal_sglangs_own_return_hidden_states_standing_in_for_sglang(
        tmp_path, tiny_target: Path, model, monkeypatch, chunk):
    module = stand_in_sglang(model, chunk=chunk)
    r = _check(tmp_path, tiny_target, monkeypatch, module)
    assert r.ok, (r.detail, r.fix)
    assert "equal to SGLang's own return_hidden_states for sample" in r.detail
    if chunk:  # SGLang returns only the last chunk's rows
        assert "rows, chunked prefill" in r.detail
    (engine,) = module.engines
    # preflight's engine only: started so that requests may ask for hidden states
    assert engine.server_args["enable_return_hidden_states"] is True
    assert engine.shut
    assert "engine memory: weights 0.0 GB, KV cache 0.5 GB (65,536 tokens), 12.2 GB free" \
        in r.detail
    assert "not run" not in r.partial and "peak memory during the capture" in r.partial
    # the extraction's own engine never asks for them
    plan = sglang_backend.build_sglang_plan(
        tiny_target, aux_layers=[0, 1, 2], num_layers=4, architecture="LlamaForCausalLM",
        spool_dir=tmp_path / "s")
    assert "enable_return_hidden_states" not in plan.server_args


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_rows_off_by_one_layer_fail_naming_the_fix_standing_in_for_sglang(
        tmp_path, tiny_target: Path, model, monkeypatch, dtype):
    r = _check(tmp_path, tiny_target, monkeypatch, stand_in_sglang(model, returned_shift=1),
               dtype=dtype)
    assert not r.ok
    sglang_ids = to_sglang_ids([0, 1, 2], "LlamaForCausalLM")
    assert "the capture hook's aux rows differ from SGLang's own return_hidden_states at " \
           f"layers [0, 1, 2] (SGLang {sglang_ids})" in r.detail
    assert "aux layers shifted by one" in r.fix and "return_aux_hidden_state_layer_ids" in r.fix
    assert "storage dtype (extract.dtype" in r.fix


def test_storage_rounding_beyond_the_dtype_fails_standing_in_for_sglang(
        tmp_path, tiny_target: Path, model, monkeypatch):
    """The hook storing coarser values than its dtype promises (here: rounded to float8 while
    extract.dtype says bfloat16) is a mismatch too."""
    from eyas.extract import sglang_hook

    real = sglang_hook.CaptureHook.__call__

    def coarse(self, module, args, output):
        args = list(args)
        args[4] = args[4].to(torch.float8_e4m3fn).float()
        return real(self, module, tuple(args), output)

    monkeypatch.setattr(sglang_hook.CaptureHook, "__call__", coarse)
    r = _check(tmp_path, tiny_target, monkeypatch, stand_in_sglang(model))
    assert not r.ok and "relative error" in r.detail and "storage dtype" in r.fix, r.detail


def test_no_hidden_states_back_fails_and_stops_the_engine_standing_in_for_sglang(
        tmp_path, tiny_target: Path, model, monkeypatch):
    from extract.sglang_stand_ins import StandInEngine

    monkeypatch.setattr(StandInEngine, "_returned_rows", lambda self, ids, aux: None)
    module = stand_in_sglang(model)
    r = _check(tmp_path, tiny_target, monkeypatch, module)
    assert not r.ok and "SGLang returned no hidden states" in r.detail
    assert "enable_return_hidden_states" in r.fix
    (engine,) = module.engines
    assert engine.shut  # the capture never ran, the engine is shut down all the same
