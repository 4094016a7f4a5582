"""eyas.evaluate.arbiter: a greedy divergence of a bf16 target settled by a float32 copy of it,
and the evaluation's lossless check counting what it settles (tiny target, CPU)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from support.evaluate_fixtures import export_random_drafter

from eyas.evaluate import arbiter as arbiter_mod
from eyas.evaluate import run as run_mod
from eyas.evaluate.arbiter import Arbiter
from eyas.evaluate.target import load_target
from eyas.train.tiny_data import tiny_records, write_jsonl

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def models(tiny_target):
    return (load_target(tiny_target, CPU, torch.bfloat16),
            load_target(tiny_target, CPU, torch.float32))


@pytest.fixture(scope="module")
def prefix(tiny_target):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_target)
    return tuple(tok("the cat sat on the mat and then it")["input_ids"])


def _logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([list(ids)])).logits[0, -1].float()


def test_a_far_token_is_a_real_divergence_and_the_margin_is_float32s(models, prefix):
    bf16, fp32 = models
    exact = _logits(fp32, prefix)
    reference, far = int(exact.argmax()), int(exact.argmin())
    arb = Arbiter(bf16)
    verdict = arb.settle(prefix, reference, far)
    # The copy is the bf16 model's own weights in float32 (the function both decoding paths
    # compute, in exact arithmetic): near a float32 load of the folder (whose weights bf16
    # has not rounded), and the target itself is left in bf16.
    assert next(arb._model32.parameters()).dtype == torch.float32
    assert next(bf16.parameters()).dtype == torch.bfloat16
    assert verdict["margin"] == pytest.approx(float(exact[reference] - exact[far]), abs=0.05)
    assert verdict["deviation"] > 0  # bf16 moved the logits: the deviation is measured
    assert verdict["tolerance"] >= verdict["rounding_step"] > 0
    assert verdict["rounding"] is False and verdict["top1"] == "reference"
    assert verdict["margin"] > 10 * verdict["tolerance"]


def test_two_tokens_as_close_as_rounding_are_rounding(models, prefix):
    bf16, fp32 = models
    exact = _logits(copy.deepcopy(bf16).float(), prefix)  # the bf16 weights, in float32
    # Of the 200 likeliest tokens, the two whose float32 logits are nearest each other.
    values, ids = exact.topk(200)
    i = int((values[:-1] - values[1:]).argmin())
    reference, near = int(ids[i]), int(ids[i + 1])
    verdict = Arbiter(bf16).settle(prefix, reference, near)
    assert abs(verdict["margin"]) <= verdict["rounding_step"] / 4, verdict  # the premise
    assert verdict["rounding"] is True
    # Seen from the other side (the drafted output took the top token) it is rounding too.
    assert Arbiter(bf16).settle(prefix, near, reference)["rounding"] is True


def test_a_float32_target_needs_no_settling_and_a_copy_that_does_not_fit_is_skipped(
        models, prefix, monkeypatch):
    bf16, fp32 = models
    assert not Arbiter(fp32).needed and Arbiter(bf16).needed
    monkeypatch.setattr(arbiter_mod, "available_bytes", lambda device: 1 << 20)
    logged: list[str] = []
    arb = Arbiter(bf16, log=logged.append)
    assert arb.settle(prefix, 1, 2) is None
    assert "needs" in arb.skipped and "GiB" in arb.skipped and "cpu" in arb.skipped
    assert any("not settled in float32" in line for line in logged)


def test_evaluation_in_bf16_calls_a_corrupted_output_real_and_says_what_it_settled(
        tiny_target, tmp_path, monkeypatch):
    """A drafted output changed at its third token (what a verification bug would do) is a
    real divergence with its float32 verdict in the report; the check stays honest."""
    lossless, corrupt = _third_token_moved(tiny_target, tmp_path, monkeypatch, bf16_only=False)
    assert len(corrupt) == 2, lossless
    for m in corrupt:
        assert m["float32"]["rounding"] is False and m["float32"]["top1"] == "reference"
        assert m["rounding"] is False and m["drafted_token"] != m["reference_token"]
        # Replayed in float32 the corrupted method parts from the target's own output at the
        # same token: a bug does not depend on the dtype.
        again = m["float32"]["replay"]
        assert again["equal"] is False and again["first_difference"] == 2
        assert again["rounding"] is False and again["margin"] > again["rounding_step"]
    assert lossless["equal"] is False and lossless["real"] >= 2
    assert lossless["near_ties"] + lossless["float32_rounding"] + lossless["real"] == len(
        lossless["mismatches"])


def test_replay_decodes_both_ways_in_float32_and_tells_a_bug_from_a_lossless_method(
        models, prefix, tiny_target):
    from eyas.evaluate.drafters import NgramDrafter
    from eyas.evaluate.speculate import generate
    from eyas.evaluate.target import Target
    from eyas.layers import default_aux_layers

    bf16, _ = models
    arb = Arbiter(bf16)
    layers = default_aux_layers(len(bf16.model.layers))

    def decode(model32, drafted, corrupt_at=None):
        g = generate(Target(model32, layers), NgramDrafter(3) if drafted else None, prefix,
                     max_new_tokens=16, draft_tokens=3)
        assert next(model32.parameters()).dtype == torch.float32
        if drafted and corrupt_at is not None:
            exact = _logits(model32, (*prefix, *g.tokens[:corrupt_at]))
            g.tokens[corrupt_at] = int(exact.argmin())
        return g

    assert arb.replay(11, decode) == {"equal": True, "tokens": 12, "rounding": True}
    bug = arb.replay(11, lambda m, d: decode(m, d, corrupt_at=4))
    assert bug["equal"] is False and bug["first_difference"] == 4 and bug["rounding"] is False
    assert bug["margin"] > bug["rounding_step"] > 0


def test_a_low_precision_divergence_the_estimate_misses_is_settled_by_the_replay(
        tiny_target, tmp_path, monkeypatch):
    """A drafted output that parts from the target's only in bf16 (what bf16 arithmetic over a
    long cache does, made large here) is rounding: replayed in float32 the method decodes the
    target's own output, so the report says lossless, and says how it settled it."""
    lossless, moved = _third_token_moved(tiny_target, tmp_path, monkeypatch, bf16_only=True)
    assert len(moved) == 2, lossless
    for m in moved:
        verdict = m["float32"]
        # The one-forward estimate calls it real (the token is the float32 argmin) ...
        assert abs(verdict["margin"]) > verdict["tolerance"]
        # ... the replay settles it.
        assert verdict["replay"]["equal"] is True and verdict["rounding"] is True
        assert m["rounding"] is True
    assert lossless["equal"] is True and lossless["real"] == 0
    assert lossless["float32_rounding"] >= 2 and "replayed in float32" in lossless["note"]


