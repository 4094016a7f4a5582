"""The HTML report: self-contained (pictures inline), the serving section drawn from rows shaped
as the serving benchmark returns them, and (marker browser) rendered by headless Chromium."""

from __future__ import annotations

import base64
import html
import re
import subprocess

import pytest
import torch
from support.browser_fixtures import chromium_path

from eyas.evaluate.config import EvaluateConfig
from eyas.evaluate.prompts import Prompt, PromptSelection
from eyas.evaluate.report import markdown_summary, render_html, write_html
from eyas.evaluate.run import build_report, check_serving
from eyas.evaluate.speculate import Generation

PNG = b"\x89PNG\r\n\x1a\n"


def made_up_report(flag: bool = False) -> dict:
    """A report from hand-made generations: 2 datasets, 3 prompts, k = 3."""
    def g(accepted, seconds=1.0):
        kept = [a + 1 for a in accepted]
        return Generation(tokens=[1] * (1 + sum(kept)), accept_lengths=kept,
                          proposed=[3] * len(accepted), accepted=accepted, seconds=seconds,
                          target_seconds=0.5, target_calls=len(accepted), draft_seconds=0.1,
                          draft_steps=3 * len(accepted))
    results = {
        "target": [Generation(tokens=[1] * 12, seconds=1.0, target_seconds=0.8, target_calls=11)] * 3,
        "eagle3": [g([3, 2, 1]), g([1, 1, 0]), g([3, 3])],
        "untrained": [g([0, 0, 0, 0])] * 3,
        "ngram": [g([0, 2, 0]), g([0, 0]), g([1, 0])],
    }
    prompts = [Prompt("a", "chat", (1,)), Prompt("b", "chat", (2,)), Prompt("c", "code", (3,))]
    report = build_report(results, PromptSelection(prompts, sources=["made up"]),
                          EvaluateConfig(), [], extra={"run": "made-up"})
    report |= {"target": {"path": "T"}, "drafter": {"path": "D"}, "device": {"name": "cpu"},
               "simulated": {"available": True, "acc": [0.7, 0.6, 0.5], "draft_tokens": 3,
                             "simulated_acceptance_length": 2.33,
                             "measured_acceptance_length": report["acceptance_length"],
                             "relative_gap": 0.3 if flag else 0.05, "flagged": flag,
                             "warn_above": 0.25, "note": "measured τ differs" if flag else None}}
    return report


SERVING = {"rows": [
    {"mode": "baseline", "batch_size": b, "num_steps": None, "eagle_topk": None,
     "num_draft_tokens": None, "output_tok_s": tps, "accept_length": None}
    for b, tps in ((1, 90.0), (8, 600.0), (32, 1800.0))] + [
    {"mode": "eagle3", "batch_size": b, "num_steps": s, "eagle_topk": 1,
     "num_draft_tokens": s + 1, "output_tok_s": tps, "accept_length": al}
    for b, s, tps, al in ((1, 3, 190.0, 2.4), (1, 5, 170.0, 2.6), (8, 3, 900.0, 2.4),
                          (32, 3, 1500.0, 2.4))],
    "verdict": "beats the baseline at batch 1 by 2.1x, loses at batch 32"}


def images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


def test_page_is_self_contained_with_both_pictures_and_the_figures():
    report = made_up_report()
    page = render_html(report)
    pics = images(page)
    assert len(pics) == 2 and all(p.startswith(PNG) for p in pics)
    assert "http://" not in page and "https://" not in page and "<script" not in page
    lo, hi = report["acceptance_length_ci95"]
    assert f"τ {report['acceptance_length']:.2f} [{lo:.2f}–{hi:.2f}] with 3 draft tokens" in page
    # Speed figures say where their costs were measured; no serving costs, no serving prediction.
    assert "speedup on this device (cpu): predicted" in page
    assert "serving speedup not predicted: no draft and verification costs measured on the " \
           "serving engine" in page
    assert report["predicted_speedup"] is None and report["predicted_speedup_this_device"] > 0
    # Per dataset: intervals, and "ahead" only where the difference's interval excludes zero
    # (chat: 2 prompts, both ahead of both baselines); one prompt gives no interval.
    chat, code = report["per_dataset"]["chat"], report["per_dataset"]["code"]
    assert chat["trained_is"] == {"untrained": "ahead", "ngram": "ahead"}
    assert chat["difference_ci95"]["ngram"][0] > 0 and code["ci95"]["eagle3"] is None
    assert "+0.93 [0.67–1.33]: ahead" in page and "+2.50: not computed" in page
    assert all(len(s["ci95"]) == 2 for s in report["baselines"].values())
    for name in ("chat", "code", "n-gram (prompt lookup)", "untrained drafter",
                 "No serving benchmark"):
        assert name in page, name
    assert "⚠" not in page
    assert "⚠" in render_html(made_up_report(flag=True))


def test_serving_rows_are_drawn_as_throughput_by_batch_size(tmp_path):
    report = made_up_report() | {"serving": check_serving(SERVING)}
    path = write_html(report, tmp_path / "report.html")
    page = path.read_text()
    assert len(images(page)) == 3
    assert SERVING["verdict"] in page and "No serving benchmark" not in page
    assert "1800.00" in page
    md = markdown_summary(report, str(path))
    assert SERVING["verdict"] in md and str(path) in md


