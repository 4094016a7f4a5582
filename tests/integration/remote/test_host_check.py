"""The host's interpreter, glibc and NVIDIA driver, checked before a venv is built: the parsers
on captured output, the verdicts, and `ship` refusing a host whose Python is too old -- over
the real loopback sshd, before any venv exists."""

from __future__ import annotations

import os
import stat

import pytest

from eyas.errors import RemoteError
from eyas.remote.host_check import (
    CUDA13_DRIVER,
    HostFacts,
    check_host,
    facts_command,
    host_problems,
    needs_for,
    parse_facts,
    parse_glibc,
    parse_nvidia_smi,
    parse_python_version,
    probe_host,
)
from eyas.remote.hosts import HostSpec, LocalHost, SSHHost
from eyas.remote.ship import ship

SGLANG = needs_for(["sglang"])

# `nvidia-smi --query-gpu=driver_version,name,memory.total --format=csv,noheader` on an
# 8 x RTX PRO 6000 Blackwell host (the shape NVIDIA documents; values as the users' cards).
SMI_CSV = "\n".join(["580.82.07, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887 MiB"] * 8)
# The head of plain `nvidia-smi` on a host with an older driver.
SMI_TABLE = """\
Tue Dec  1 15:40:09 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 570.133.20             Driver Version: 570.133.20     CUDA Version: 12.8     |
|-----------------------------------------+------------------------+----------------------+
"""
SMI_FAILED = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
              "Make sure that the latest NVIDIA driver is installed and running.")


def test_parsers_read_captured_output():
    assert parse_python_version("Python 3.11.7") == (3, 11, 7)
    assert parse_python_version("Python 2.7.18\n") == (2, 7, 18)
    assert parse_python_version("bash: python3.11: command not found") is None
    assert parse_glibc("glibc 2.36") == (2, 36)
    assert parse_glibc("ldd (Ubuntu GLIBC 2.35-0ubuntu3.8) 2.35") == (2, 35)
    assert parse_glibc("ldd (GNU libc) 2.34") == (2, 34)
    assert parse_glibc("") is None
    driver, gpus = parse_nvidia_smi(SMI_CSV)
    assert driver == (580, 82, 7) and len(gpus) == 8
    assert gpus[0] == {"driver": "580.82.07", "memory_mib": 97887,
                       "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition"}
    assert parse_nvidia_smi(SMI_TABLE) == ((570, 133, 20), [])
    assert parse_nvidia_smi(SMI_FAILED) == (None, [])


def _facts(smi: str | None = SMI_CSV, python: str = "Python 3.11.7", glibc: str = "glibc 2.39",
           name: str = "python3.11") -> HostFacts:
    text = "\n".join(["--- eyas:python", f"/usr/bin/{name}", python, "--- eyas:glibc", glibc,
                      "--- eyas:nvidia-smi", "MISSING" if smi is None else smi])
    return parse_facts(text, login="train@192.0.2.10:22", python=name)


def test_a_host_that_has_everything_passes_and_says_so():
    facts = _facts()
    assert host_problems(facts, SGLANG) == []
    assert facts.summary() == ("python3.11 = Python 3.11.7, glibc 2.39, NVIDIA driver 580.82.07, "
                               "8 GPU(s): NVIDIA RTX PRO 6000 Blackwell Server Edition")


def test_each_mismatch_is_one_clear_message():
    old = _facts(smi=SMI_TABLE, python="Python 3.9.18", glibc="ldd (GNU libc) 2.31",
                 name="python3.9")
    problems = host_problems(old, SGLANG)
    assert len(problems) == 3
    assert problems[0] == (
        "train@192.0.2.10:22: python3.9 is Python 3.9.18; SGLang 0.5.23 (eyas[sglang]) needs "
        "Python 3.11–3.13 (its wheels are cp311–cp313): install it there and name it in the "
        "host's `python` field (GpuHost python: python3.11, or --python)")
    assert problems[1].startswith("train@192.0.2.10:22: glibc 2.31; SGLang 0.5.23 "
                                  "(eyas[sglang]) needs glibc >= 2.34 (its wheels are "
                                  "manylinux_2_34")
    assert problems[2].startswith("train@192.0.2.10:22: NVIDIA driver 570.133.20; SGLang "
                                  "0.5.23 (eyas[sglang]) needs an NVIDIA driver >= 580.65.06")
    assert CUDA13_DRIVER == (580, 65, 6)
    # too new for SGLang's wheels, fine for eyas alone
    new = _facts(python="Python 3.14.0", name="python3.14")
    assert ["needs Python 3.11–3.13" in p for p in host_problems(new, SGLANG)] == [True]
    assert host_problems(new, needs_for(["orchestrate"])) == []


