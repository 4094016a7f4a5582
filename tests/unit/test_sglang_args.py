"""SGLang 0.5.23's server-argument names as eyas pins them (``eyas/sglang_args.py``): held against
SGLang's own ``ServerArgs`` where a python with SGLang is at hand (this interpreter, or
``EYAS_SGLANG_PYTHON``), and against SGLang's source tree where it is unpacked
(``EYAS_SGLANG_SOURCE``, the ``sglang`` package folder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.paths import REPO
from support.sglang_env import sglang_python, sglang_source

from eyas.errors import ConfigError
from eyas.sglang_args import NAMES_FILE, SERVER_ARGS, SET_BY_EYAS, check_engine_args


def test_the_table_holds_the_arguments_eyas_sets_and_the_usual_memory_knobs():
    assert NAMES_FILE.name == "sglang-0.5.23-server-args.txt"
    assert set(SET_BY_EYAS) <= SERVER_ARGS
    assert {"speculative_algorithm", "dtype", "mem_fraction_static", "context_length",
            "chunked_prefill_size", "max_running_requests", "attention_backend",
            "max_prefill_tokens", "kv_cache_dtype", "cuda_graph_max_bs_decode"} <= SERVER_ARGS
    assert "cuda_graph_max_bs" not in SERVER_ARGS  # renamed in 0.5.23: a typo would pass
    assert not any(name.startswith("_") or "-" in name for name in SERVER_ARGS)


def test_check_engine_args_lists_every_problem_at_once():
    with pytest.raises(ConfigError) as exc:
        check_engine_args({"mem_fracton_static": 0.9, "model_path": "/m", "dtype": "auto"},
                          where="my.yaml: extract.engine_args")
    msg = str(exc.value)
    assert msg.startswith("my.yaml: extract.engine_args: 'mem_fracton_static' is not")
    assert "close: mem_fraction_static" in msg
    assert "'model_path' is set by eyas (the target folder (target.model))" in msg
    assert "'dtype'" not in msg
    assert check_engine_args({"dtype": "auto"}) == {"dtype": "auto"}


_FIELDS = r"""
import json, sglang
from sglang.srt.arg_groups.arg_utils import record_fields
from sglang.srt.server_args import ServerArgs
print(json.dumps({"version": sglang.__version__, "names": sorted(
    f.name for f in record_fields(ServerArgs) if not f.name.startswith("_"))}))
"""


@pytest.mark.skipif(sglang_python() is None,
                    reason="no python with SGLang here (GPU hosts; or set EYAS_SGLANG_PYTHON)")
def test_pinned_names_are_sglang_own_server_args():  # pragma: no cover
    res = subprocess.run([sglang_python(), "-c", _FIELDS], capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.splitlines()[-1])
    assert got["version"] == "0.5.23"
    assert set(got["names"]) == SERVER_ARGS


def _sglang_source() -> Path | None:
    return sglang_source("srt/arg_groups/fields")


@pytest.mark.skipif(_sglang_source() is None,
                    reason="no SGLang source tree here (set EYAS_SGLANG_SOURCE)")
def test_the_pinning_script_reads_the_same_names_from_sglang_source():  # pragma: no cover
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from pin_sglang_server_args import field_names
    finally:
        sys.path.pop(0)
    assert set(field_names(_sglang_source())) == SERVER_ARGS


_PLAN = r"""
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
d = json.loads(sys.argv[1])
p = argparse.ArgumentParser()
ServerArgs.add_cli_args(p)
ns = p.parse_args(d["argv"])                       # an unknown flag exits 2
built = ServerArgs(**d["kw"])                      # what Engine(**kw) builds
print(json.dumps({"cli": {k: getattr(ns, k) for k in d["kw"]},
                  "engine": {k: getattr(built, k) for k in [*d["kw"], "dtype"]}}))
