"""SGLang backend: engine flags, the capture hook, the spool collector, the backend; the engine
on a GPU.

SGLang cannot run here (no GPU; it pins its own torch, so it is not installed in this
environment). Tests named ``..._against_sglang_source_shapes`` drive eyas's hook with stand-in
arguments shaped exactly as SGLang 0.5.23 passes them to its logits processor
(``sglang_stand_ins.py``), filled from a real HF forward of the same target, and compare the
result with the HF backend. Tests that import SGLang itself are skipped where it is absent;
the real engine runs only in the ``gpu`` test and ``scripts/gpu_check.sh sglang``.
"""

import json
import socket
import sys
import types

import pytest
import torch
from support.extract_fixtures import llama8, write_merged  # noqa: F401
from transformers import AutoModelForCausalLM

from eyas.config import parse_config
from eyas.errors import ConfigError, EyasError
from eyas.extract.config import ExtractConfig
from eyas.extract.hf_backend import HFBackend
from eyas.extract.sglang_backend import (
    SGLANG_VERSION,
    SGLangBackend,
    build_sglang_plan,
    check_sglang_version,
    clean_stale_spools,
    hook_spec,
    import_sglang,
    request_kwargs,
    returned_aux_rows,
    sample_from_spool,
    sglang_available,
)
from eyas.extract.sglang_hook import CaptureHook, local_topk, merge_topk, teacher_topk
from eyas.extract.sglang_spool import collect_request, hook_errors, wait_for_requests
from eyas.extract.shards import extract_shard, make_backend, plan_shards
from eyas.extract.store import dequantize_aux, iter_samples

from .sglang_stand_ins import (
    StandInEngine,
    StandInLMHead,
    StandInLogitsProcessor,
    StandInMode,
    forward_args,
    hf_states,
)

AUX = [1, 3, 4]
H = 64
KIMI = "KimiK25ForConditionalGeneration"
NO_SGLANG = ("SGLang is not installed in this environment (it pins its own torch; install "
             "eyas[sglang] in a separate environment on a GPU host)")


def _records(n=4, vocab=300, seed=1, step=4):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        t = 3 + step * i
        ids = torch.randint(1, vocab, (t,), generator=g).tolist()
        out.append({"id": f"r{i}", "input_ids": ids, "loss_mask": [0] + [1] * (t - 1)})
    return out


@pytest.fixture(scope="module")
def model(llama8):  # noqa: F811
    return AutoModelForCausalLM.from_pretrained(llama8, dtype=torch.float32).eval()


def _plan(tmp_path, **kw):
    base = dict(aux_layers=[1, 29, 57], num_layers=61, architecture=KIMI,
                spool_dir=tmp_path / "spool")
    base.update(kw)
    return build_sglang_plan(tmp_path, **base)


# -- engine flags ------------------------------------------------------------------------------
def test_plan_maps_layers_per_family_and_attaches_the_hook(tmp_path):
    plan = _plan(tmp_path, tp_size=8, context_length=8192, storage="compact")
    assert plan.server_args["return_aux_hidden_state_layer_ids"] == [1, 29, 57]
    assert _plan(tmp_path, aux_layers=[3, 30, 57]).sglang_layer_ids == [4, 31, 58]
    assert _plan(tmp_path, aux_layers=[3, 15, 28], num_layers=32,
                 architecture="LlamaForCausalLM").sglang_layer_ids == [3, 15, 28]
    with pytest.raises(ConfigError, match=r"cannot capture layers \[0, 29, 57\]"):
        _plan(tmp_path, aux_layers=[0, 29, 57])
    args = plan.server_args
    assert args["enable_return_aux_hidden_states"] and args["speculative_algorithm"] == "EAGLE3"
    assert "enable_return_hidden_states" not in args  # no Python lists leave SGLang
    assert args["forward_hooks"] == [hook_spec(tmp_path / "spool", storage="compact", topk=32,
                                               dtype="bfloat16")]
    cli = plan.cli_args()
    assert cli[:2] == ["--model-path", str(tmp_path)]
    i = cli.index("--return-aux-hidden-state-layer-ids")
    assert cli[i + 1: i + 4] == ["1", "29", "57"]
    hooks = json.loads(cli[cli.index("--forward-hooks") + 1])
    assert hooks[0]["hook_factory"] == "eyas.extract.sglang_hook:capture_hook"
    assert hooks[0]["config"]["storage"] == "compact"
    assert cli[cli.index("--chunked-prefill-size") + 1] == "-1"
    assert "--tp-size" in cli and "--disable-radix-cache" in cli
    # SGLang 0.5.23 refuses --language-model-only for Kimi's wrapper (handle_language_model_only
    # accepts only ServerArgs.LANGUAGE_MODEL_ONLY_ARCHITECTURES): never passed for it
    assert "language_model_only" not in args and "--language-model-only" not in cli
    flat = _plan(tmp_path, aux_layers=[3, 15, 28], num_layers=32, architecture="LlamaForCausalLM")
    assert "language_model_only" not in flat.server_args
    # an architecture in SGLang's own list gets it
    v4 = _plan(tmp_path, architecture="DeepseekV4ForCausalLM")
    assert v4.server_args["language_model_only"] is True
    assert "--language-model-only" in v4.cli_args()


def test_engine_runs_the_model_dtype_not_the_storage_dtype(tmp_path):
    """extract.dtype is the hook's storage dtype; the engine computes in the model's own
    (SGLang's "auto") unless engine_args names a dtype."""
    plan = _plan(tmp_path, dtype="float16")
    assert "dtype" not in plan.server_args and "--dtype" not in plan.cli_args()
    assert plan.server_args["forward_hooks"][0]["config"]["dtype"] == "float16"
    assert _plan(tmp_path, engine_args={"dtype": "bfloat16"}).server_args["dtype"] == "bfloat16"


