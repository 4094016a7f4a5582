"""Trainer: a loss that falls, exact resume, best checkpoint, schedule."""

from __future__ import annotations

import json

import pytest
import torch
from support.paths import REPO as ROOT

from eyas import stopping
from eyas.train.config import TrainConfig
from eyas.train.data import Batches, MemorySource
from eyas.train.trainer import Trainer, lr_lambda

from .helpers import random_samples, small_drafter, small_vocab


def make_trainer(out, steps=6, storage="final", **cfg_fields):
    cfg = TrainConfig(steps=steps, lr=3e-3, warmup_steps=2, grad_accum=2, micro_batch=2,
                      ttt_steps=3, eval_every=3, checkpoint_every=100, log_every=1,
                      device="cpu", **cfg_fields)
    torch.manual_seed(0)
    drafter = small_drafter(seed=0)
    drafter.reset_parameters()
    vocab = small_vocab(drafter.cfg)
    train = Batches(MemorySource(random_samples(10, storage=storage, seed=1)), micro_batch=2, seed=7,
                    prefetch=cfg.prefetch)
    # Evaluate on training samples: random data has nothing to generalise from.
    evals = Batches(MemorySource(random_samples(10, storage=storage, seed=1)[:4]), micro_batch=2,
                    seed=0, shuffle=False)
    head = torch.randn(50, 32, generator=torch.Generator().manual_seed(3))
    return Trainer(cfg, drafter, vocab, train, evals, out, lm_head_VH=head)


MEMORY_SAVING = {"activation_checkpointing": True, "chunk_mb": 1e-3}
"""Every step recomputed in backward, attention and loss in chunks of a few rows."""


@pytest.mark.parametrize("fields", [{"prefetch": 0}, MEMORY_SAVING, {"precision": "bf16"}],
                         ids=["default", "memory-saving", "bf16-autocast"])
def test_resume_after_stop_equals_uninterrupted_run_bit_for_bit(tmp_path, fields):
    full = make_trainer(tmp_path / "full", **fields)
    full.fit()
    stopped = make_trainer(tmp_path / "split", **fields)
    stopped.fit(stop_at=4)
    assert (tmp_path / "split" / "checkpoint" / "state.pt").is_file()
    resumed = make_trainer(tmp_path / "split", **fields)  # a fresh process builds exactly this
    assert resumed.load_checkpoint()
    assert resumed.state.step == 4
    resumed.fit()
    a, b = full.drafter.state_dict(), resumed.drafter.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert resumed.train_batches.state_dict() == full.train_batches.state_dict()
    assert [h["loss"] for h in resumed.state.history] == [h["loss"] for h in full.state.history]


def test_a_stop_request_ends_the_step_checkpoints_and_resumes_bit_for_bit(tmp_path):
    """SIGTERM / Ctrl-C (`eyas.stopping`) during step 2: the step ends, its checkpoint and the
    history are written, StopRequested names the step; the resumed run equals one never
    stopped."""
    import signal

    full = make_trainer(tmp_path / "full")
    full.fit()
    stopped = make_trainer(tmp_path / "split")

    def stop_during_the_next_step(record: dict) -> None:
        if record["kind"] == "train" and record["step"] == 1:
            stopping.request(signal.SIGTERM)  # as the signal handler, or its watcher, does

    stopped.on_log = stop_during_the_next_step
    try:
        with pytest.raises(stopping.StopRequested) as info:
            stopped.fit()
    finally:
        stopping.reset()
    assert info.value.exit_code == 143 and "stopped at step 2" in str(info.value)
    assert json.loads((tmp_path / "split" / "checkpoint" / "meta.json").read_text())["step"] == 2
    history = json.loads((tmp_path / "split" / "history.json").read_text())
    assert [r["step"] for r in history if r["kind"] == "train"] == [1, 2]
    resumed = make_trainer(tmp_path / "split")
    assert resumed.load_checkpoint() and resumed.state.step == 2
    resumed.fit()
    a, b = full.drafter.state_dict(), resumed.drafter.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    strip = [{k: v for k, v in r.items() if k != "tok_s"} for r in full.state.history]
    assert [{k: v for k, v in r.items() if k != "tok_s"} for r in resumed.state.history] == strip


