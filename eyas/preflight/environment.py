"""Check 1, environment: the host's Python, glibc, NVIDIA driver and CUDA, its GPUs (count,
model, memory, memory already in use) and the SGLang venv's versions, against what the pinned
SGLang and torch need. The facts and the verdict on them are `eyas.remote.host_check`'s (what
``ship`` and ``eyas status`` check); this adds what only the run itself needs: free GPU memory,
the CUDA version the driver offers and the versions inside the SGLang venv.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

from eyas.preflight.result import CheckFailed, CheckResult
from eyas.remote.host_check import (
    HostNeeds,
    facts_command,
    host_problems,
    needs_for,
    parse_facts,
)

NAME = "environment"
PINNED = {"sglang": "0.5.23", "torch": "2.14.1"}
"""Versions the pinned SGLang release brings into its venv (``eyas[sglang]``)."""
BUSY_FRACTION = 0.10
"""A GPU with more of its memory in use than this, before eyas starts, is held by another
process: the engine's memory plan would not fit."""

_VERSIONS = """
import json, importlib.metadata as md
out = {}
try:
    import sglang
    out["sglang"] = getattr(sglang, "__version__", None) or md.version("sglang")
except Exception as e:
    out["sglang_error"] = f"{type(e).__name__}: {e}"
for name in ("torch", "transformers", "flashinfer-python"):
    try:
        out[name] = md.version(name)
    except md.PackageNotFoundError:
        out[name] = None
print(json.dumps(out))
"""


def _sh(cmd: str, timeout: float = 60) -> str:
    res = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=timeout)
    return res.stdout + res.stderr


def gpu_usage(text: str) -> list[dict[str, Any]]:
    """GPUs from ``nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv,
    noheader,nounits``: ``[{"index", "name", "total_mib", "used_mib"}]``."""
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[0].isdigit() and parts[2].isdigit() and parts[3].isdigit():
            gpus.append({"index": int(parts[0]), "name": parts[1], "total_mib": int(parts[2]),
                         "used_mib": int(parts[3])})
    return gpus


def cuda_version(text: str) -> str | None:
    """The CUDA version the driver offers, from nvidia-smi's table (``CUDA Version: 13.0``)."""
    m = re.search(r"CUDA Version:\s*(\d+\.\d+)", text)
    return m.group(1) if m else None


def sglang_versions(python: str, timeout: float = 120) -> dict[str, Any]:
    """Versions inside the SGLang venv of `python`: sglang, torch, transformers, flashinfer."""
    try:
        res = subprocess.run([python, "-c", _VERSIONS], capture_output=True, text=True,
                             timeout=timeout)
    except FileNotFoundError:
        return {"sglang_error": f"{python}: no such interpreter"}
    lines = res.stdout.strip().splitlines()
    if res.returncode != 0 or not lines:
        return {"sglang_error": (res.stderr or res.stdout).strip()[-300:]}
    return json.loads(lines[-1])


def check_environment(*, needs_gpu: bool, gpus_wanted: int, sglang_python: str | None,
                      login: str = "this host") -> CheckResult:
    """Check 1. `needs_gpu`: the recipe runs on CUDA (SGLang or a cuda device); `gpus_wanted`:
    GPUs the run will use; `sglang_python`: the SGLang venv's interpreter, None when the
    recipe does not use SGLang."""
    facts = parse_facts(_sh(facts_command(sys.executable)), login=login, python=sys.executable)
    needs: HostNeeds = needs_for(["sglang"] if sglang_python else None)
    if not sglang_python:
        needs = HostNeeds(needs.python_min, driver_min=needs_for(["sglang"]).driver_min
                          if needs_gpu else None, why="eyas on CUDA" if needs_gpu else "eyas")
    problems = host_problems(facts, needs)
    smi = _sh("command -v nvidia-smi >/dev/null 2>&1 && { nvidia-smi; nvidia-smi "
              "--query-gpu=index,name,memory.total,memory.used --format=csv,noheader,nounits; }"
              " || echo MISSING")
    gpus = gpu_usage(smi)
    cuda = cuda_version(smi)
    data: dict[str, Any] = {"gpus": gpus, "cuda": cuda, "facts": facts.summary()}
    parts = [facts.summary()]
    partial = ""
    if gpus:
        total = {g["total_mib"] for g in gpus}
        parts.append(f"CUDA {cuda or '?'}; {len(gpus)} x {gpus[0]['name']} "
                     f"({'/'.join(str(t) for t in sorted(total))} MiB)")
        for g in gpus:
            if g["used_mib"] > BUSY_FRACTION * g["total_mib"]:
                problems.append(f"GPU {g['index']} has {g['used_mib']:,} of {g['total_mib']:,} "
                                "MiB in use before eyas starts: another process holds it "
                                "(nvidia-smi lists it); stop it")
        if gpus_wanted > len(gpus):
            problems.append(f"the run wants {gpus_wanted} GPUs, the host has {len(gpus)} "
                            "(GpuHost num_gpus, train.processes, extract.tp_size)")
    elif needs_gpu:
        problems.append("no NVIDIA GPU visible (nvidia-smi missing or failed); the recipe runs "
                        "on CUDA (extract.backend sglang or a cuda device)")
    else:
        partial = "no NVIDIA GPU here: driver, CUDA and GPU memory not checked (the recipe runs on CPU)"
    if sglang_python:
        versions = sglang_versions(sglang_python)
        data["sglang"] = versions
        if "sglang_error" in versions:
            problems.append(f"{sglang_python} cannot import sglang: {versions['sglang_error']}")
        else:
            parts.append("SGLang venv: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v))
            for name, want in PINNED.items():
                have = versions.get(name)
                if have is not None and have.split("+")[0] != want:
                    problems.append(f"{sglang_python}: {name} {have}, eyas is checked against "
                                    f"{name} {want} (SGLang {PINNED['sglang']}'s pins)")
    if problems:
        raise CheckFailed("; ".join(problems), fix=_fix(problems), data=data,
                          figure=f"{len(gpus)} GPU(s)")
    return CheckResult(NAME, True, "; ".join(parts), figure=f"{len(gpus)} GPU(s)",
                       partial=partial, data=data)


def _fix(problems: list[str]) -> str:
    # host_problems' messages say what to install or upgrade; the GPU ones say what to stop.
    return ("fix each mismatch named (install or upgrade what it names; `ship(host, "
            "extras=['sglang'])` builds the SGLang venv), then rerun preflight")
