"""SGLang 0.5.23's server-argument names as eyas pins them (``eyas/sglang_args.py``): held against
SGLang's own ``ServerArgs`` where a python with SGLang is at hand (this interpreter, or
``EYAS_SGLANG_PYTHON``), and against SGLang's source tree where it is unpacked
(``EYAS_SGLANG_SOURCE``, the ``sglang`` package folder)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sglang_env import sglang_python, sglang_source

from eyas.errors import ConfigError
from eyas.sglang_args import NAMES_FILE, SERVER_ARGS, SET_BY_EYAS, check_engine_args

REPO = Path(__file__).resolve().parents[1]


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