def test_activation_checkpointing_and_chunks_change_no_number(tmp_path):
    """Same losses, accuracies and weights (fp32, 1e-6) with every step recomputed and the
    attention, loss and teacher in chunks of a few rows."""
    plain = make_trainer(tmp_path / "plain")
    plain.fit()
    saving = make_trainer(tmp_path / "saving", chunk_mb=1e-3, activation_checkpointing=True)
    saving.fit()
    for a, b in zip(plain.state.history, saving.state.history, strict=True):
        assert a["acc"] == b["acc"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    for name, w in plain.drafter.state_dict().items():
        torch.testing.assert_close(saving.drafter.state_dict()[name], w, rtol=1e-6, atol=1e-6)


def test_the_fused_and_the_chunked_attention_train_alike(tmp_path):
    """attention_kernel "fused" (the CPU default) and "chunked" (the reference): the same
    losses, accuracies and weights (fp32, 1e-6) over a whole run."""
    runs = {}
    for kernel in ("fused", "chunked"):
        runs[kernel] = make_trainer(tmp_path / kernel, attention_kernel=kernel)
        runs[kernel].fit()
    fused, chunked = runs["fused"], runs["chunked"]
    for a, b in zip(fused.state.history, chunked.state.history, strict=True):
        assert a["acc"] == b["acc"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    for name, w in chunked.drafter.state_dict().items():
        torch.testing.assert_close(fused.drafter.state_dict()[name], w, rtol=1e-6, atol=1e-6)


def test_bf16_precision_autocasts_on_cpu(tmp_path):
    """precision "bf16" trains under bf16 autocast on a CPU too ("auto" is float32 there):
    the losses move off float32's, by bf16 rounding only."""
    fp32 = make_trainer(tmp_path / "fp32")
    fp32.fit()
    bf16 = make_trainer(tmp_path / "bf16", precision="bf16")
    assert bf16.autocast and not make_trainer(tmp_path / "auto").autocast
    bf16.fit()
    a = [h["loss"] for h in fp32.state.history if h["kind"] == "train"]
    b = [h["loss"] for h in bf16.state.history if h["kind"] == "train"]
    assert a != b
    assert b == pytest.approx(a, rel=2e-2)
    for w in bf16.drafter.parameters():
        assert w.dtype == torch.float32  # float32 master weights; only the compute is bf16


def test_a_checkpoint_from_before_tau_counted_the_bonus_token_is_upgraded(tmp_path):
    t = make_trainer(tmp_path)
    t.fit(stop_at=3)
    state = torch.load(tmp_path / "checkpoint" / "state.pt", weights_only=True)
    history = json.loads(state["state"]["history"])
    for r in history:  # what an older version wrote
        r.pop("acceptance_length")
        r["simulated_acceptance_length"] -= 1
    state["state"]["history"] = json.dumps(history)
    state["state"]["best"] -= 1
    torch.save(state, tmp_path / "checkpoint" / "state.pt")
    meta = json.loads((tmp_path / "checkpoint" / "meta.json").read_text())
    del meta["state_sha256"]  # nor did that version record a checksum
    (tmp_path / "checkpoint" / "meta.json").write_text(json.dumps(meta))
    again = make_trainer(tmp_path)
    assert again.load_checkpoint()
    evals = [r for r in again.state.history if r["kind"] == "eval"]
    assert again.state.best == evals[-1]["simulated_acceptance_length"] >= 1.0
    assert all("acceptance_length" in r for r in again.state.history)


def test_resume_from_an_earlier_step_does_differ(tmp_path):
    """Guard for the test above: a wrong data position would give other weights."""
    full = make_trainer(tmp_path / "full")
    full.fit()
    other = make_trainer(tmp_path / "other")
    other.fit(stop_at=4)
    again = make_trainer(tmp_path / "other")
    again.load_checkpoint()
    again.train_batches.load_state_dict({"epoch": 0, "cursor": 0, "seed": 7})
    again.fit()
    assert not torch.equal(full.drafter.fc.weight, again.drafter.fc.weight)


@pytest.mark.parametrize("storage", ["final", "topk"])
def test_training_lowers_the_loss_and_keeps_the_best(tmp_path, storage):
    t = make_trainer(tmp_path, steps=12, storage=storage)
    first = t.evaluate()
    t.fit()
    evals = [h for h in t.state.history if h["kind"] == "eval"]
    assert [e["step"] for e in evals] == [3, 6, 9, 12]
    assert evals[-1]["loss"] < first.loss
    best = json.loads((tmp_path / "best" / "metrics.json").read_text())
    assert best["simulated_acceptance_length"] == max(e["simulated_acceptance_length"] for e in evals)
    assert json.loads((tmp_path / "history.json").read_text())[-1]["step"] == 12


def test_schedule_warms_up_then_decays_to_the_floor():
    f = lr_lambda(TrainConfig(steps=10, warmup_steps=2, min_lr_ratio=0.1))
    assert f(0) == 0.5 and f(1) == 1.0 and f(2) == pytest.approx(1.0)
    assert f(10) == pytest.approx(0.1)
    assert all(f(i) >= f(i + 1) for i in range(2, 10))


DEAD_PID = 2**22 + 12345
"""Above the kernel's pid limit on this machine: a process that is certainly gone."""


def test_a_kill_while_the_checkpoint_is_replaced_loses_no_step(tmp_path):
    import shutil

    from eyas.train.trainer import recover_interrupted

    full = make_trainer(tmp_path / "full")
    full.fit()
    out = tmp_path / "split"
    t = make_trainer(out)
    t.fit(stop_at=2)
    shutil.copytree(out / "checkpoint", tmp_path / "step2")
    t.fit(stop_at=4)
    # Killed between the two renames of the step-4 checkpoint: the step-2 one moved aside,
    # the step-4 one complete under its temporary name, no checkpoint/ at all.
    (out / "checkpoint").rename(out / f".tmp-checkpoint-{DEAD_PID}")
    (tmp_path / "step2").rename(out / f".old-checkpoint-{DEAD_PID}")

    done = recover_interrupted(out)
    assert done == [f"recovered {out / 'checkpoint'} from .tmp-checkpoint-{DEAD_PID}",
                    f"deleted .old-checkpoint-{DEAD_PID}, left by a process that was killed"]
    resumed = make_trainer(out)
    assert resumed.load_checkpoint() and resumed.state.step == 4  # not from scratch
    resumed.fit()
    for k, v in full.drafter.state_dict().items():
        assert torch.equal(v, resumed.drafter.state_dict()[k]), k


def _flip_a_byte(path, at=0.5):
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_corrupt_checkpoint_is_not_resumed_the_previous_good_one_is(tmp_path):
    """A flipped byte in ``checkpoint/state.pt`` (which a mapped ``torch.load`` does not
    notice: it skips the zip CRC) fails its SHA-256 recorded in ``meta.json``: training
    resumes from the checkpoint before it (``previous-checkpoint/``) and ends with the
    uninterrupted run's weights; with both corrupt it refuses, naming the file."""
    from eyas.errors import DataError

    full = make_trainer(tmp_path / "full")
    full.fit()
    out = tmp_path / "split"
    t = make_trainer(out)
    t.fit(stop_at=2)
    t.fit(stop_at=4)
    meta = json.loads((out / "checkpoint" / "meta.json").read_text())
    assert meta["step"] == 4 and len(meta["state_sha256"]) == 64
    _flip_a_byte(out / "checkpoint" / "state.pt")
    resumed = make_trainer(out)
    assert resumed.load_checkpoint()
    assert resumed.state.step == 2, "the corrupt step-4 checkpoint was resumed"
    resumed.fit()
    for k, v in full.drafter.state_dict().items():
        assert torch.equal(v, resumed.drafter.state_dict()[k]), k
    _flip_a_byte(out / "checkpoint" / "state.pt")
    _flip_a_byte(out / "previous-checkpoint" / "state.pt", at=0.7)
    with pytest.raises(DataError, match=r"checkpoint/state.pt.*SHA-256"):
        make_trainer(out).load_checkpoint()


def test_a_kill_while_the_best_weights_are_replaced_keeps_the_best(tmp_path):
    from eyas.train.trainer import recover_interrupted

    t = make_trainer(tmp_path, steps=6)
    t.fit()
    best = json.loads((tmp_path / "best" / "metrics.json").read_text())
    weights = (tmp_path / "best" / "drafter.safetensors").read_bytes()
    (tmp_path / "best").rename(tmp_path / f".tmp-best-{DEAD_PID}")  # renamed out, never back in
    # A live writer's folder is not touched.
    live = tmp_path / f".tmp-best-{__import__('os').getpid()}"
    live.mkdir()
    recover_interrupted(tmp_path)
    assert json.loads((tmp_path / "best" / "metrics.json").read_text()) == best
    assert (tmp_path / "best" / "drafter.safetensors").read_bytes() == weights
    assert live.is_dir()


def _split_run(out, *, grad_accum, micro_batch, loss_norm):
    cfg = TrainConfig(steps=3, lr=3e-3, warmup_steps=1, grad_accum=grad_accum,
                      micro_batch=micro_batch, ttt_steps=3, eval_every=100, log_every=1,
                      device="cpu", loss_norm=loss_norm)
    torch.manual_seed(0)
    drafter = small_drafter(seed=0)
    drafter.reset_parameters()
    train = Batches(MemorySource(random_samples(12, seed=2)), micro_batch=micro_batch, seed=5)
    head = torch.randn(50, 32, generator=torch.Generator().manual_seed(3))
    trainer = Trainer(cfg, drafter, small_vocab(drafter.cfg), train, None, out, lm_head_VH=head)
    trainer.fit()
    return drafter.state_dict()


def test_token_weighting_makes_a_step_independent_of_its_micro_batches(tmp_path):
    """The same 4 samples per step, as 4 accumulated micro-batches of 1 or one of 4: equal
    weights with loss_norm "token"; different with "sample" (there each sample weighs the same,
    so a token of a short sample weighs more)."""
    lengths = sorted({int(s["input_ids"].shape[0]) for s in random_samples(12, seed=2)})
    assert len(lengths) > 1  # the samples differ in length, else the two norms agree
    a = _split_run(tmp_path / "a", grad_accum=4, micro_batch=1, loss_norm="token")
    b = _split_run(tmp_path / "b", grad_accum=1, micro_batch=4, loss_norm="token")
    # Equal up to float32 rounding, whose size depends on the CPU's kernels and threads:
    # measured 1.2e-6 (one element of 2,048) on an AVX-512 machine, 2e-7 on others; "sample"
    # below differs by 1.4e-2.
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-5)
    c = _split_run(tmp_path / "c", grad_accum=4, micro_batch=1, loss_norm="sample")
    d = _split_run(tmp_path / "d", grad_accum=1, micro_batch=4, loss_norm="sample")
    assert not torch.allclose(c["fc.weight"], d["fc.weight"], rtol=1e-5, atol=1e-6)


def test_warmup_is_a_fraction_of_the_steps_by_default():
    """Issue 27: 1.5 % of the run (184 of the Kimi recipe's 12,263 steps), not a fixed 50."""
    assert TrainConfig(steps=12_263).warmup() == 184
    assert TrainConfig(steps=1_000, warmup_fraction=0.05).warmup() == 50
    assert TrainConfig(steps=1_000, warmup_steps=7).warmup() == 7  # stated steps win
    f = lr_lambda(TrainConfig(steps=1_000))
    assert f(0) == pytest.approx(1 / 15) and f(14) == 1.0 and f(16) < 1.0


def _count_checkpoints(t) -> list[int]:
    saved = []
    save = t.save_checkpoint

    def spy():
        saved.append(t.state.step)
        return save()

    t.save_checkpoint = spy
    return saved


def test_without_checkpoint_every_the_checkpoint_is_timed(tmp_path):
    t = make_trainer(tmp_path / "a")
    t.cfg = t.cfg.model_copy(update={"checkpoint_every": None, "checkpoint_minutes": 60.0})
    saved = _count_checkpoints(t)
    t.fit()
    assert saved == [6]  # an hour never passed: the end only
    t = make_trainer(tmp_path / "b")
    t.cfg = t.cfg.model_copy(update={"checkpoint_every": None, "checkpoint_minutes": 1e-9})
    saved = _count_checkpoints(t)
    t.fit()
    assert saved == [1, 2, 3, 4, 5, 6]  # always due
    t = make_trainer(tmp_path / "c")
    t.cfg = t.cfg.model_copy(update={"checkpoint_every": 4})
    saved = _count_checkpoints(t)
    t.fit()
    assert saved == [4, 6]


def test_the_best_evaluation_is_chosen_on_tau_at_the_served_draft_length(tmp_path):
    """Issue 27: chosen on τ at the draft length it is served with (here 1 of the 3
    trained), recorded in best/metrics.json; a pipeline takes evaluate.draft_tokens."""
    from eyas.config import load_config
    from eyas.train.metrics import acceptance_length
    from eyas.train.trainer import selection_tau

    t = make_trainer(tmp_path, steps=12, best_draft_steps=1)
    t.fit()
    evals = [h for h in t.state.history if h["kind"] == "eval"]
    best = json.loads((tmp_path / "best" / "metrics.json").read_text())
    taus = [acceptance_length(e["acc"], 1) for e in evals]
    assert best["step"] == evals[taus.index(max(taus))]["step"]
    assert best["selected_on"] == {"draft_steps": 1, "acceptance_length": max(taus)}
    cfg = TrainConfig(ttt_steps=7, best_draft_steps=3)
    acc = [0.9, 0.5, 0.5, 0.0, 0.0, 0.0, 0.0]
    assert selection_tau(acc, cfg) == pytest.approx(1 + 0.9 + 0.45 + 0.225)
    assert TrainConfig(ttt_steps=2, best_draft_steps=3).selection_draft_steps() == 2
    assert TrainConfig(ttt_steps=7).selection_draft_steps() == 7
    kimi = load_config(ROOT / "recipes" / "kimi-k2.5.yaml")
    assert kimi.train.ttt_steps == 3  # the recipe study's choice (docs/training.md)
    assert kimi.train.selection_draft_steps() == kimi.evaluate.draft_tokens == 3
