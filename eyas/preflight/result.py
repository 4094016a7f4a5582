"""What a preflight check says: its verdict, its figure, the fix; and the whole go/no-go report.

The report is one JSON object (`report`): ``{"ok", "checks": [{"name", "ok", "seconds",
"detail", "figure", "fix", "partial"}...], "eta": {"extract_s", "train_s"}}``; `table_rows`
turns it into the rows of the go/no-go table artifact.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from eyas.errors import EyasError


@dataclass
class CheckResult:
    """One check's outcome. `figure`: the headline number as text (e.g. ``"812 tokens/s"``);
    `fix`: what to change when it failed; `partial`: what could not be checked on this machine
    (no GPU: NCCL, CUDA memory) -- said, never passed off as checked; `data`: figures other
    checks use (tokens/s, paths)."""

    name: str
    ok: bool
    detail: str
    figure: str = ""
    fix: str = ""
    partial: str = ""
    seconds: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("data")
        out["seconds"] = round(self.seconds, 2)
        return out


class CheckFailed(Exception):
    """Raised inside a check: the check fails with this detail and `fix`."""

    def __init__(self, detail: str, fix: str = "", *, figure: str = "",
                 data: dict[str, Any] | None = None) -> None:
        super().__init__(detail)
        self.detail, self.fix, self.figure, self.data = detail, fix, figure, data or {}


class PreflightFailed(EyasError):
    """A NO-GO: the message names each failed check and its fix; `report` is the whole report."""

    def __init__(self, message: str, report: dict[str, Any] | None = None) -> None:
        super().__init__(message, report)
        self.report = report

    def __str__(self) -> str:
        return str(self.args[0])


def no_go(rep: dict[str, Any]) -> PreflightFailed:
    """The PreflightFailed of a NO-GO report: one line per failed check, with its fix."""
    failed = [c for c in rep["checks"] if not c["ok"]]
    return PreflightFailed("preflight: NO-GO\n" + "\n".join(
        f"- {c['name']}: {(c['detail'] or '').splitlines()[0] if c['detail'] else ''}"
        + (f" -- fix: {c['fix']}" if c.get("fix") else "") for c in failed), rep)


def bounded(name: str, fn: Callable[[], CheckResult], timeout_s: float) -> CheckResult:
    """Run check `fn` in a thread of its own and wait at most `timeout_s`.

    A check that overruns is reported failed (``timed out``) and left behind as a daemon
    thread; the checks that start processes bound those themselves (`eyas.preflight.proc`),
    so nothing they started outlives its own limit. A `CheckFailed` becomes a failed result
    with its fix; any other error a failed result naming it.
    """
    box: dict[str, CheckResult] = {}
    t0 = time.monotonic()

    def target() -> None:
        try:
            box["r"] = fn()
        except CheckFailed as exc:
            box["r"] = CheckResult(name, False, exc.detail, figure=exc.figure, fix=exc.fix,
                                   data=exc.data)
        except Exception as exc:  # noqa: BLE001 - a check's crash is its verdict, not ours
            box["r"] = CheckResult(name, False, f"{type(exc).__name__}: {exc}",
                                   fix="see the detail; rerun preflight once fixed")

    thread = threading.Thread(target=target, name=f"preflight-{name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    seconds = time.monotonic() - t0
    if "r" not in box:
        return CheckResult(name, False, f"did not finish within {timeout_s:g}s",
                           fix="raise preflight.check_timeout_s if the host is just slow, else "
                               "see the log for where it stopped", seconds=seconds)
    result = box["r"]
    result.seconds = seconds
    return result


def report(results: list[CheckResult], eta: dict[str, float | None]) -> dict[str, Any]:
    """The preflight report: go (``ok``) only when every check passed."""
    return {"ok": bool(results) and all(r.ok for r in results),
            "checks": [r.to_json() for r in results], "eta": eta}


def table_rows(rep: dict[str, Any]) -> list[dict[str, str]]:
    """One row per check for the go/no-go table: check, verdict, figure, seconds, detail, fix."""
    rows = []
    for c in rep["checks"]:
        verdict = "GO" if c["ok"] else "NO-GO"
        if c.get("partial"):
            verdict += " (partial)"
        detail = c["detail"] + (f" [not checked here: {c['partial']}]" if c.get("partial") else "")
        rows.append({"check": c["name"], "verdict": verdict, "figure": c.get("figure", ""),
                     "seconds": f"{c['seconds']:.1f}", "detail": detail,
                     "fix": c.get("fix", "") if not c["ok"] else ""})
    return rows


def summary_lines(rep: dict[str, Any]) -> list[str]:
    """Readable lines: one per check, then the ETAs and the verdict."""
    lines = []
    for row in table_rows(rep):
        lines.append(f"{row['check']:<12} {row['verdict']:<16} {row['figure']:<28} "
                     f"{row['seconds']:>6}s  {row['detail']}")
        if row["fix"]:
            lines.append(f"{'':<12} fix: {row['fix']}")
    eta = rep.get("eta") or {}

    def hours(s: float | None) -> str:
        return "unknown" if s is None else f"{s / 3600:,.2f} h ({s:,.0f} s)"

    lines.append(f"ETA: extraction {hours(eta.get('extract_s'))}, training "
                 f"{hours(eta.get('train_s'))}")
    lines.append("preflight: GO" if rep["ok"] else "preflight: NO-GO")
    return lines