def test_engine_args_reach_the_engine_and_replace_eyas_defaults(tmp_path):
    extra = {"mem_fraction_static": 0.9, "context_length": 8192, "chunked_prefill_size": 8192,
             "max_running_requests": 32, "attention_backend": "triton",
             "json_model_override_args": '{"x": 1}', "enable_metrics": True}
    plan = _plan(tmp_path, tp_size=8, engine_args=extra)
    assert {k: plan.server_args[k] for k in extra} == extra
    assert plan.server_args["tp_size"] == 8 and plan.server_args["disable_radix_cache"] is True
    cli = plan.cli_args()
    for flag, value in [("--mem-fraction-static", "0.9"), ("--context-length", "8192"),
                        ("--chunked-prefill-size", "8192"), ("--max-running-requests", "32"),
                        ("--attention-backend", "triton"),
                        ("--json-model-override-args", '{"x": 1}')]:
        assert cli[cli.index(flag) + 1] == value, flag
    assert "--enable-metrics" in cli
    assert cli.count("--chunked-prefill-size") == 1  # replaced, not repeated


def test_unknown_or_reserved_engine_args_are_refused_naming_key_and_field(tmp_path):
    with pytest.raises(ConfigError, match=r"extract\.engine_args: 'mem_fraction' is not a server "
                                          r"argument of SGLang 0\.5\.23 \(close: "
                                          r"mem_fraction_static") as exc:
        _plan(tmp_path, engine_args={"mem_fraction": 0.9})
    assert exc.value.where == "extract.engine_args"
    with pytest.raises(ConfigError, match=r"'tp_size' is set by eyas \(extract\.tp_size\)"):
        _plan(tmp_path, engine_args={"tp_size": 4})
    with pytest.raises(ConfigError, match=r"'speculative_draft_model_path': extraction loads "
                                          r"no draft model"):
        _plan(tmp_path, engine_args={"speculative_draft_model_path": "/d"})
    with pytest.raises(ConfigError, match=r"'forward_hooks' is set by eyas"):
        SGLangBackend(_deepseek(tmp_path), aux_layers=[2, 3, 5], storage="final",
                      engine_args={"forward_hooks": []})
    # the YAML is checked when it is loaded, naming the field
    with pytest.raises(ConfigError, match=r"run\.yaml: invalid configuration:\n  "
                                          r"extract\.engine_args: .*'context_len' is not a "
                                          r"server argument.*close: context_length"):
        parse_config({"name": "x", "target": {"model": "m"}, "datasets": [],
                      "extract": {"backend": "sglang", "engine_args": {"context_len": 8192}}},
                     where="run.yaml")
    assert ExtractConfig(engine_args={"context_length": 8192}).engine_args == {
        "context_length": 8192}


def test_engine_args_travel_to_the_host_job_and_reach_its_engine(llama8, tmp_path):  # noqa: F811
    """The flow runs `python -m eyas.extract.run` on the GPU host with the whole config as
    JSON: the job's backend gets the same engine arguments."""
    import json as _json
    import shlex

    from eyas.extract.run import build_parser, command
    from eyas.flags import config_from_flags

    cfg = ExtractConfig(backend="sglang", engine_args={"mem_fraction_static": 0.8,
                                                       "context_length": 9216})
    argv = shlex.split(command("/venv/bin/python", merged="m.jsonl", out="o", model=str(llama8),
                               cfg=cfg))[3:]
    args = build_parser().parse_args(argv)
    job_cfg = config_from_flags(ExtractConfig, args, _json.loads(args.config_json))
    sg = make_backend(llama8, AUX, job_cfg, out_root=tmp_path / "hidden" / "train")
    assert {k: sg.plan.server_args[k] for k in ("mem_fraction_static", "context_length")} == {
        "mem_fraction_static": 0.8, "context_length": 9216}


def _deepseek(tmp_path):
    ds = tmp_path / "ds"
    ds.mkdir(exist_ok=True)
    (ds / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 8, "hidden_size": 64,
        "vocab_size": 300}))
    return ds


def test_requests_ask_for_nothing_but_one_token(tmp_path):
    plan = _plan(tmp_path)
    recs = _records(2)
    kw = request_kwargs(recs, ["eyas-a", "eyas-b"], plan)
    assert kw == {"input_ids": [r["input_ids"] for r in recs], "rid": ["eyas-a", "eyas-b"],
                  "sampling_params": [{"max_new_tokens": 1, "temperature": 0.0}] * 2}


def test_returned_hidden_states_are_read_against_sglang_source_shapes(model):
    """``meta_info["hidden_states"]`` as SGLang 0.5.23 returns it for a prefill with aux
    capture (``_append_prefill_hidden_states``: one entry of [n][3H] Python floats; with
    chunked prefill only the last chunk's rows), read by `returned_aux_rows`."""
    ids = _records(3)[2]["input_ids"]
    aux, _ = hf_states(model, ids, AUX)
    processor = StandInLogitsProcessor(300)
    for chunk, rows in ((None, len(ids)), (4, len(ids) - 8)):
        engine = StandInEngine(model, AUX, processor, StandInLMHead(model.lm_head.weight),
                               chunk=chunk)
        (out,) = engine.generate(input_ids=[ids], sampling_params=[{"max_new_tokens": 1}],
                                 rid=["other-1"], return_hidden_states=True)
        assert isinstance(out["meta_info"]["hidden_states"][0][0][0], float)
        torch.testing.assert_close(returned_aux_rows(out, width=3 * H), aux[-rows:])
    with pytest.raises(EyasError, match="enable_return_hidden_states"):
        returned_aux_rows({"meta_info": {}}, width=3 * H)
    with pytest.raises(EyasError, match=r"shape \(1, 64\), expected rows of 192"):
        returned_aux_rows({"meta_info": {"hidden_states": [[0.5] * 64]}}, width=3 * H)


