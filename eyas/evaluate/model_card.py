"""The drafter folder's model card (``README.md``): what a published drafter comes with.

`model_card` writes markdown from what the run knows: the target, the data (``merged/stats.json``:
datasets, records, tokens), the training settings and its best evaluation (the export's
manifest), τ per dataset (with 95 % intervals where the report has them), the serving verdict
when it was measured, and the SGLang command that serves the folder. Every figure comes from a
file of the run; a figure the run did not measure reads "not measured" (or the report's
"not run: <reason>"), never a guess.

The evaluation writes it (`tasks.evaluate.evaluation_report_task`) into the exported folder,
beside ``config.json`` and ``model.safetensors``. It is outside the export's verified set
(``manifest.json`` lists the weights and the config only): the card describes the weights and
changes with each evaluation; a new export (new weights) starts without one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eyas.evaluate.serving_config import SpecKnobs
from eyas.evaluate.sglang_server import ServerSpec, server_command

CARD = "README.md"
EXPORT_ARCHITECTURE = "LlamaForCausalLMEagle3"


def _f(x: Any, digits: int = 3) -> str:
    if x is None:
        return "not measured"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def _ci(value: Any) -> str:
    if isinstance(value, (list, tuple)) and len(value) == 2 and None not in value:
        return f" (95 % interval {value[0]:.2f}–{value[1]:.2f})"
    return ""


def serving_knobs(report: dict[str, Any]) -> SpecKnobs:
    """The setting to serve: the best measured at the smallest batch size, else the offline
    evaluation's chain (k steps, top-k 1, k + 1 draft tokens)."""
    comps = ((report.get("serving") or {}).get("comparisons") or [])
    if comps:
        c = min(comps, key=lambda c: c["batch_size"])
        return SpecKnobs(c["num_steps"], c["eagle_topk"], c["num_draft_tokens"])
    k = int(report.get("draft_tokens") or 3)
    return SpecKnobs(k, 1, k + 1)


def launch_command(report: dict[str, Any], *, target: str, drafter: str, tp_size: int,
                   trust_remote_code: bool, extra_args: list[str] | None = None,
                   python: str = "python3", rejection_sampling: bool = False) -> str:
    """SGLang's command line serving `target` with this drafter (`serving_knobs`)."""
    spec = ServerSpec(model_path=target, port=30000, tp_size=tp_size, draft_model_path=drafter,
                      knobs=serving_knobs(report), trust_remote_code=trust_remote_code,
                      extra_args=tuple(extra_args or ()), rejection_sampling=rejection_sampling)
    return server_command(python, spec)


def _data(stats: dict[str, Any] | None) -> list[str]:
    if not stats:
        return ["No `merged/stats.json` in the run: data not summarized."]
    lines = [f"{stats.get('records', 0):,} records, {stats.get('tokens', 0):,} tokens "
             f"({stats.get('supervised_tokens', 0):,} supervised), sequences of at most "
             f"{stats.get('max_seq_len')} tokens; {stats.get('train', {}).get('records', 0):,} "
             f"for training, {stats.get('eval', {}).get('records', 0):,} held out.", "",
             "| dataset | records | tokens | supervised tokens |", "|---|---|---|---|"]
    for name, d in sorted((stats.get("datasets") or {}).items()):
        after = d.get("after")
        if d.get("selected") and after:
            lines.append(f"| {name} | {after['records']:,} | {after['tokens']:,} | "
                         f"{after['supervised_tokens']:,} |")
    for name, why in sorted((stats.get("excluded") or {}).items()):
        lines.append(f"| {name} | excluded ({why}) | | |")
    return lines


def _training(train: dict[str, Any], manifest: dict[str, Any] | None) -> list[str]:
    keys = ("drafter", "fc_norm", "norm_output", "steps", "epochs", "lr", "warmup_steps",
            "micro_batch", "grad_accum", "max_len", "ttt_steps", "draft_vocab_size", "loss",
            "loss_norm", "precision", "seed")
    lines = ["| setting | value |", "|---|---|"]
    lines += [f"| {k} | {train[k]} |" for k in keys if k in train and train[k] is not None]
    counts = (manifest or {}).get("counts") or {}
    metrics = counts.get("metrics") or {}
    if counts.get("aux_layers") is not None:
        lines.append(f"| auxiliary layers (eyas numbering) | {counts['aux_layers']} |")
    if metrics.get("acc"):
        lines += ["", f"Best evaluation during training (step {metrics.get('step')}): "
                  f"acc_i {', '.join(f'{a:.3f}' for a in metrics['acc'])}"
                  + (f", simulated τ {metrics['simulated_acceptance_length']:.3f}"
                     if metrics.get("simulated_acceptance_length") is not None else "") + "."]
    return lines