@pytest.mark.browser
def test_headless_chromium_renders_the_page(tmp_path):
    chromium = chromium_path()  # skipped where there is none, except in CI
    page = write_html(made_up_report() | {"serving": SERVING}, tmp_path / "report.html")
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1200,1800", f"--screenshot={shot}", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    data = shot.read_bytes()
    assert data.startswith(PNG) and len(data) > 50_000  # a blank page compresses to a few KB


def test_greedy_divergences_at_near_ties_are_counted_apart_from_real_ones():
    """bf16 logits near 10 are 0.0625 apart: a tie or one rounding step is a near tie (another
    summation order flips it), three steps is a real divergence: only that one reads OUTPUT
    DIFFERS."""
    from eyas.evaluate.run import lossless_check
    from eyas.evaluate.speculate import is_near_tie, rounding_step

    step = rounding_step(10.0, torch.bfloat16)
    assert step == 0.0625 and rounding_step(-10.0, torch.bfloat16) == step
    assert rounding_step(10.0, torch.float32) == pytest.approx(2 ** -20)
    tie = {"id": "a", "method": "eagle3", "position": 3, "target_top2_margin": 0.0,
           "rounding_step": step, "near_tie": is_near_tie(0.0, step)}
    one = tie | {"id": "b", "target_top2_margin": step, "near_tie": is_near_tie(step, step)}
    real = tie | {"id": "c", "target_top2_margin": 3 * step,
                  "near_tie": is_near_tie(3 * step, step)}
    assert tie["near_tie"] and one["near_tie"] and not real["near_tie"]
    cfg = EvaluateConfig()
    near_only = lossless_check(cfg, 16, [tie, one])
    assert near_only | {"equal": True, "identical": False, "near_ties": 2, "real": 0} == near_only
    report = made_up_report() | {"lossless": near_only}
    page = html.unescape(render_html(report))
    assert "output equal to the target's own but for 2 near-tie divergence(s)" in page
    assert "OUTPUT DIFFERS" not in page
    both = lossless_check(cfg, 16, [tie, real])
    assert both["equal"] is False and both["real"] == 1 and both["near_ties"] == 1
    page = html.unescape(render_html(made_up_report() | {"lossless": both}))
    assert "OUTPUT DIFFERS from the target's own (1 real divergence(s))" in page


def test_divergences_settled_in_float32_are_counted_apart_and_unsettled_ones_stay_real():
    """A divergence beyond a near tie that the float32 copy finds within rounding
    (`settle_in_float32`) keeps the output "equal"; one it could not settle (no room for the
    copy) stays real, and the note says why it was not settled."""
    from eyas.evaluate.run import lossless_check

    base = {"method": "eagle3", "position": 5, "target_top2_margin": 0.25,
            "rounding_step": 0.0625, "near_tie": False}
    tie = base | {"id": "a", "target_top2_margin": 0.0, "near_tie": True, "rounding": True}
    settled = base | {"id": "b", "rounding": True,
                      "float32": {"margin": 0.01, "tolerance": 0.1, "rounding": True}}
    cfg = EvaluateConfig()
    check = lossless_check(cfg, 8, [settled, tie])
    assert check | {"equal": True, "identical": False, "near_ties": 1, "float32_rounding": 1,
                    "real": 0} == check
    assert "1 more within rounding by a float32 copy" in check["note"]
    page = html.unescape(render_html(made_up_report() | {"lossless": check}))
    assert ("output equal to the target's own but for 1 near-tie divergence(s) and 1 within "
            "rounding in float32") in page
    # What `eyas evaluate` prints says the same.
    from eyas.cli import evaluation_lines
    from eyas.evaluate.run import headline

    report = made_up_report() | {"lossless": check}
    report["simulated"] = {"simulated_acceptance_length": 1.5, "flagged": False}
    lines = evaluation_lines(headline(report) | {"html": "report.html", "host": "local",
                                                 "mode": "greedy", "draft_tokens": 3})
    assert ("lossless: output equal to the target's own greedy output but for 1 near-tie "
            "divergence(s) and 1 within rounding in float32") in lines
    far = base | {"id": "c", "rounding": False,
                  "float32": {"margin": 2.0, "tolerance": 0.1, "rounding": False}}
    unsettled = base | {"id": "d", "rounding": False, "float32": {"skipped": "no room"}}
    check = lossless_check(cfg, 8, [tie, far, unsettled])
    assert check["equal"] is False and check["real"] == 2 and check["float32_rounding"] == 0
    assert "not settled in float32 (no room)" in check["note"]
    assert [m["id"] for m in check["mismatches"]][:2] == ["c", "d"]  # real ones first
    page = html.unescape(render_html(made_up_report() | {"lossless": check}))
    assert "OUTPUT DIFFERS from the target's own (2 real divergence(s))" in page


def test_the_page_is_the_same_drawn_by_the_run_or_from_report_json():
    """report.json is written with sorted keys; the run draws its page from the dict it built:
    both show the baselines in one order, so the two pages are the same."""
    import json

    report = made_up_report()
    assert list(report["baselines"]) != sorted(report["baselines"])  # the run's own order
    again = json.loads(json.dumps(report, sort_keys=True, default=str))
    assert render_html(again) == render_html(report)