@pytest.mark.skipif(not sglang_available(), reason=NO_SGLANG)
def test_sglang_server_args_accept_our_arguments(tmp_path):
    import argparse

    from sglang.srt.server_args import ServerArgs

    plan = _plan(tmp_path, aux_layers=[1, 15, 28], num_layers=32,
                 architecture="LlamaForCausalLM", context_length=4096)
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(plan.cli_args())
    for key, value in plan.server_args.items():
        assert getattr(ns, key) == value, key


@pytest.mark.skipif(not sglang_available(), reason=NO_SGLANG)
def test_sglang_accepts_capture_without_a_draft(tmp_path):
    """SGLang's own check of the capture-only flags turns them into EAGLE-3 aux capture."""
    from sglang.srt.arg_groups.model_override_base import resolving_view
    from sglang.srt.arg_groups.validation_hook import handle_aux_hidden_state_capture
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(**_plan(tmp_path).server_args)
    handle_aux_hidden_state_capture(args)
    view = resolving_view(args)
    assert view.aux_hidden_state_capture == "eagle3"
    assert view.speculative_algorithm is None  # no draft model is loaded
    assert view.forward_hooks[0]["hook_factory"] == "eyas.extract.sglang_hook:capture_hook"


class _KimiLikeWrapper(torch.nn.Module):
    """KimiK25ForConditionalGeneration's module tree (srt/models/kimi_k25.py): vision_tower,
    mm_projector, language_model; ``model`` a property aliasing language_model, and setting
    ``model`` ignored (so the logits processor is registered once, under language_model.)."""

    def __init__(self, language_model):
        super().__init__()
        self.vision_tower = torch.nn.Linear(2, 2)
        self.mm_projector = torch.nn.Linear(2, 2)
        self.language_model = language_model

    @property
    def model(self):
        return self.language_model

    def __setattr__(self, name, value):
        if name != "model":
            super().__setattr__(name, value)


@pytest.mark.skipif(not sglang_available(), reason=NO_SGLANG)
@pytest.mark.parametrize("prefix", ["", "language_model."])
def test_sglang_hook_manager_attaches_one_hook_with_stand_in_tp_group(tmp_path, monkeypatch,
                                                                      prefix):
    """SGLang's own hook manager resolves our factory and attaches it once, to the logits
    processor of a Llama/DeepSeek-shaped model and of Kimi-K2.5's wrapper (language_model.*).
    SGLang's distributed state cannot start here: its TP group is a stand-in (world 1)."""
    import sglang.srt.distributed as sgl_dist
    from sglang.srt.model_executor.hook_manager import register_forward_hooks

    monkeypatch.setattr(sgl_dist, "get_tp_group", lambda: types.SimpleNamespace(
        world_size=1, rank_in_group=0, device_group=None), raising=False)
    inner = torch.nn.Module()
    inner.logits_processor = StandInLogitsProcessor(300)
    inner.lm_head = torch.nn.Linear(H, 300)
    inner.model = torch.nn.Module()
    model = inner if not prefix else _KimiLikeWrapper(inner)
    if prefix:
        model.model = inner  # what SGLang's model runner does; the wrapper drops it
    spec = hook_spec(tmp_path, storage="topk", topk=4, dtype="bfloat16")
    register_forward_hooks(model, [spec])
    hooked = [name for name, m in model.named_modules() if m._forward_hooks]
    assert hooked == [prefix + "logits_processor"]
    hook = next(iter(inner.logits_processor._forward_hooks.values()))
    assert isinstance(hook, CaptureHook) and hook.rank == 0 and hook.storage == "topk"


# -- the teacher over a split vocabulary --------------------------------------------------------
@pytest.mark.parametrize("world", [1, 2, 3])
def test_vocab_parallel_topk_equals_the_full_softmax(world):
    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(10, 16, generator=g), torch.randn(37, 16, generator=g)
    parts = []
    for rank in range(world):
        head = StandInLMHead(weight, rank=rank, world=world)
        si = head.shard_indices
        parts.append(local_topk(hidden, head.weight, first_id=si.org_vocab_start_index,
                                valid_rows=si.org_vocab_end_index - si.org_vocab_start_index, k=5))
    ids, logp = merge_topk(*(torch.stack([p[i] for p in parts]) for i in range(3)), k=5)
    want_lp, want_ids = torch.log_softmax(hidden @ weight.T, -1).topk(5, -1)
    assert torch.equal(ids, want_ids.to(torch.int32))
    torch.testing.assert_close(logp, want_lp, rtol=1e-5, atol=1e-5)


# -- hook + collector against the HF backend ----------------------------------------------------
def _hook(tmp_path, storage, topk=5, rank=0, gather=None):
    spool = tmp_path / "spool"
    spool.mkdir(parents=True, exist_ok=True)
    hook = CaptureHook({"spool_dir": str(spool), "storage": storage, "topk": topk,
                        "dtype": "bfloat16"}, rank=rank, gather=gather)
    return hook, spool


def _rid(r):
    return f"eyas-{r['id']}"


def _hf_samples(model, recs, storage):
    hf = HFBackend(None, model=model, aux_layers=AUX, storage=storage, topk=5, device="cpu")
    return {s["id"]: s for b in hf.extract(recs, 10_000) for s in b.samples}


def _assert_same(got, ref, storage, t):
    assert got["input_ids"] == ref["input_ids"] and got["loss_mask"] == ref["loss_mask"]
    if storage == "compact":
        assert got["aux_fp8"].dtype == torch.float8_e4m3fn and got["aux_scale"].shape == (t, 3)
        torch.testing.assert_close(dequantize_aux(got["aux_fp8"], got["aux_scale"]).float(),
                                   dequantize_aux(ref["aux_fp8"], ref["aux_scale"]).float(),
                                   rtol=0.1, atol=0.1)
    else:
        assert got["aux_hidden"].dtype == torch.bfloat16 and got["aux_hidden"].shape == (t, 3 * H)
        torch.testing.assert_close(got["aux_hidden"], ref["aux_hidden"], rtol=8e-3, atol=1e-4)
    if storage == "final":
        torch.testing.assert_close(got["final_hidden"], ref["final_hidden"], rtol=8e-3, atol=1e-4)
    if storage in ("topk", "compact"):
        assert got["topk_ids"].dtype == torch.int32 and got["topk_ids"].shape == (t, 5)
        assert torch.equal(got["topk_ids"], ref["topk_ids"])  # row t predicts token t + 1
        torch.testing.assert_close(got["topk_logprobs"], ref["topk_logprobs"], rtol=2e-3,
                                   atol=1e-3)


