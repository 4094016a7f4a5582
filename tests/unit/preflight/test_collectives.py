"""Check 3 with gloo processes: the collectives pass; a hang (simulated) is stopped at the
limit, retried with NCCL_P2P_DISABLE=1, and the check says which works -- never a hang."""

import time

import pytest

from eyas.preflight.collective_worker import SIMULATE_HANG
from eyas.preflight.collectives import check_collectives
from eyas.preflight.result import bounded

LIMIT_S = 90  # torchrun and two workers importing torch on a loaded 2-core machine


@pytest.mark.timeout(400)
def test_a_p2p_hang_is_retried_without_p2p_and_the_fix_named(monkeypatch):
    monkeypatch.setenv(SIMULATE_HANG, "p2p")
    t0 = time.monotonic()
    r = bounded("collectives", lambda: check_collectives(gpus=0, gpu_env={},
                                                         timeout_s=LIMIT_S), 3 * LIMIT_S)
    assert time.monotonic() - t0 < 2 * LIMIT_S + 30
    assert not r.ok and "hung with peer-to-peer on" in r.detail
    assert "work with NCCL_P2P_DISABLE=1" in r.detail
    assert "gpu_env: {NCCL_P2P_DISABLE: '1'}" in r.fix
    # Given once in the recipe's gpu_env, the setting reaches the processes: it passes.
    r = check_collectives(gpus=0, gpu_env={"NCCL_P2P_DISABLE": "1"}, timeout_s=LIMIT_S)
    assert r.ok and "values right" in r.detail and "NCCL not checked" in r.partial


@pytest.mark.timeout(300)
def test_a_hang_that_no_setting_fixes_fails_within_its_limit(monkeypatch):
    monkeypatch.setenv(SIMULATE_HANG, "always")
    t0 = time.monotonic()
    r = bounded("collectives", lambda: check_collectives(
        gpus=0, gpu_env={"NCCL_P2P_DISABLE": "1"}, timeout_s=20), 100)
    assert time.monotonic() - t0 < 60
    assert not r.ok and "hung" in r.detail and "even with NCCL_P2P_DISABLE=1" in r.detail
    assert "nvidia-smi topo -m" in r.fix
