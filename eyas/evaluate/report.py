"""The evaluation as a person reads it: one self-contained HTML page, and a markdown summary.

Both are drawn from ``report.json`` alone (`eyas.evaluate.run.build_report`), so a report can be
redrawn later, or with a serving benchmark added: ``report["serving"]`` is None or
``{"rows": [...], "verdict": str}``, each row ``{"mode": "baseline"|"eagle3", "batch_size",
"num_steps", "eagle_topk", "num_draft_tokens", "output_tok_s", "accept_length"}``.

A report whose offline evaluation did not run (``report["offline"]["run"]`` false: a target
too big for one device, `eyas.evaluate.fit`) has no offline figures: the page, the headline and
the summary say "not run: <reason>" there and show the serving part and the accept-length
check (`eyas.evaluate.accept_check`) alone.

Pictures (PNG, embedded as data URIs: the page needs no other file and no network):
acceptance by draft position, τ per dataset beside the baselines, and, with serving rows,
output throughput by batch size. matplotlib is imported only when drawing.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

from eyas.io import atomic_write

LABELS = {"eagle3": "trained drafter", "untrained": "untrained drafter",
          "ngram": "n-gram (prompt lookup)", "target": "target alone"}
COLORS = {"eagle3": "#2b6cb0", "untrained": "#a0aec0", "ngram": "#dd6b20", "target": "#4a5568"}


def _methods(report: dict[str, Any]) -> list[str]:
    # baselines by name: the page is the same whether drawn by the run or from report.json
    return ["eagle3", *sorted(report.get("baselines", {}))]


def _summary_of(report: dict[str, Any], method: str) -> dict[str, Any]:
    return report["trained"] if method == "eagle3" else report["baselines"][method]


def _png(fig: Any) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def position_picture(report: dict[str, Any]) -> bytes:
    """Bars: acceptance rate at each draft position, per method."""
    plt = _pyplot()
    methods = _methods(report)
    k = report["draft_tokens"]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    width = 0.8 / len(methods)
    for j, m in enumerate(methods):
        rows = _summary_of(report, m)["per_position"]
        xs = [r["position"] + (j - (len(methods) - 1) / 2) * width for r in rows]
        ax.bar(xs, [r["rate"] or 0.0 for r in rows], width, label=LABELS.get(m, m),
               color=COLORS.get(m))
    ax.set_xticks(range(1, k + 1))
    ax.set_xlabel("draft position (given every earlier draft was accepted)")
    ax.set_ylabel("accepted share")
    ax.set_ylim(0, 1)
    ax.set_title("Acceptance by draft position")
    ax.legend(fontsize="small", loc="upper right")
    fig.tight_layout()
    return _png(fig)


def dataset_picture(report: dict[str, Any]) -> bytes:
    """Bars: τ per dataset (and overall) for the trained drafter and each baseline, with their
    95 % intervals as error bars."""
    plt = _pyplot()
    methods = _methods(report)
    groups = ["all", *report["per_dataset"]]
    fig, ax = plt.subplots(figsize=(max(6.4, 1.1 * len(groups) + 1.5), 4.2))
    width = 0.8 / len(methods)
    top = 1.0
    for j, m in enumerate(methods):
        values = [_summary_of(report, m)["acceptance_length"] or 0.0]
        values += [report["per_dataset"][g].get(m) or 0.0 for g in groups[1:]]
        cis = [_summary_of(report, m).get("ci95")]
        cis += [(report["per_dataset"][g].get("ci95") or {}).get(m) for g in groups[1:]]
        # 95 % intervals as error bars (none where there is no interval).
        err = [[max(0.0, v - ci[0]) if ci else 0.0 for v, ci in zip(values, cis, strict=True)],
               [max(0.0, ci[1] - v) if ci else 0.0 for v, ci in zip(values, cis, strict=True)]]
        top = max(top, *values, *[ci[1] for ci in cis if ci])
        xs = [i + (j - (len(methods) - 1) / 2) * width for i in range(len(groups))]
        bars = ax.bar(xs, values, width, label=LABELS.get(m, m), color=COLORS.get(m),
                      yerr=err, capsize=2, error_kw={"lw": 0.8, "ecolor": "#2d3748"})
        ax.bar_label(bars, fmt="%.2f", fontsize="x-small")
    ax.axhline(1.0, color="#718096", lw=0.8, ls="--")
    ax.set_ylim(0, top * 1.15)
    ax.set_xticks(range(len(groups)), groups, rotation=20 if len(groups) > 4 else 0)
    ax.set_ylabel("τ (tokens per verification)")
    ax.set_title(f"Acceptance length τ, {report['mode']}, {report['draft_tokens']} draft tokens\n"
                 "(bars: 95 % intervals over prompts)", fontsize="medium")
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.16 if len(groups) <= 4
              else -0.24), ncol=len(methods), frameon=False)
    fig.tight_layout()
    return _png(fig)


def serving_picture(serving: dict[str, Any]) -> bytes:
    """Lines: output tokens/s by batch size, without speculation, with SGLang's n-gram
    speculation when served, and with the best EAGLE-3 setting of each batch size (every
    setting as a faint dot)."""
    plt = _pyplot()
    rows = serving["rows"]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    base = sorted((r["batch_size"], r["output_tok_s"]) for r in rows if r["mode"] == "baseline")
    eagle = [r for r in rows if r["mode"] == "eagle3"]
    ngram = sorted((r["batch_size"], r["output_tok_s"]) for r in rows if r["mode"] == "ngram")
    if base:
        ax.plot(*zip(*base, strict=True), "o-", color=COLORS["target"], label="no speculation")
    if ngram:
        ax.plot(*zip(*ngram, strict=True), "^--", color="0.45", label="SGLang n-gram")
    if eagle:
        best: dict[int, float] = {}
        for r in eagle:
            best[r["batch_size"]] = max(best.get(r["batch_size"], 0.0), r["output_tok_s"])
        ax.scatter([r["batch_size"] for r in eagle], [r["output_tok_s"] for r in eagle],
                   color=COLORS["eagle3"], alpha=0.3, s=14, label="EAGLE-3, each setting")
        xs = sorted(best)
        ax.plot(xs, [best[x] for x in xs], "s-", color=COLORS["eagle3"],
                label="EAGLE-3, best setting")
    ax.set_xscale("log", base=2)
    sizes = sorted({r["batch_size"] for r in rows})
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_xlabel("batch size (concurrent requests)")
    ax.set_ylabel("output tokens/s")
    ax.set_title("Served throughput by batch size")
    ax.legend(fontsize="small")
    fig.tight_layout()
    return _png(fig)


def _offline(report: dict[str, Any]) -> bool:
    return (report.get("offline") or {}).get("run", True)


def _not_run(report: dict[str, Any]) -> str:
    return "not run: " + ((report.get("offline") or {}).get("reason") or "no reason recorded")


def pictures(report: dict[str, Any]) -> dict[str, bytes]:
    """Every picture of the report, by name (``serving`` only with serving rows; the offline
    ones only when the offline evaluator ran)."""
    out = ({"positions": position_picture(report), "datasets": dataset_picture(report)}
           if _offline(report) else {})
    if report.get("serving") and report["serving"].get("rows"):
        out["serving"] = serving_picture(report["serving"])
    return out


def _f(value: Any, digits: int = 3, suffix: str = "") -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}{suffix}"
    return f"{value}{suffix}"


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _short(source: str) -> str:
    """A prompt source as its last two path parts (``merged/eval.jsonl``), words kept."""
    words = source.split(" ")
    return " ".join("/".join(Path(w).parts[-2:]) if "/" in w else w for w in words)


def _img(png: bytes, alt: str) -> str:
    return (f'<img alt="{html.escape(alt)}" src="data:image/png;base64,'
            f'{base64.b64encode(png).decode()}">')


def headline(report: dict[str, Any]) -> str:
    """One sentence: τ, the baselines, the predicted speedup, lossless or not; without the
    offline evaluation, why, and the serving verdict."""
    if not _offline(report):
        verdict = ((report.get("serving") or {}).get("verdict") or "no serving benchmark"
                   ).rstrip(".")
        check = report.get("accept_check") or {}
        served = (f"; SGLang's accept length {_f(check['served'], 2)}"
                  if check.get("served") is not None else "")
        return f"Offline evaluation {_not_run(report)}. Serving: {verdict}{served}"
    base = ", ".join(f"{LABELS.get(m, m)} {_f(s['acceptance_length'], 2)}{_ci(s.get('ci95'))}"
                     for m, s in sorted(report["baselines"].items()))
    return (f"τ {_f(report['acceptance_length'], 2)}{_ci(report.get('acceptance_length_ci95'))} "
            f"with {report['draft_tokens']} draft tokens ({base}); {_speed(report)}; "
            f"{_lossless_words(report)}")


def _ci(ci: Any) -> str:
    """`` [lo–hi]`` for a 95 % interval, '' without one."""
    if isinstance(ci, list | tuple) and len(ci) == 2 and None not in ci:
        return f" [{ci[0]:.2f}–{ci[1]:.2f}]"
    return ""


def device_label(report: dict[str, Any]) -> str:
    """"this device (<name>)": the figures measured where the offline evaluator ran."""
    dev = report.get("device") or {}
    return f"this device ({dev.get('name') or dev.get('device') or 'unknown'})"


def _speed(report: dict[str, Any]) -> str:
    """The speedups, each labelled with where its costs were measured."""
    here = (f"speedup on {device_label(report)}: predicted "
            f"{_f(report.get('predicted_speedup_this_device'), 2, '×')}, measured "
            f"{_f(report.get('speedup_measured'), 2, '×')}")
    if report.get("predicted_speedup") is not None:
        return f"serving speedup predicted {_f(report['predicted_speedup'], 2, '×')}; {here}"
    return f"{here}; serving speedup {report.get('predicted_speedup_note') or 'not predicted'}"


def _lossless_words(report: dict[str, Any]) -> str:
    lossless = report["lossless"]
    if not lossless["checked"]:
        rule = (report.get("sampling") or {}).get("rule")
        return f"sampling mode ({rule})" if rule else "sampling mode"
    if not lossless["equal"]:
        return f"OUTPUT DIFFERS from the target's own ({lossless.get('real')} real divergence(s))"
    near = lossless.get("near_ties") or 0
    settled = lossless.get("float32_rounding") or 0
    if not near and not settled:
        return "output equal to the target's own"
    parts = [f"{near} near-tie divergence(s)"] if near else []
    if settled:
        parts.append(f"{settled} within rounding in float32")
    return f"output equal to the target's own but for {' and '.join(parts)}"


def render_html(report: dict[str, Any], title: str | None = None) -> str:
    """The whole page (inline CSS and pictures)."""
    title = title or f"Drafter evaluation: {report.get('run', '')}".rstrip(": ")
    pics = pictures(report)
    parts = [f"<h1>{html.escape(title)}</h1>",
             f'<p class="headline">{html.escape(headline(report))}</p>']
    check = report.get("accept_check") or {}
    if check.get("flagged"):
        parts.append(f'<p class="flag">⚠ {html.escape(check["note"])}</p>')
    if _offline(report):
        parts += _offline_sections(report, pics)
    else:
        parts += ["<h2>Offline evaluation</h2>",
                  f"<p>{html.escape(_not_run(report))}. No offline τ, baselines, tokens/s or "
                  "lossless check in this report.</p>"]
    parts += _accept_section(report)
    serving = report.get("serving")
    if serving and serving.get("rows"):
        keys = ["mode", "batch_size", "num_steps", "eagle_topk", "num_draft_tokens",
                "output_tok_s", "output_tok_s_min", "output_tok_s_max", "decode_tok_s",
                "ttft_s", "accept_length", "repeats"]
        parts += ["<h2>Served throughput</h2>",
                  f'<p class="headline">{html.escape(serving.get("verdict") or "")}</p>',
                  _img(pics["serving"], "served throughput by batch size"),
                  _table(keys, [[_f(r.get(k), 2) if isinstance(r.get(k), float) else
                                 _f(r.get(k)) for k in keys] for r in serving["rows"]])]
    else:
        parts.append("<h2>Served throughput</h2><p>No serving benchmark in this run "
                     "(it runs on a configured GPU host).</p>")
    if _offline(report):
        parts += _prompt_sections(report)
    parts += ["<h2>Configuration</h2><details><summary>report settings</summary><pre>"
              + html.escape(json.dumps({k: report.get(k) for k in
                                        ("config", "target", "drafter", "device", "created",
                                         "offline")}
                                       | {"prompt_sources": (report.get("prompts") or {})
                                          .get("sources")},
                                       indent=2, sort_keys=True, default=str))
              + "</pre></details>"]
    css = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#1a202c}"
           "table{border-collapse:collapse;margin:.5em 0 1em}td,th{border:1px solid #cbd5e0;"
           "padding:.25em .6em;text-align:right}th{background:#edf2f7}td:first-child{text-align:left}"
           ".headline{font-size:1.15em;font-weight:600}.flag{background:#fffaf0;border-left:4px solid "
           "#dd6b20;padding:.5em}.pics{display:flex;flex-wrap:wrap;gap:1em;align-items:flex-start}img{max-width:100%}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{css}</style></head><body>{''.join(parts)}</body></html>\n")


def _accept_section(report: dict[str, Any]) -> list[str]:
    """SGLang's accept length beside the offline and simulated τ (`eyas.evaluate.accept_check`)."""
    check = report.get("accept_check") or {}
    if not check.get("available"):
        return []
    setting = check.get("served_setting") or {}
    rows = [[f"SGLang's accept length (steps {setting.get('num_steps')}, topk 1, batch "
             f"{setting.get('batch_size')})", _f(check["served"])],
            [f"offline τ ({check.get('offline_draft_tokens')} drafts)",
             _f(check.get("offline")) if check.get("offline") is not None
             else _not_run(report) if not _offline(report) else "–"],
            [f"training's simulated τ ({setting.get('num_steps')} drafts)",
             _f(check.get("simulated"))]]
    if check.get("reference"):
        rows.append([f"gap to {check['reference']} (flagged beyond)",
                     f"{check['gap']:+.3f} ({_f(check['limit'])})"])
    out = ["<h2>Accept length: served, offline, simulated</h2>",
           _table(["", "tokens per verification"], rows),
           f"<p>{html.escape(check.get('note') or '')}</p>"]
    if check.get("causes"):
        out.append("<p>What usually causes it:</p><ul>" + "".join(
            f"<li>{html.escape(c)}</li>" for c in check["causes"]) + "</ul>")
    return out