@pytest.mark.parametrize("storage", ["final", "topk", "compact", None])
@pytest.mark.parametrize("packed", [True, False], ids=["deepseek-packed", "llama-list"])
def test_hook_and_collector_equal_hf_backend_against_sglang_source_shapes(model, tmp_path,
                                                                         storage, packed):
    """One forward holding four requests of mixed lengths, as SGLang batches a prefill."""
    recs = _records()
    want = _hf_samples(model, recs, storage)
    hook, spool = _hook(tmp_path, storage)
    processor = StandInLogitsProcessor(300)
    processor.register_forward_hook(hook)
    tokens = {_rid(r): r["input_ids"] for r in recs}
    states = {rid: hf_states(model, ids, AUX) for rid, ids in tokens.items()}
    pieces = [(rid, 0, len(ids)) for rid, ids in tokens.items()]
    processor(*forward_args(states, tokens, pieces, StandInLMHead(model.lm_head.weight),
                            packed=packed))
    hook.close()
    assert not hook.failed, hook_errors(spool)
    collected = wait_for_requests(spool, tokens, timeout_s=5)
    for r in recs:
        got = sample_from_spool(r, collected[_rid(r)], storage=storage, hidden_size=H, topk=5)
        _assert_same(got["sample"], want[r["id"]], storage, len(r["input_ids"]))


def test_chunked_prefill_is_assembled_against_sglang_source_shapes(model, tmp_path):
    """A prompt split over three forwards (extend_prefix_lens 0, 8, 16), sharing them with
    other requests: the collector waits for the missing chunk, then assembles all rows."""
    recs = _records(3, step=9)  # 3, 12, 21 tokens
    want = _hf_samples(model, recs, "topk")
    hook, spool = _hook(tmp_path, "topk")
    processor = StandInLogitsProcessor(300)
    processor.register_forward_hook(hook)
    tokens = {_rid(r): r["input_ids"] for r in recs}
    states = {rid: hf_states(model, ids, AUX) for rid, ids in tokens.items()}
    a, b, c = tokens
    head = StandInLMHead(model.lm_head.weight)
    processor(*forward_args(states, tokens, [(c, 0, 8), (a, 0, 3)], head))
    processor(*forward_args(states, tokens, [(b, 0, 12), (c, 8, 16)], head))
    hook.flush()
    assert collect_request(spool, c, tokens[c]) is None  # rows 16..20 not written yet
    processor(*forward_args(states, tokens, [(c, 16, 21)], head))
    hook.close()
    collected = wait_for_requests(spool, tokens, timeout_s=5)
    for r in recs:
        got = sample_from_spool(r, collected[_rid(r)], storage="topk", hidden_size=H, topk=5)
        _assert_same(got["sample"], want[r["id"]], "topk", len(r["input_ids"]))


def _save_forward(model, recs, tmp_path):
    """One forward of `recs` saved for spawned ranks (``w.pt``, ``args.pt``), a ``spool``
    folder and a free port; returns (tokens by rid, port)."""
    tokens = {_rid(r): r["input_ids"] for r in recs}
    states = {rid: hf_states(model, ids, AUX) for rid, ids in tokens.items()}
    pieces = [(rid, 0, len(ids)) for rid, ids in tokens.items()]
    _, hidden, _, batch, aux = forward_args(states, tokens, pieces,
                                            StandInLMHead(model.lm_head.weight))
    torch.save(model.lm_head.weight.detach().clone(), tmp_path / "w.pt")
    torch.save({"input_ids": batch.input_ids, "hidden": hidden, "aux": aux,
                "batch": {"rids": batch.rids, "extend_seq_lens_cpu": batch.extend_seq_lens_cpu,
                          "extend_prefix_lens_cpu": batch.extend_prefix_lens_cpu}},
               tmp_path / "args.pt")
    (tmp_path / "spool").mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return tokens, port


def test_tensor_parallel_hook_over_gloo_against_sglang_source_shapes(model, tmp_path):
    """Two real processes joined by a gloo group, each holding half the (padded) vocabulary as
    SGLang's ParallelLMHead does: rank 0's files equal a single rank's."""
    import torch.multiprocessing as mp

    from .sglang_stand_ins import tp_worker

    recs = _records(3)
    tokens, port = _save_forward(model, recs, tmp_path)
    mp.spawn(tp_worker, args=(2, port, str(tmp_path / "spool"), str(tmp_path / "w.pt"),
                              str(tmp_path / "args.pt"), 5), nprocs=2, join=True)
    got = wait_for_requests(tmp_path / "spool", tokens, timeout_s=5)
    want = _hf_samples(model, recs, "topk")
    for r in recs:
        sample = sample_from_spool(r, got[_rid(r)], storage="topk", hidden_size=H, topk=5)
        _assert_same(sample["sample"], want[r["id"]], "topk", len(r["input_ids"]))


GLOO_TIMEOUT_S = 60.0  # a rank left alone in a collective raises after this (gloo's timeout)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world,fail_rank,failure", [(2, 0, "spool-full"),
                                                     (3, 1, "teacher-oom")])