"""


@pytest.mark.skipif(sglang_python() is None,
                    reason="no python with SGLang here (GPU hosts; or set EYAS_SGLANG_PYTHON)")
def test_recipe_engine_args_reach_sglang_own_server_args(tmp_path):  # pragma: no cover
    """The Kimi recipe's plan, as Engine keywords and as launch_server flags, in SGLang's own
    ServerArgs: every value arrives, and the engine computes in the model's dtype ("auto")
    although extract.dtype is float16."""
    from eyas.config import load_config
    from eyas.extract.sglang_backend import build_sglang_plan

    x = load_config(REPO / "recipes" / "kimi-k2.5.yaml").extract
    plan = build_sglang_plan(tmp_path, aux_layers=x.aux_layers, num_layers=61,
                             architecture="KimiK25ForConditionalGeneration",
                             spool_dir=tmp_path / "spool", storage="compact", dtype="float16",
                             tp_size=x.tp_size, engine_args=x.engine_args)
    res = subprocess.run([sglang_python(), "-c", _PLAN, json.dumps(
        {"argv": plan.cli_args(), "kw": plan.server_args})], capture_output=True, text=True,
        timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.splitlines()[-1])
    assert got["cli"] == plan.server_args
    assert {k: got["engine"][k] for k in plan.server_args} == plan.server_args
    assert got["engine"]["dtype"] == "auto"
    assert {k: got["engine"][k] for k in x.engine_args} == x.engine_args


def test_language_model_only_follows_sglang_list():
    """The pinned copy of SGLang's list decides where SGLang does not import (this control
    plane): Kimi's wrapper is not in 0.5.23's list, DeepSeek-V4 is."""
    from eyas.sglang_args import (
        PINNED_LANGUAGE_MODEL_ONLY,
        language_model_only_architectures,
        runs_language_model_only,
    )

    assert "DeepseekV4ForCausalLM" in PINNED_LANGUAGE_MODEL_ONLY
    assert "KimiK25ForConditionalGeneration" not in PINNED_LANGUAGE_MODEL_ONLY
    if sglang_python() != sys.executable:  # no SGLang in this interpreter: the pinned copy
        assert language_model_only_architectures() == PINNED_LANGUAGE_MODEL_ONLY
    assert not runs_language_model_only("KimiK25ForConditionalGeneration")
    assert not runs_language_model_only(None) and not runs_language_model_only("LlamaForCausalLM")
    assert runs_language_model_only("DeepseekV4ForCausalLM")


@pytest.mark.skipif(_sglang_source() is None,
                    reason="no SGLang source tree here (set EYAS_SGLANG_SOURCE)")
def test_the_pinning_script_reads_the_same_language_model_only_list():  # pragma: no cover
    from support.repo_scripts import load_module

    from eyas.sglang_args import PINNED_LANGUAGE_MODEL_ONLY

    script = load_module(REPO / "scripts" / "pin_sglang_server_args.py")
    got = script.language_model_only_architectures(_sglang_source())
    assert tuple(got) == PINNED_LANGUAGE_MODEL_ONLY


_LM_ONLY = r"""
import json
from sglang.srt.server_args import ServerArgs
print(json.dumps(list(ServerArgs.LANGUAGE_MODEL_ONLY_ARCHITECTURES)))
"""


@pytest.mark.skipif(sglang_python() is None,
                    reason="no python with SGLang here (GPU hosts; or set EYAS_SGLANG_PYTHON)")
def test_pinned_language_model_only_list_is_sglang_own():  # pragma: no cover
    from eyas.sglang_args import PINNED_LANGUAGE_MODEL_ONLY

    res = subprocess.run([sglang_python(), "-c", _LM_ONLY], capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert tuple(json.loads(res.stdout.splitlines()[-1])) == PINNED_LANGUAGE_MODEL_ONLY


_RESOLVE = r"""
import json, sys
from sglang.srt.server_args import ServerArgs
d = json.loads(sys.argv[1])
out = {}
for name, kw in d.items():
    args = ServerArgs(**kw)
    try:
        args.resolve_once()                        # SGLang's whole argument pipeline
    except Exception as exc:
        out[name] = {"error": f"{type(exc).__name__}: {exc}"}
        continue
    out[name] = {k: getattr(args, k) for k in
                 ("language_model_only", "enable_return_aux_hidden_states",
                  "return_aux_hidden_state_layer_ids", "disable_radix_cache",
                  "chunked_prefill_size", "context_length", "skip_tokenizer_init")}
print(json.dumps(out, default=str))
"""


@pytest.mark.skipif(sglang_python(model_code=True) is None,
                    reason="no python with SGLang, torch and transformers here (GPU hosts; or "
                           "set EYAS_SGLANG_PYTHON to a side venv that has them)")
def test_kimi_plan_resolves_through_sglang_own_argument_hooks(tmp_path):  # pragma: no cover
    """eyas's plan for the Kimi replica (Kimi-K2.5's wrapper class and config layout) with the
    recipe's engine_args, built into SGLang's real ServerArgs and resolved by its own
    ``resolve_once`` (every argument hook, ``handle_encoder_disaggregation`` ->
    ``handle_language_model_only`` among them) without error. The one addition is
    ``device="cpu"``: SGLang resolves the device first and this machine has no accelerator.
    The control -- the same plan with ``language_model_only`` -- must fail as SGLang 0.5.23
    fails it, so the test can tell."""
    from eyas.config import load_config
    from eyas.extract.sglang_backend import build_sglang_plan
    from eyas.extract.target import target_shape
    from eyas.tiny.kimi_replica import build_kimi_replica

    model = build_kimi_replica()
    shape = target_shape(model)
    assert shape.architecture == "KimiK25ForConditionalGeneration"
    x = load_config(REPO / "recipes" / "kimi-k2.5.yaml").extract
    # the replica has 2,048 positions; SGLang refuses a longer context_length than the model's
    engine_args = {**x.engine_args, "context_length": 2048}
    plan = build_sglang_plan(model, aux_layers=[1, 3, 5], num_layers=shape.num_layers,
                             architecture=shape.architecture, spool_dir=tmp_path / "spool",
                             storage="compact", trust_remote_code=True,
                             engine_args=engine_args)
    assert "language_model_only" not in plan.server_args
    runs = {"plan": {**plan.server_args, "device": "cpu"},
            "with_flag": {**plan.server_args, "device": "cpu", "language_model_only": True}}
    res = subprocess.run([sglang_python(model_code=True), "-c", _RESOLVE, json.dumps(runs)],
                         capture_output=True, text=True, timeout=900,
                         env={**os.environ, "HF_HUB_OFFLINE": "1",
                              "TRANSFORMERS_OFFLINE": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.splitlines()[-1])
    assert "error" not in got["plan"], got["plan"]
    assert got["plan"]["language_model_only"] is False
    assert got["plan"]["enable_return_aux_hidden_states"] is True
    assert got["plan"]["return_aux_hidden_state_layer_ids"] == plan.sglang_layer_ids
    assert got["plan"]["disable_radix_cache"] is True and got["plan"]["skip_tokenizer_init"]
    assert got["plan"]["chunked_prefill_size"] == x.engine_args["chunked_prefill_size"]
    assert got["plan"]["context_length"] == 2048
    assert got["with_flag"]["error"].startswith(
        "ValueError: --language-model-only does not support ['KimiK25ForConditionalGeneration']")