def _third_token_moved(tiny_target, tmp_path, monkeypatch, *, bf16_only: bool):
    """Evaluate a random drafter on the tiny target in bf16 with its drafted outputs' (and the
    untrained drafter's) third token changed to the float32 argmin (what a verification bug
    would do), on every target or, `bf16_only`, only where the target runs in bf16 (as bf16
    arithmetic would, made large); returns the report's ``lossless`` and the trained
    drafter's mismatches at that token."""
    drafter = export_random_drafter(tiny_target, tmp_path / "drafter" / "export")
    ev = write_jsonl(tmp_path / "eval.jsonl", tiny_records(tiny_target, 2, heldout=True))
    real_generate = run_mod.generate
    fp32 = load_target(tiny_target, CPU, torch.float32)

    plain_float32: list[tuple[int, ...]] = []

    def moved(target, method, prompt, **kw):
        g = real_generate(target, method, prompt, **kw)
        low = next(target.model.parameters()).dtype == torch.bfloat16
        if method is None and not low:
            plain_float32.append(tuple(prompt))
        if ((low or not bf16_only) and getattr(method, "name", None) in ("eagle3", "untrained")
                and len(g.tokens) > 3):
            exact = _logits(fp32, (*prompt, *g.tokens[:2]))
            g.tokens[2] = int(exact.argmin())
        return g

    monkeypatch.setattr(run_mod, "generate", moved)
    out = tmp_path / "evaluate"
    rc = run_mod.main(["--model", str(tiny_target), "--drafter", str(drafter), "--out", str(out),
                       "--eval-jsonl", str(ev), "--prompts-per-dataset", "2",
                       "--max-new-tokens", "8", "--threads", "1",
                       "--device", "cpu", "--dtype", "bfloat16"])
    assert rc == 0
    lossless = json.loads((out / "report.json").read_text())["lossless"]
    # Two methods part from the target at the moved token of each prompt: the replay decodes
    # the plain float32 reference once per prompt, for both.
    replayed = [m for m in lossless["mismatches"] if "replay" in m.get("float32", {})]
    assert {m["method"] for m in replayed} == {"eagle3", "untrained"}, replayed
    assert plain_float32 and len(plain_float32) == len(set(plain_float32)), plain_float32
    return lossless, [m for m in lossless["mismatches"]
                      if m["method"] == "eagle3" and m["position"] == 2]