def test_one_rank_failing_stops_every_rank_over_gloo_against_sglang_source_shapes(
        model, tmp_path, world, fail_rank, failure):
    """Real gloo processes, each running three prefill forwards with the teacher's gathers;
    one rank fails in the first (rank 0's spool disk full in its writer thread, or an
    out-of-memory in the middle of one rank's gathers). Every rank goes quiet at the same
    forward, well before gloo's own timeout would end a deadlock; the collector raises the
    failing rank's error. Processes still alive at the deadline are killed and fail the test."""
    import json
    import multiprocessing
    import time

    from .sglang_stand_ins import tp_failing_worker

    tokens, port = _save_forward(model, _records(2), tmp_path)
    (tmp_path / "out").mkdir()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=tp_failing_worker, args=(
        rank, world, port, str(tmp_path / "spool"), str(tmp_path / "w.pt"),
        str(tmp_path / "args.pt"), 5, fail_rank, failure, 3, GLOO_TIMEOUT_S,
        str(tmp_path / "out"))) for rank in range(world)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    deadline = t0 + 120
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    hung = [i for i, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert not hung, f"ranks {hung} hung"
    assert [p.exitcode for p in procs] == [0] * world
    results = [json.loads((tmp_path / "out" / f"rank{r}.json").read_text())
               for r in range(world)]
    assert max(r["seconds"] for r in results) < GLOO_TIMEOUT_S / 2  # nobody waited on gloo
    first = 1 if failure == "spool-full" else 0  # a writer failure is seen at the next forward
    assert [r["quiet_after"] for r in results] == [first] * world
    assert all(r["quiet"] and r["failed"] for r in results)
    errors = hook_errors(tmp_path / "spool")
    assert len(errors) == world
    assert ("No space left" if failure == "spool-full" else "out of memory") in errors[fail_rank]
    assert all("another rank's capture hook failed" in e
               for r, e in enumerate(errors) if r != fail_rank)
    assert not any("timed out" in e.lower() or "timeout" in e.lower() for e in errors)
    missing = {rid: ids for rid, ids in tokens.items()}
    with pytest.raises(EyasError, match=f"HOOK_ERROR.rank{fail_rank}"):
        wait_for_requests(tmp_path / "spool", missing, timeout_s=5)


def test_teacher_keeps_joining_the_gathers_after_its_own_part_fails(model):
    """A rank whose chunk fails still calls the gather once per chunk (placeholder rows), then
    raises its error."""
    head = StandInLMHead(model.lm_head.weight, rank=0, world=2)
    calls = []

    def gather(x):
        calls.append(x.shape)
        return torch.stack([x, x])

    weight = torch.full_like(head.weight, float("nan"))
    head.weight = torch.nn.Parameter(weight[:, :3], requires_grad=False)  # a matmul that fails
    with pytest.raises(RuntimeError):
        teacher_topk(torch.zeros(1100, H), head, vocab_size=300, k=3, gather=gather)
    assert len(calls) == 3 * 3  # 3 chunks of 512 rows, 3 gathers each


def test_hook_reads_ids_from_the_forward_batch_under_kimis_wrapper_against_sglang_source_shapes(
        model, tmp_path):
    """Kimi-K2.5's wrapper hands the logits processor input_ids=None (general_mm_embed_routine
    -> DeepseekV2ForCausalLM.forward): the hook takes the ids from forward_batch.input_ids and
    writes what a flat model's call gives; a batch without ids either is a clear error."""
    recs = _records(2)
    tokens = {_rid(r): r["input_ids"] for r in recs}
    states = {rid: hf_states(model, ids, AUX) for rid, ids in tokens.items()}
    head = StandInLMHead(model.lm_head.weight)
    pieces = [(rid, 0, len(ids)) for rid, ids in tokens.items()]
    got = {}
    for wrapper in (True, False):
        hook, spool = _hook(tmp_path / str(wrapper), "topk")
        args = forward_args(states, tokens, pieces, head, wrapper=wrapper)
        assert (args[0] is None) == wrapper
        hook(None, args, None)
        hook.close()
        assert not hook.failed, hook_errors(spool)
        got[wrapper] = wait_for_requests(spool, tokens, timeout_s=5)
    for rid, ids in tokens.items():
        assert got[True][rid]["input_ids"].tolist() == ids
        for name, value in got[False][rid].items():
            assert torch.equal(got[True][rid][name], value), name
    hook, spool = _hook(tmp_path / "none", "topk")
    args = forward_args(states, tokens, pieces, head)
    args[3].input_ids = None
    hook(None, args, None)
    assert hook.failed
    assert "forward_batch carries no input_ids" in " ".join(hook_errors(spool))


def test_teacher_refuses_a_split_head_without_a_gather(model):
    head = StandInLMHead(model.lm_head.weight, rank=0, world=2)
    with pytest.raises(RuntimeError, match="no gather"):
        teacher_topk(torch.zeros(2, H), head, vocab_size=300, k=3, gather=None)


# -- what the hook skips, and how it fails --------------------------------------------------------
def test_hook_skips_decode_other_requests_and_other_ranks_against_sglang_source_shapes(
        model, tmp_path):
    recs = _records(2)
    tokens = {"eyas-a": recs[0]["input_ids"], "warmup-1": recs[1]["input_ids"]}
    states = {rid: hf_states(model, ids, AUX) for rid, ids in tokens.items()}
    head = StandInLMHead(model.lm_head.weight)
    pieces = [(rid, 0, len(ids)) for rid, ids in tokens.items()]
    hook, spool = _hook(tmp_path, "final")
    hook(None, forward_args(states, tokens, pieces, head, mode=StandInMode.DECODE), None)
    hook(None, forward_args(states, tokens, pieces, head, mode=StandInMode.TARGET_VERIFY), None)
    hook.flush()
    assert list(spool.iterdir()) == []
    hook(None, forward_args(states, tokens, pieces, head), None)
    hook.close()
    assert sorted(p.name for p in spool.iterdir()) == ["eyas-a.000000000.safetensors"]
    rank1, spool = _hook(tmp_path / "r1", "final", rank=1)
    rank1(None, forward_args(states, tokens, pieces, head), None)
    rank1.close()
    assert list(spool.iterdir()) == [] and not rank1.failed


def test_hook_failure_reaches_the_collector_against_sglang_source_shapes(model, tmp_path):
    """Rows that do not line up (what sequence-parallel layernorm would hand over) are written
    as a hook error, never raised into SGLang; the collector raises it; the hook goes quiet."""
    r = _records(1)[0]
    tokens = {_rid(r): r["input_ids"]}
    states = {_rid(r): hf_states(model, r["input_ids"], AUX)}
    args = list(forward_args(states, tokens, [(_rid(r), 0, 3)], StandInLMHead(
        model.lm_head.weight)))
    args[1] = args[1][:2]  # hidden_states of 2 rows for 3 tokens
    hook, spool = _hook(tmp_path, "topk")
    hook(None, tuple(args), None)
    assert hook.failed
    with pytest.raises(EyasError, match=r"rows do not line up.*sequence-parallel"):
        wait_for_requests(spool, tokens, timeout_s=5)
    hook(None, tuple(args), None)  # quiet from now on, nothing raised
    hook2, spool2 = _hook(tmp_path / "b", "topk")
    hook2(None, tuple(args[:4]), None)  # a model that passes no aux states positionally
    assert "expected (input_ids, hidden_states" in " ".join(hook_errors(spool2))


def test_collector_checks_tokens_and_times_out(model, tmp_path):
    r = _records(2)[1]
    tokens = {_rid(r): r["input_ids"]}
    states = {_rid(r): hf_states(model, r["input_ids"], AUX)}
    hook, spool = _hook(tmp_path, "final")
    hook(None, forward_args(states, tokens, [(_rid(r), 0, 4)], StandInLMHead(
        model.lm_head.weight)), None)
    hook.close()
    with pytest.raises(EyasError, match=r"wrote no complete rows for 1 request"):
        wait_for_requests(spool, tokens, timeout_s=0.1)
    other = list(r["input_ids"])
    other[2] += 1
    hook(None, forward_args(states, tokens, [(_rid(r), 4, 7)], StandInLMHead(
        model.lm_head.weight)), None)
    hook.close()
    with pytest.raises(EyasError, match="saw token .* at position 2"):
        collect_request(spool, _rid(r), other)


def test_nonfinite_rows_are_quarantined_against_sglang_source_shapes(model, tmp_path):
    r = _records(3)[2]
    tokens = {_rid(r): r["input_ids"]}
    aux, final = hf_states(model, r["input_ids"], AUX)
    aux[2, 7] = float("nan")
    hook, spool = _hook(tmp_path, "compact")
    hook(None, forward_args({_rid(r): (aux, final)}, tokens, [(_rid(r), 0, 11)],
                            StandInLMHead(model.lm_head.weight)), None)
    hook.close()
    got = sample_from_spool(r, wait_for_requests(spool, tokens, timeout_s=5)[_rid(r)],
                            storage="compact", hidden_size=H, topk=5)
    assert got["quarantined"]["id"] == "r2"
    assert "NaN in aux_scale at 1 position(s), first [2]" in got["quarantined"]["reason"]
    with pytest.raises(EyasError, match="expected"):
        sample_from_spool(r, wait_for_requests(spool, tokens, timeout_s=5)[_rid(r)],
                          storage="topk", hidden_size=H, topk=5)


# -- the backend -----------------------------------------------------------------------------------
def _stand_in_backend(llama8, model, tmp_path, storage, **engine_kw):  # noqa: F811
    backend = SGLangBackend(llama8, aux_layers=AUX, storage=storage, topk=5,
                            spool_root=tmp_path / "spools", collect_timeout_s=10)
    processor = StandInLogitsProcessor(300)
    hook = CaptureHook(backend.plan.server_args["forward_hooks"][0]["config"])
    processor.register_forward_hook(hook)
    engine = StandInEngine(model, AUX, processor, StandInLMHead(model.lm_head.weight),
                           **engine_kw)
    backend.spool.mkdir(parents=True)
    backend._engine = engine  # what _start() would build on a GPU host
    return backend, engine, hook


class _FlushingEngine:
    """Wraps the stand-in engine so the hook's writer has finished when generate returns
    (SGLang's forward writes before the request completes; here the writer is a thread)."""

    def __init__(self, engine, hook):
        self.engine, self.hook = engine, hook

    def generate(self, **kw):
        out = self.engine.generate(**kw)
        self.hook.flush()
        return out

    def shutdown(self):
        self.engine.shutdown()


@pytest.mark.parametrize("storage", ["final", "compact"])
def test_backend_shard_equals_hf_shard_with_stand_in_engine(llama8, model, tmp_path,  # noqa: F811
                                                             storage):
    """extract_shard through SGLangBackend (a stand-in engine that batches and chunks prefills
    as SGLang's scheduler does) writes the samples the HF backend writes; spool files are
    deleted after each batch and the spool folder at close."""
    merged = write_merged(tmp_path / "merged.jsonl", 9, max_len=30)
    spec = plan_shards(merged, ExtractConfig(shard_size=9))[0]
    cfg = ExtractConfig(storage=storage, topk=5, aux_layers=AUX, batch_tokens=90)
    backend, engine, hook = _stand_in_backend(llama8, model, tmp_path, storage, chunk=16,
                                              max_prefill_tokens=40)
    backend._engine = _FlushingEngine(engine, hook)
    extract_shard(spec, llama8, tmp_path / "sg", cfg, backend=backend)
    assert any(p[1] > 0 for call in engine.calls for p in call)  # some prompts came in chunks
    assert list(backend.spool.iterdir()) == []
    backend.close()
    assert engine.shut and not backend.spool.exists()
    hf = HFBackend(None, model=model, aux_layers=AUX, storage=storage, topk=5, device="cpu")
    extract_shard(spec, llama8, tmp_path / "hf", cfg, backend=hf)
    for got, ref in zip(iter_samples(tmp_path / "sg" / spec.name),
                        iter_samples(tmp_path / "hf" / spec.name), strict=True):
        assert torch.equal(got["input_ids"], ref["input_ids"])
        torch.testing.assert_close(got["aux_hidden"].float(), ref["aux_hidden"].float(),
                                   rtol=0.1 if storage == "compact" else 8e-3, atol=1e-3)
        if storage == "final":
            torch.testing.assert_close(got["final_hidden"], ref["final_hidden"], rtol=8e-3,
                                       atol=1e-4)
        else:
            assert torch.equal(got["topk_ids"], ref["topk_ids"])


class _LoggingEngine(_FlushingEngine):
    """The flushing stand-in engine that logs when each call starts and ends."""

    def __init__(self, engine, hook, log):
        super().__init__(engine, hook)
        self.log = log

    def generate(self, **kw):
        self.log.append(("start", kw["rid"][0]))
        out = super().generate(**kw)
        self.log.append(("end", kw["rid"][0]))
        return out


@pytest.mark.parametrize("storage", ["final", "compact"])
def test_overlapped_extraction_writes_the_sequential_shard_byte_for_byte_with_stand_in_engine(
        llama8, model, tmp_path, storage):  # noqa: F811
    """Batch k is read and checked while the engine runs batch k+1 (its call starts before k
    is collected; one call at a time), and the shard is the sequential path's, byte for byte."""
    import hashlib

    from eyas.extract.store import DATA_NAME

    merged = write_merged(tmp_path / "merged.jsonl", 9, max_len=30)
    spec = plan_shards(merged, ExtractConfig(shard_size=9))[0]
    cfg = ExtractConfig(storage=storage, topk=5, aux_layers=AUX, batch_tokens=60)
    digests, logs = {}, {}
    for overlap in (False, True):
        run = tmp_path / f"overlap-{overlap}"
        backend, engine, hook = _stand_in_backend(llama8, model, run, storage)
        backend.overlap = overlap
        log = logs[overlap] = []
        backend._engine = _LoggingEngine(engine, hook, log)
        collect = backend._collect
        backend._collect = lambda call, out, c=collect, lg=log: (
            lg.append(("collect", call.rids[0])), c(call, out))[1]
        extract_shard(spec, llama8, run / "hidden", cfg, backend=backend)
        assert list(backend.spool.iterdir()) == []
        backend.close()
        digests[overlap] = hashlib.sha256((run / "hidden" / spec.name / DATA_NAME)
                                          .read_bytes()).hexdigest()
    assert digests[True] == digests[False]
    calls = [rid for kind, rid in logs[True] if kind == "start"]
    assert len(calls) >= 3
    for kind, rid in logs[True]:  # never two calls at once
        assert kind != "start" or logs[True].index(("start", rid)) == 0 or \
            logs[True][logs[True].index(("start", rid)) - 1][0] != "start"
    for k in range(len(calls) - 1):  # call k+1 started before batch k was collected
        assert logs[True].index(("start", calls[k + 1])) < logs[True].index(("collect", calls[k]))
    seq = [rid for kind, rid in logs[False] if kind == "start"]
    for k in range(len(seq) - 1):  # the sequential path: collected before the next call
        assert logs[False].index(("collect", seq[k])) < logs[False].index(("start", seq[k + 1]))


def test_a_batch_failing_while_the_next_runs_waits_for_it_and_leaves_no_files_with_stand_in_engine(
        llama8, model, tmp_path, monkeypatch):  # noqa: F811
    """The error of batch k surfaces; the call of batch k+1, in flight then, is waited for and
    its spool files deleted, so the engine is idle and the spool empty for the next shard."""
    merged = write_merged(tmp_path / "merged.jsonl", 9, max_len=30)
    spec = plan_shards(merged, ExtractConfig(shard_size=9))[0]
    cfg = ExtractConfig(storage="final", topk=5, aux_layers=AUX, batch_tokens=60)
    backend, engine, hook = _stand_in_backend(llama8, model, tmp_path, "final")
    log = []
    backend._engine = _LoggingEngine(engine, hook, log)
    from eyas.extract import sglang_backend

    check = sglang_backend.sample_from_spool

    def failing(*a, **kw):  # the first batch's check fails, the second call in flight
        if sum(1 for kind, _ in log if kind == "start") >= 2:
            raise EyasError("stand-in: batch check failed")
        return check(*a, **kw)

    monkeypatch.setattr(sglang_backend, "sample_from_spool", failing)
    with pytest.raises(EyasError, match="stand-in: batch check failed"):
        extract_shard(spec, llama8, tmp_path / "hidden", cfg, backend=backend)
    starts = [rid for kind, rid in log if kind == "start"]
    assert ("end", starts[-1]) in log  # the call in flight was waited for
    assert list(backend.spool.iterdir()) == []
    assert not (tmp_path / "hidden" / spec.name).exists()
    backend.close()


def test_backend_refuses_what_sglang_cannot_capture(llama8, tmp_path):  # noqa: F811
    with pytest.raises(ConfigError, match="layer 7 is the last of 8") as exc:
        SGLangBackend(llama8, aux_layers=[1, 3, 7], storage="topk")
    assert exc.value.where == "extract.aux_layers"
    ds = tmp_path / "ds"
    ds.mkdir()
    (ds / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 8, "hidden_size": 64,
        "vocab_size": 300}))
    with pytest.raises(ConfigError, match=r"cannot capture layers \[0, 3, 5\]"):
        SGLangBackend(ds, aux_layers=[0, 3, 5], storage="final")
    assert SGLangBackend(ds, aux_layers=[2, 3, 5], storage="final").plan.sglang_layer_ids \
        == [3, 4, 6]