def _offline_sections(report: dict[str, Any], pics: dict[str, bytes]) -> list[str]:
    """The offline evaluator's tables and pictures."""
    methods = _methods(report)
    tps = report["tokens_per_s"]
    sim = report.get("simulated") or {}
    summary_rows = [[LABELS["target"], "–", _f(tps.get("target"), 1), "1.00×"]]
    for m in methods:
        s = _summary_of(report, m)
        ratio = (tps.get(m) / tps["target"]) if tps.get(m) and tps.get("target") else None
        summary_rows.append([LABELS.get(m, m), _f(s["acceptance_length"]), _f(tps.get(m), 1),
                             _f(ratio, 2, "×")])
    costs = report["costs"]
    here = device_label(report)
    cost_rows = [[f"target decoding step, {here}", _f(costs["target_step_ms"], 2, " ms")],
                 [f"draft step (trained drafter, cache update included), {here}",
                  _f(costs["draft_step_ms"], 2, " ms")],
                 [f"verification of {report['draft_tokens'] + 1} tokens, {here}",
                  _f(costs["verify_ms"], 2, " ms")],
                 ["draft / target cost c", _f(costs["draft_to_target"])],
                 [f"speedup on {here} predicted from its costs: τ · step / (k · draft + verify)",
                  _f(report["predicted_speedup_this_device"], 2, "×")],
                 [f"speedup measured on {here}", _f(report["speedup_measured"], 2, "×")],
                 ["serving speedup (from costs measured on the serving engine)",
                  _f(report["predicted_speedup"], 2, "×") if report.get("predicted_speedup")
                  is not None else report.get("predicted_speedup_note") or "not predicted"]]
    pos_rows = []
    for i in range(report["draft_tokens"]):
        row: list[Any] = [i + 1]
        for m in methods:
            r = _summary_of(report, m)["per_position"][i]
            row += [_f(r["rate"]), f"{r['accepted']}/{r['reached']}"]
        pos_rows.append(row)
    pos_header = ["position"] + [h for m in methods
                                 for h in (f"{LABELS.get(m, m)} rate", "accepted/reached")]
    ds_rows = [[ds, v["prompts"],
                *[_f(v.get(m)) + _ci((v.get("ci95") or {}).get(m)) for m in methods],
                *[_claim(v, m) for m in methods[1:]]]
               for ds, v in report["per_dataset"].items()]
    summary_rows = [[r[0], r[1] + (_ci(_summary_of(report, m).get("ci95")) if i else ""),
                     *r[2:]] for i, (r, m) in enumerate(zip(summary_rows, ["target", *methods],
                                                             strict=True))]
    parts = []
    if sim.get("flagged"):
        parts.append(f'<p class="flag">⚠ {html.escape(sim["note"])}</p>')
    lossless = report["lossless"]
    if lossless["checked"] and not lossless["equal"]:
        real = [m for m in lossless["mismatches"] if not m.get("rounding", m.get("near_tie"))]
        parts.append('<p class="flag">⚠ Drafted output differs from the target\'s own greedy '
                     f'output: {html.escape(json.dumps(real[:5]))}</p>')
    parts += ["<h2>Acceptance length and throughput</h2>",
              _table(["decoding", "τ", "tokens/s", "vs target alone"], summary_rows),
              '<div class="pics">', _img(pics["datasets"], "acceptance length per dataset"),
              _img(pics["positions"], "acceptance by draft position"), "</div>",
              "<h2>Per dataset</h2>",
              _table(["dataset", "prompts", *[f"τ {LABELS.get(m, m)} [95 %]" for m in methods],
                      *[f"trained vs {LABELS.get(m, m)}" for m in methods[1:]]], ds_rows),
              "<p>95 % intervals: bootstrap over the dataset's prompts (2,000 resamples, "
              "seeded). The trained drafter is called ahead of (or behind) a baseline only when "
              "the interval of their difference excludes zero.</p>",
              "<h2>Acceptance by draft position</h2>", _table(pos_header, pos_rows),
              "<h2>Costs and predicted speedup</h2>", _table(["", "value"], cost_rows)]
    if sim.get("available"):
        parts += ["<h2>Training's simulated τ beside the measured one</h2>",
                  _table(["", "value"], [
                      ["training acc_i (best evaluation)", ", ".join(f"{a:.3f}" for a in sim["acc"])],
                      ["measured acceptance at draft positions 1..k (same conditioning)",
                       ", ".join(_f(r["rate"]) for r in report["per_position"])],
                      [f"simulated τ for {sim['draft_tokens']} drafts: 1 + Σ Π acc_i",
                       _f(sim["simulated_acceptance_length"])],
                      ["measured τ", _f(sim["measured_acceptance_length"])],
                      ["relative gap", _f(sim["relative_gap"] * 100 if sim["relative_gap"] is not None
                                          else None, 1, " %")],
                      ["flagged (gap above)", f"{sim['flagged']} ({sim['warn_above'] * 100:.0f} %)"]])]
    return parts


