"""Check 1 on this machine: what it has, what the recipe needs of it, the SGLang venv."""

import sys

from support.serving_fixtures import STANDIN

from eyas.preflight.environment import check_environment, cuda_version, gpu_usage
from eyas.preflight.result import bounded

SMI = """| NVIDIA-SMI 580.82.07    Driver Version: 580.82.07    CUDA Version: 13.0     |
0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887, 512
1, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887, 40000
"""


def test_nvidia_smi_memory_in_use_and_cuda_version_are_read():
    gpus = gpu_usage(SMI)
    assert [g["used_mib"] for g in gpus] == [512, 40000] and gpus[0]["total_mib"] == 97887
    assert cuda_version(SMI) == "13.0"


def test_a_cpu_recipe_passes_here_saying_what_it_could_not_check():
    r = check_environment(needs_gpu=False, gpus_wanted=0, sglang_python=None)
    assert r.ok and "Python" in r.detail and "glibc" in r.detail
    assert "no NVIDIA GPU here" in r.partial


def test_a_gpu_recipe_without_a_gpu_fails_naming_the_fix():
    r = bounded("environment", lambda: check_environment(needs_gpu=True, gpus_wanted=8,
                                                         sglang_python=None), 60)
    assert not r.ok and ("no NVIDIA driver" in r.detail or "no NVIDIA GPU" in r.detail)
    assert r.fix


def test_the_sglang_venv_versions_are_read_and_mismatches_named(monkeypatch):
    import importlib.metadata as md

    monkeypatch.setenv("PYTHONPATH", str(STANDIN))  # this interpreter + the SGLang stand-in
    r = bounded("environment", lambda: check_environment(
        needs_gpu=False, gpus_wanted=0, sglang_python=sys.executable), 120)
    assert r.data["sglang"]["sglang"] == "0.5.23"
    assert r.data["sglang"]["torch"] == md.version("torch")
    assert r.ok == (md.version("torch").split("+")[0] == "2.14.1")
    if not r.ok:
        assert "eyas is checked against torch 2.14.1" in r.detail
    r = bounded("environment", lambda: check_environment(
        needs_gpu=False, gpus_wanted=0, sglang_python="/nonexistent/bin/python"), 60)
    assert not r.ok and "/nonexistent/bin/python cannot import sglang" in r.detail