def test_stale_spools_of_dead_processes_are_removed(tmp_path):
    import subprocess

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (tmp_path / f"eyas-spool-{dead}-0a1b2c3d").mkdir()
    (tmp_path / f"eyas-spool-{dead}-0a1b2c3d" / "x.safetensors").write_bytes(b"x")
    live = tmp_path / f"eyas-spool-{__import__('os').getpid()}-0a1b2c3d"
    live.mkdir()
    assert clean_stale_spools(tmp_path) == [tmp_path / f"eyas-spool-{dead}-0a1b2c3d"]
    assert live.exists()


@pytest.mark.skipif(sglang_available(), reason="SGLang is installed here; the error is for "
                                               "environments without it")
def test_missing_sglang_is_a_clear_error(llama8, tmp_path):  # noqa: F811
    backend = SGLangBackend(llama8, aux_layers=AUX, storage="compact", spool_root=tmp_path)
    with pytest.raises(EyasError, match=r"own environment on a GPU host: `ship\(host, "
                                        r"extras=\['sglang'\], venv=\.\.\.\)`"):
        backend.run_batch(_records(1))
    backend.close()  # nothing started, nothing to stop


class _BlockingEngine:
    """``sglang.Engine`` whose ``generate`` never returns until ``shutdown`` (a rank stuck in
    a collective), as a stand-in for SGLang."""

    instances: list = []

    def __init__(self, **server_args):
        import threading

        self.released = threading.Event()
        self.shut = False
        _BlockingEngine.instances.append(self)

    def generate(self, **kw):
        self.released.wait()
        return [{"meta_info": {}} for _ in kw["rid"]]

    def shutdown(self):
        self.shut = True
        self.released.set()