def _claim(per_dataset: dict[str, Any], method: str) -> str:
    """The trained drafter against `method` on one dataset: the difference, its interval, and
    "ahead"/"behind" only when the interval excludes zero."""
    tau_e, tau_m = per_dataset.get("eagle3"), per_dataset.get(method)
    if tau_e is None or tau_m is None:
        return "–"
    verdict = (per_dataset.get("trained_is") or {}).get(method, "not computed")
    ci = (per_dataset.get("difference_ci95") or {}).get(method)
    return f"{tau_e - tau_m:+.2f}{_ci(ci)}: {verdict}"


def _prompt_sections(report: dict[str, Any]) -> list[str]:
    p = report["prompts"]
    lossless = report["lossless"]
    return ["<h2>Prompts</h2>",
              f"<p>{p['count']} held-out prompts ({html.escape(', '.join(f'{k}: {v}' for k, v in p['per_dataset'].items()))}); "
              f"left out: {p['left_out_training']} equal to a training prompt, {p['left_out_long']} "
              f"too long, {p['left_out_empty']} without a prompt. Sources: "
              f"{html.escape('; '.join(_short(x) for x in p['sources']))} (full paths under "
              "Configuration).</p>",
              *([f"<p>Skipped prompt-file records ({p['left_out_empty']} without a prompt "
                   "counted above; the first listed):</p><ul>"
                   + "".join(f"<li>{html.escape(x)}</li>" for x in p["skipped"]) + "</ul>"]
                if p.get("skipped") else []),
              f"<p>Lossless check: {html.escape(lossless['note'])}.</p>"]