def test_no_driver_and_a_failing_nvidia_smi_are_named():
    (none,) = host_problems(_facts(smi=None), SGLANG)
    assert none == ("train@192.0.2.10:22: no NVIDIA driver (nvidia-smi is not on the PATH); "
                    "SGLang 0.5.23 (eyas[sglang]) needs an NVIDIA driver >= 580.65.06 (CUDA 13: "
                    "torch 2.14.1, flashinfer cu13)")
    (failed,) = host_problems(_facts(smi=SMI_FAILED), SGLANG)
    assert failed.startswith("train@192.0.2.10:22: nvidia-smi ran but reported no driver "
                             "[NVIDIA-SMI has failed because it couldn't communicate")
    assert host_problems(_facts(smi=None), needs_for(None)) == []  # eyas alone needs no GPU


def test_facts_of_this_machine_through_the_real_shell(tmp_path):
    host = LocalHost(HostSpec(kind="local", known_hosts=None, data_root=str(tmp_path),
                              python="python3"))
    facts = probe_host(host)
    assert facts.python_version is not None and facts.python_version >= (3, 10)
    assert facts.glibc is not None and facts.python_path
    missing = probe_host(LocalHost(HostSpec(kind="local", known_hosts=None,
                                            data_root=str(tmp_path), python="python3.99")))
    (msg,) = host_problems(missing, needs_for(None))
    assert msg == ("local:" + missing.login.split(":", 1)[1] + ": interpreter 'python3.99' is "
                   "not on the PATH; eyas needs Python >= 3.10: install it there and name it "
                   "in the host's `python` field (GpuHost python: python3.10, or --python)")
    assert "'/opt/my python/bin/python3'" in facts_command("/opt/my python/bin/python3")


def _fake_python39(folder) -> str:
    """A `python3.9` that says it is 3.9 (and fails for anything else, as a venv build would)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "python3.9"
    path.write_text('#!/bin/sh\nif [ "$1" = "--version" ]; then echo "Python 3.9.18"; exit 0; fi\n'
                    'echo "fake python3.9 asked to run: $*" >&2\nexit 1\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


@pytest.mark.ssh
def test_ship_refuses_a_host_whose_python_is_too_old_before_any_venv(sshd, tmp_path):
    python = _fake_python39(sshd.data_root.parent / "old-bin")
    venv = str(sshd.data_root / "ship-too-old" / "venv")
    with SSHHost(sshd.spec(python=python, venv=venv)) as host:
        with pytest.raises(RemoteError) as exc:
            ship(host, extras=["sglang"])
        problems = str(exc.value).splitlines()
        assert problems[0] == "the host cannot run this venv:"
        assert f"{python} is Python 3.9.18; SGLang 0.5.23 (eyas[sglang]) needs Python " \
               f"3.11–3.13" in problems[1]
        assert any("NVIDIA driver" in p for p in problems[1:])  # this machine has none
        with pytest.raises(RemoteError, match=r"is Python 3\.9\.18; eyas needs Python >= 3\.10"):
            check_host(host, ["orchestrate"])
    assert not os.path.exists(venv)  # nothing was built


@pytest.mark.ssh
def test_status_reports_what_the_host_lacks_for_sglang(sshd, tmp_path):
    """`eyas status` over SSH names the host's interpreter, glibc and driver and each thing
    SGLang 0.5.23 needs that it lacks (this machine: no NVIDIA driver; the fake: Python 3.9)."""
    from eyas.remote.probe import status

    python = _fake_python39(sshd.data_root.parent / "old-bin-status")
    base = sshd.data_root.parent / "status-host"
    base.mkdir(exist_ok=True)
    with SSHHost(sshd.spec(data_root=str(base))) as host:
        ok = status(host, str(base / "w"), host_needs=needs_for(None))
        rep = status(host, str(base / "w"), host_needs=SGLANG)
    assert ok.host["problems"] == [] and "no NVIDIA driver" in ok.host["summary"]
    assert [p.split("; ")[0].split(": ", 1)[1] for p in rep.host["problems"]] == [
        "no NVIDIA driver (nvidia-smi is not on the PATH)"]
    assert "host ! " in rep.text() and rep.to_dict()["host_check"] == rep.host
    # the probe itself runs with the host's `python`: a 3.9 there is named, not hidden
    facts = probe_host(SSHHost(sshd.spec(python=python)))
    assert facts.python_version == (3, 9, 18)
    assert host_problems(facts, SGLANG)[0].endswith(
        "(its wheels are cp311–cp313): install it there and name it in the host's `python` "
        "field (GpuHost python: python3.11, or --python)")


def test_status_cli_checks_the_host_for_sglang(tmp_path, capsys):
    import argparse
    import json

    from eyas.cli import cmd_status as status_main
    from eyas.remote.probe import add_status_arguments

    p = argparse.ArgumentParser()
    add_status_arguments(p)
    base = ["--workdir", str(tmp_path / "w"), "--data-root", str(tmp_path), "--json"]
    assert status_main(p.parse_args(base)) == 0
    assert json.loads(capsys.readouterr().out)["host_check"]["problems"] == []
    assert status_main(p.parse_args([*base, "--sglang"])) == 0  # reported, not fatal
    problems = json.loads(capsys.readouterr().out)["host_check"]["problems"]
    assert any("no NVIDIA driver" in x for x in problems)