@pytest.mark.timeout(60)
def test_engine_call_timeout_ends_the_engine_job_with_stand_in_engine(llama8, tmp_path,  # noqa: F811
                                                                      monkeypatch):
    """An engine call that does not return within extract.engine_timeout_s raises
    EngineTimeout naming the field; the job stops there even with keep_going (no second
    shard is tried) and the engine is shut down."""
    import time

    from eyas.extract import sglang_backend
    from eyas.extract.run import SHARD_FAILED, extract
    from eyas.extract.sglang_backend import EngineTimeout

    _BlockingEngine.instances.clear()
    monkeypatch.setattr(sglang_backend, "import_sglang",
                        lambda: types.SimpleNamespace(Engine=_BlockingEngine))
    merged = write_merged(tmp_path / "merged.jsonl", 6, max_len=20)
    cfg = ExtractConfig(backend="sglang", storage="topk", topk=5, aux_layers=AUX, shard_size=3,
                        engine_timeout_s=1.5)
    events = []
    t0 = time.monotonic()
    with pytest.raises(EngineTimeout, match=r"within 2 s \(extract.engine_timeout_s\)"):
        extract(merged, tmp_path / "hidden" / "train", model_dir=llama8, cfg=cfg,
                keep_going=True, on_shard=events.append)
    assert time.monotonic() - t0 < 20
    assert [e["event"] for e in events] == [SHARD_FAILED]  # the second shard never started
    assert events[0]["error_type"] == "EngineTimeout"
    assert len(_BlockingEngine.instances) == 1 and _BlockingEngine.instances[0].shut