def _evaluation(report: dict[str, Any]) -> list[str]:
    offline = report.get("offline") or {}
    if not offline.get("run", True):
        return [f"Offline evaluation not run: {offline.get('reason') or 'no reason recorded'}."]
    k = report.get("draft_tokens")
    base = report.get("baselines") or {}
    lines = [f"τ = tokens kept per verification of the target (accepted drafts + 1, as SGLang's "
             f"accept length), {report.get('mode')} decoding, {k} draft tokens, on "
             f"{(report.get('prompts') or {}).get('count')} held-out prompts: "
             f"**{_f(report.get('acceptance_length'))}**"
             f"{_ci(report.get('acceptance_length_ci95'))}.", "",
             "| dataset | prompts | τ | 95 % interval |"
             + "".join(f" vs {m} |" for m in base), "|---|---|---|---|" + "---|" * len(base)]
    for name, d in (report.get("per_dataset") or {}).items():
        ci = d.get("eagle3_ci95") or (d.get("ci95") or {}).get("eagle3")
        claims = "".join(f" {(d.get('trained_is') or {}).get(m) or 'not computed'} |"
                         for m in base)
        lines.append(f"| {name} | {d.get('prompts')} | {_f(d.get('eagle3'))} | "
                     f"{_ci(ci).strip(' ()').replace('95 % interval ', '') or 'not computed'} |"
                     + claims)
    if base:
        lines += ["", "Baselines on the same prompts: " + ", ".join(
            f"{m} {_f(s.get('acceptance_length'))}{_ci(s.get('ci95'))}" for m, s in base.items())
            + ". Intervals: bootstrap over prompts; \"ahead\" / \"behind\" only where the "
            "interval of the difference excludes zero, else \"within noise\"."]
    return lines


def _serving(report: dict[str, Any]) -> list[str]:
    serving = report.get("serving") or {}
    if not serving.get("rows"):
        return ["Not measured (the serving benchmark runs on a GPU host with "
                "`evaluate.serving`)."]
    lines = [serving.get("verdict") or "", "",
             "| mode | batch | steps / top-k / draft tokens | output tok/s | accept length |",
             "|---|---|---|---|---|"]
    for r in serving["rows"]:
        knobs = ("–" if r["mode"] != "eagle3" else
                 f"{r['num_steps']} / {r['eagle_topk']} / {r['num_draft_tokens']}")
        lines.append(f"| {r['mode']} | {r['batch_size']} | {knobs} | {r['output_tok_s']:.1f} | "
                     f"{_f(r.get('accept_length'), 2) if r.get('accept_length') else '–'} |")
    check = report.get("accept_check") or {}
    if check.get("note"):
        lines += ["", ("**Flagged**: " if check.get("flagged") else "") + check["note"] + "."]
    return lines


def model_card(report: dict[str, Any], *, run: str, target: str, drafter: str,
               train: dict[str, Any], stats: dict[str, Any] | None,
               manifest: dict[str, Any] | None, tp_size: int = 1,
               trust_remote_code: bool = False, extra_args: list[str] | None = None,
               code_version: str = "", rejection_sampling: bool = False) -> str:
    """The card's markdown. `report` is ``evaluate/report.json``; `train` the run's training
    settings (``TrainConfig`` as a dict); `stats` ``merged/stats.json``; `manifest` the
    export's ``manifest.json``; `tp_size`, `extra_args`, `rejection_sampling`: how the serving
    benchmark ran SGLang."""
    counts = (manifest or {}).get("counts") or {}
    name = Path(target.rstrip("/")).name
    cmd = launch_command(report, target=target, drafter=drafter, tp_size=tp_size,
                         trust_remote_code=trust_remote_code, extra_args=extra_args,
                         rejection_sampling=rejection_sampling)
    lines = ["---", f"base_model: {name}", "tags:", "- eagle3", "- speculative-decoding",
             "- sglang", "---", "", f"# EAGLE-3 drafter for {name}", "",
             f"A one-layer EAGLE-3 draft model that proposes tokens for `{name}` to verify "
             "(speculative decoding: the target's output is unchanged, it comes faster when "
             f"drafts are accepted). Trained by eyas, run `{run}`.", "",
             "## Serve it with SGLang", "", "```bash", cmd, "```", "",
             "(`--speculative-algorithm EAGLE3`, not `EAGLE`: SGLang would serve this drafter "
             "without the target's hidden states and accept nothing.)", "",
             "## Target", "",
             f"- model: `{target}`" + (f" ({counts['target_architecture']})"
                                       if counts.get("target_architecture") else ""),
             f"- auxiliary hidden states: layers {counts.get('aux_layers', 'see config.json')} "
             "(eyas numbering; SGLang's ids in `config.json`, "
             "`eagle_config.eagle_aux_hidden_state_layer_ids`)",
             f"- draft vocabulary: {counts.get('draft_vocab_size', 'see config.json')} tokens "
             "(`d2t` maps them to the target's)", "",
             "## Training data", "", *_data(stats), "",
             "## Training", "", "Settings of the run's `train:` section:", "",
             *_training(train, manifest), "",
             "## Acceptance length", "", *_evaluation(report), "",
             "## Served with SGLang", "", *_serving(report), "",
             "---", f"Written by eyas {code_version} on {report.get('created', '')}; figures from "
             "`evaluate/report.json`, `merged/stats.json` and this folder's `manifest.json`."]
    return "\n".join(lines) + "\n"
