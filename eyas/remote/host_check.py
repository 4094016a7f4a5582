"""What a host must have before eyas builds a venv there: its interpreter, glibc and, for
SGLang, the NVIDIA driver -- checked in one round trip, each mismatch one clear message.

    facts = probe_host(host)                       # HostFacts: what the host has
    host_problems(facts, needs_for(["sglang"]))    # [] or one message per mismatch
    check_host(host, ["sglang"])                   # RemoteError listing them, else the facts

SGLang 0.5.23 (the release `eyas[sglang]` pins) ships wheels for CPython 3.11-3.13 tagged
``manylinux_2_34`` (glibc >= 2.34), and pins torch 2.14.1 and flashinfer built for CUDA 13,
which run on an NVIDIA driver of the CUDA 13.0 branch or later: >= 580.65.06 on Linux
(NVIDIA's CUDA toolkit/driver compatibility table). Without SGLang, eyas itself needs the
Python of its ``requires-python`` (>= 3.10) and no driver.

The facts are gathered by a POSIX shell snippet (`facts_command`), not by Python: the
interpreter may be missing or too old, and that is one of the things to report. The parsers
(`parse_python_version`, `parse_glibc`, `parse_nvidia_smi`) and the verdict
(`host_problems`) are pure functions over the captured text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from eyas.errors import RemoteError
from eyas.remote.hosts import shell_join

Version = tuple[int, ...]

SGLANG_PYTHONS = ((3, 11), (3, 13))
"""Python versions SGLang 0.5.23 has wheels for (cp311-cp313), inclusive."""
SGLANG_GLIBC = (2, 34)
"""SGLang 0.5.23's wheels are manylinux_2_34."""
CUDA13_DRIVER = (580, 65, 6)
"""Minimum Linux driver of CUDA 13.0 (torch 2.14.1 and flashinfer cu13, as SGLang 0.5.23 pins)."""
EYAS_PYTHON = (3, 10)
"""eyas's own ``requires-python``."""

_SECTION = "--- eyas:"


@dataclass(frozen=True)
class HostNeeds:
    """What the venv to build needs of the host."""

    python_min: Version
    python_max: Version | None = None
    glibc_min: Version | None = None
    driver_min: Version | None = None
    why: str = "eyas"


def needs_for(extras: list[str] | None) -> HostNeeds:
    """The host's needs for a venv with eyas and `extras` (``sglang`` brings SGLang's)."""
    if "sglang" in (extras or []):
        return HostNeeds(SGLANG_PYTHONS[0], SGLANG_PYTHONS[1], SGLANG_GLIBC, CUDA13_DRIVER,
                         why="SGLang 0.5.23 (eyas[sglang])")
    return HostNeeds(EYAS_PYTHON, why="eyas")


@dataclass
class HostFacts:
    """What the host has, as probed (None: absent or unreadable; `raw` keeps the text)."""

    login: str
    python: str
    python_path: str | None = None
    python_version: Version | None = None
    glibc: Version | None = None
    driver: Version | None = None
    gpus: list[dict] = field(default_factory=list)
    nvidia_smi: str | None = None
    """nvidia-smi's output when it ran but gave no driver version (its error), else None."""
    raw: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        """One line: interpreter, glibc, driver and GPUs."""
        py = (f"{self.python} = Python {_v(self.python_version)}" if self.python_version
              else f"{self.python}: not found" if self.python_path is None
              else f"{self.python}: version unknown")
        driver = f"NVIDIA driver {_driver(self.driver)}" if self.driver else "no NVIDIA driver"
        gpus = ""
        if self.gpus:
            names = sorted({g["name"] for g in self.gpus})
            gpus = f", {len(self.gpus)} GPU(s): {', '.join(names)}"
        glibc = f"glibc {_v(self.glibc)}" if self.glibc else "glibc unknown"
        return f"{py}, {glibc}, {driver}{gpus}"


def _v(version: Version | None) -> str:
    return ".".join(str(x) for x in version) if version else "?"


def _driver(version: Version) -> str:
    """An NVIDIA driver version as NVIDIA writes it: 580.65.06."""
    return ".".join([str(version[0])] + [f"{x:02d}" for x in version[1:]])


def _version(text: str, pattern: str) -> Version | None:
    m = re.search(pattern, text)
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def parse_python_version(text: str) -> Version | None:
    """``Python 3.11.7`` (what ``python --version`` prints) -> (3, 11, 7)."""
    return _version(text, r"Python (\d+\.\d+(?:\.\d+)?)")


def parse_glibc(text: str) -> Version | None:
    """``glibc 2.36`` (getconf GNU_LIBC_VERSION) or ``ldd (Ubuntu GLIBC 2.35-0ubuntu3) 2.35``
    (ldd --version) -> (2, 36)."""
    return (_version(text, r"glibc (\d+\.\d+)") or _version(text, r"GLIBC[^)]*\)\s+(\d+\.\d+)")
            or _version(text, r"GNU libc\)\s+(\d+\.\d+)"))


def parse_nvidia_smi(text: str) -> tuple[Version | None, list[dict]]:
    """The driver version and the GPUs from nvidia-smi's output: the CSV of
    ``--query-gpu=driver_version,name,memory.total --format=csv,noheader`` (one line a GPU:
    ``580.82.07, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887 MiB``), or its usual
    table (``Driver Version: 580.82.07``). (None, []) when neither is there (no driver,
    nvidia-smi failed)."""
    gpus, driver = [], None
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and re.fullmatch(r"\d+\.\d+(\.\d+)?", parts[0]):
            mib = re.match(r"(\d+)\s*MiB", parts[2])
            gpus.append({"driver": parts[0], "name": parts[1],
                         "memory_mib": int(mib.group(1)) if mib else None})
            driver = driver or tuple(int(x) for x in parts[0].split("."))
    if driver is None:
        driver = _version(text, r"Driver Version:\s*(\d+\.\d+(?:\.\d+)?)")
    return driver, gpus