def test_other_sglang_version_is_refused_with_stand_in_module(monkeypatch):
    check_sglang_version(SGLANG_VERSION)
    fake = types.ModuleType("sglang")
    fake.__version__ = "0.5.24"
    monkeypatch.setitem(sys.modules, "sglang", fake)
    with pytest.raises(EyasError, match=r"written against SGLang 0\.5\.23.*found SGLang 0\.5\.24"):
        import_sglang()


def test_config_selects_the_backend(llama8, tmp_path):  # noqa: F811
    assert ExtractConfig().backend == "hf"
    assert isinstance(make_backend(llama8, AUX, ExtractConfig(storage="topk")), HFBackend)
    sg = make_backend(llama8, AUX, ExtractConfig(backend="sglang", storage="final", tp_size=2),
                      out_root=tmp_path / "out")
    assert isinstance(sg, SGLangBackend) and sg.plan.server_args["tp_size"] == 2
    sg3 = make_backend(llama8, AUX, ExtractConfig(backend="sglang", dtype="float16",
                                                  engine_args={"mem_fraction_static": 0.9}))
    assert sg3.plan.server_args["mem_fraction_static"] == 0.9
    assert "dtype" not in sg3.plan.server_args
    assert sg.spool.parent == tmp_path / ".sglang-spool"  # beside hidden/<split>: every split
    sg2 = make_backend(llama8, AUX, ExtractConfig(backend="sglang", spool_dir=str(tmp_path / "s")))
    assert sg2.spool.parent == tmp_path / "s"
    with pytest.raises(Exception, match="backend"):
        ExtractConfig(backend="vllm")


# -- the real engine ----------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not sglang_available(), reason=NO_SGLANG)
def test_engine_aux_equals_hf_backend(tiny_target, tmp_path):
    """SGLang's engine with eyas's hook and the HF backend (both bf16 on the GPU) give the same
    aux states and the same top-1 teacher token on the tiny target (bf16 kernels differ)."""
    from eyas.extract.target import resolve_aux_layers

    aux, _ = resolve_aux_layers(tiny_target, None)
    recs = _records(6, vocab=200)
    hf = HFBackend(tiny_target, aux_layers=aux, storage="topk", topk=8, device="cuda")
    want = {s["id"]: s for b in hf.extract(recs, 4096) for s in b.samples}
    del hf
    torch.cuda.empty_cache()
    with SGLangBackend(tiny_target, aux_layers=aux, storage="topk", topk=8,
                       mem_fraction_static=0.3, spool_root=tmp_path) as sg:
        got = {s["id"]: s for b in sg.extract(recs, 4096) for s in b.samples}
    assert sorted(got) == sorted(want)
    for sid, s in got.items():
        ref = want[sid]
        torch.testing.assert_close(s["aux_hidden"].float(), ref["aux_hidden"].float(),
                                   rtol=5e-2, atol=5e-2)
        top1 = (s["topk_ids"][:, 0] == ref["topk_ids"][:, 0]).float().mean().item()
        assert top1 >= 0.9, (sid, top1)