def write_html(report: dict[str, Any], path: Path, title: str | None = None) -> Path:
    """Write the page atomically; return `path`."""
    with atomic_write(Path(path)) as fh:
        fh.write(render_html(report, title))
    return Path(path)


def markdown_summary(report: dict[str, Any], html_path: str | None = None) -> str:
    """A short markdown account (for a Prefect artifact): the headline and the main table."""
    check = report.get("accept_check") or {}
    flag = ([f"**Accept length flagged**: {check['note']}. Usual causes: "
             + "; ".join(check["causes"]) + "."] if check.get("flagged") else [])
    if not _offline(report):
        lines = [f"## Drafter evaluation: {headline(report)}", "", *flag]
        if html_path:
            lines.append(f"Full report: `{html_path}`")
        return "\n".join(lines) + "\n"
    tps = report["tokens_per_s"]
    lines = [f"## Drafter evaluation: {headline(report)}", "",
             "| decoding | τ | tokens/s |", "|---|---|---|",
             f"| target alone | – | {_f(tps.get('target'), 1)} |"]
    for m in _methods(report):
        s = _summary_of(report, m)
        lines.append(f"| {LABELS.get(m, m)} | {_f(s['acceptance_length'])}{_ci(s.get('ci95'))} "
                     f"| {_f(tps.get(m), 1)} |")
    sim = report.get("simulated") or {}
    lines += ["", f"Draft-step cost c = {_f(report['costs']['draft_to_target'])}; "
              f"{_speed(report)}."]
    if sim.get("available"):
        lines.append(f"Training's simulated τ for {sim['draft_tokens']} drafts: "
                     f"{_f(sim['simulated_acceptance_length'])}; measured "
                     f"{_f(sim['measured_acceptance_length'])}"
                     + (f" — **flagged**: {sim['note']}" if sim["flagged"] else "."))
    if report.get("serving") and report["serving"].get("verdict"):
        lines.append(f"Serving: {report['serving']['verdict']}")
    if check.get("available"):
        lines.append(f"SGLang's accept length {_f(check['served'])} beside the offline τ "
                     f"{_f(check.get('offline'))} and training's simulated "
                     f"{_f(check.get('simulated'))}.")
    lines += flag
    if html_path:
        lines.append(f"Full report: `{html_path}`")
    return "\n".join(lines) + "\n"