def facts_command(python: str) -> str:
    """The shell snippet that prints the facts, in sections `parse_facts` reads."""
    py = shell_join(python)
    return "; ".join([
        f"echo '{_SECTION}python'",
        f"if command -v {py} >/dev/null 2>&1; then command -v {py}; {py} --version 2>&1; "
        f"else echo MISSING; fi",
        f"echo '{_SECTION}glibc'",
        "(getconf GNU_LIBC_VERSION 2>/dev/null || ldd --version 2>&1 | head -n 1)",
        f"echo '{_SECTION}nvidia-smi'",
        "if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi "
        "--query-gpu=driver_version,name,memory.total --format=csv,noheader 2>&1; "
        "else echo MISSING; fi",
        "true",
    ])


def parse_facts(text: str, *, login: str, python: str) -> HostFacts:
    """`HostFacts` from the output of `facts_command`."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith(_SECTION):
            current = line[len(_SECTION):].strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    raw = {k: "\n".join(v).strip() for k, v in sections.items()}
    facts = HostFacts(login=login, python=python, raw=raw)
    py = sections.get("python", [])
    if py and py[0].strip() != "MISSING":
        facts.python_path = py[0].strip()
        facts.python_version = parse_python_version("\n".join(py[1:]))
    facts.glibc = parse_glibc(raw.get("glibc", ""))
    smi = raw.get("nvidia-smi", "MISSING")
    if smi != "MISSING":
        facts.driver, facts.gpus = parse_nvidia_smi(smi)
        if facts.driver is None:
            facts.nvidia_smi = smi[-300:]
    return facts


def host_problems(facts: HostFacts, needs: HostNeeds) -> list[str]:
    """One message per thing the host lacks for `needs`; [] when it has everything."""
    out = []
    where = facts.login
    hint = ("install it there and name it in the host's `python` field (GpuHost "
            f"python: python{needs.python_min[0]}.{needs.python_min[1]}, or --python)")
    want = (f"Python {_v(needs.python_min)}–{_v(needs.python_max)}" if needs.python_max
            else f"Python >= {_v(needs.python_min)}")
    if facts.python_path is None:
        out.append(f"{where}: interpreter {facts.python!r} is not on the PATH; {needs.why} "
                   f"needs {want}: {hint}")
    elif facts.python_version is None:
        out.append(f"{where}: {facts.python} ({facts.python_path}) did not say its version "
                   f"({facts.raw.get('python', '')[-200:]!r}); {needs.why} needs {want}: {hint}")
    else:
        mm = facts.python_version[:2]
        if mm < needs.python_min or (needs.python_max and mm > needs.python_max):
            wheels = (f" (its wheels are cp{needs.python_min[0]}{needs.python_min[1]}–"
                      f"cp{needs.python_max[0]}{needs.python_max[1]})" if needs.python_max else "")
            out.append(f"{where}: {facts.python} is Python {_v(facts.python_version)}; "
                       f"{needs.why} needs {want}{wheels}: {hint}")
    if needs.glibc_min:
        if facts.glibc is None:
            out.append(f"{where}: glibc version unknown (getconf GNU_LIBC_VERSION and ldd "
                       f"--version gave {facts.raw.get('glibc', '')[-200:]!r}); {needs.why} "
                       f"needs glibc >= {_v(needs.glibc_min)} (manylinux_2_34 wheels)")
        elif facts.glibc < needs.glibc_min:
            out.append(f"{where}: glibc {_v(facts.glibc)}; {needs.why} needs glibc >= "
                       f"{_v(needs.glibc_min)} (its wheels are manylinux_2_34: e.g. Ubuntu "
                       f"22.04, Debian 12, RHEL 9 or later)")
    if needs.driver_min:
        need = (f"{needs.why} needs an NVIDIA driver >= {_driver(needs.driver_min)} (CUDA 13: "
                f"torch 2.14.1, flashinfer cu13)")
        if facts.driver is None and facts.nvidia_smi is None:
            out.append(f"{where}: no NVIDIA driver (nvidia-smi is not on the PATH); {need}")
        elif facts.driver is None:
            out.append(f"{where}: nvidia-smi ran but reported no driver "
                       f"[{' '.join(facts.nvidia_smi.split())}]; {need}")
        elif facts.driver < needs.driver_min:
            out.append(f"{where}: NVIDIA driver {_driver(facts.driver)}; {need}: upgrade the driver "
                       f"to the 580 branch or later")
    return out


def probe_host(host) -> HostFacts:
    """The facts of `host` (an `eyas.remote.hosts.Host`) for its `spec.python`, one round trip."""
    res = host.run(facts_command(host.spec.python), check=False)
    return parse_facts(res.stdout, login=host.spec.login, python=host.spec.python)


def check_host(host, extras: list[str] | None = None) -> HostFacts:
    """The facts of `host`, or RemoteError listing (one a line) what it lacks for a venv with
    eyas and `extras`; called before any venv is built."""
    facts = probe_host(host)
    problems = host_problems(facts, needs_for(extras))
    if problems:
        raise RemoteError("the host cannot run this venv:\n  " + "\n  ".join(problems))
    return facts
