"""Check 3, collectives: an all-reduce and an all-gather over every GPU under torchrun, within
a time limit (`eyas.preflight.collective_worker`). A run that hangs is stopped at the limit and
retried once with ``NCCL_P2P_DISABLE=1`` (peer-to-peer all-reduce hangs are reported on RTX
PRO 6000 Blackwell hosts): the check says which works and, when only the retry does, fails
naming the setting that makes every GPU job eyas starts use it (``gpu_env`` of the recipe).
On a machine without GPUs the ranks are gloo processes: NCCL itself is not checked, and the
check says so.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping

from eyas.preflight.proc import Finished, run_bounded
from eyas.preflight.result import CheckFailed, CheckResult
from eyas.train.launch import torchrun_args

NAME = "collectives"
P2P_OFF = {"NCCL_P2P_DISABLE": "1"}


def _run(processes: int, env: Mapping[str, str], *, mib: float, timeout_s: float) -> Finished:
    argv = [sys.executable, "-m", "torch.distributed.run",
            *torchrun_args(processes, "eyas.preflight.collective_worker",
                           ["--mib", str(mib), "--timeout-s", str(timeout_s)])]
    return run_bounded(argv, timeout_s=timeout_s, env=env)


def bus(bps: float) -> str:
    """A bus bandwidth as text: GB/s, or MB/s below 1 GB/s (gloo on a CPU)."""
    return f"{bps / 1e9:,.2f} GB/s bus" if bps >= 1e9 else f"{bps / 1e6:,.1f} MB/s bus"


def _figures(done: Finished) -> dict | None:
    for line in reversed(done.lines):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def check_collectives(*, gpus: int, gpu_env: Mapping[str, str], timeout_s: float,
                      mib: float | None = None) -> CheckResult:
    """Check 3 over `gpus` GPUs (0: two gloo processes on the CPU), the processes getting the
    recipe's `gpu_env` on top of this environment."""
    cuda = gpus > 0
    processes = gpus if cuda else 2
    mib = mib if mib is not None else (64.0 if cuda else 0.01)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
           "OMP_NUM_THREADS": "1", **gpu_env}
    first = _run(processes, env, mib=mib, timeout_s=timeout_s)
    partial = "" if cuda else "no GPU here: gloo processes on the CPU; NCCL not checked"
    what = f"{processes} {'GPUs (NCCL)' if cuda else 'processes (gloo)'}"
    if first.code == 0 and (fig := _figures(first)):
        return CheckResult(NAME, True, f"all-reduce and all-gather over {what}: values right; "
                           f"all-reduce of {fig['bytes'] / 2**20:,.2f} MiB in "
                           f"{fig['all_reduce_s'] * 1e3:,.2f} ms",
                           figure=bus(fig["busbw_bps"]), partial=partial,
                           data=fig)
    if not first.timed_out:
        raise CheckFailed(f"the collectives over {what} failed (exit {first.code}):\n"
                          f"{first.tail()}", fix="see the error above (NCCL_DEBUG=INFO in "
                          "gpu_env says more); rerun preflight once fixed")
    if env.get("NCCL_P2P_DISABLE") == "1":
        raise CheckFailed(f"the collectives over {what} hung (stopped after {timeout_s:g}s) "
                          "even with NCCL_P2P_DISABLE=1", fix="check the GPUs' topology "
                          "(nvidia-smi topo -m) and run with NCCL_DEBUG=INFO in gpu_env; "
                          "raise preflight.collective_timeout_s only if it is just slow")
    second = _run(processes, {**env, **P2P_OFF}, mib=mib, timeout_s=timeout_s)
    if second.code == 0 and (fig := _figures(second)):
        raise CheckFailed(
            f"the collectives over {what} hung with peer-to-peer on (stopped after "
            f"{timeout_s:g}s) and work with NCCL_P2P_DISABLE=1 "
            f"({bus(fig['busbw_bps'])})",
            fix="add `gpu_env: {NCCL_P2P_DISABLE: '1'}` to the recipe: every GPU job eyas "
                "starts (extraction, training, serving) then runs with it",
            figure=bus(fig["busbw_bps"]) + " with P2P off", data=fig)
    state = "hung too" if second.timed_out else f"failed too (exit {second.code})"
    raise CheckFailed(f"the collectives over {what} hung (stopped after {timeout_s:g}s); "
                      f"with NCCL_P2P_DISABLE=1 they {state}:\n{second.tail()}",
                      fix="check the GPUs' topology (nvidia-smi topo -m), the driver, and "
                          "NCCL_DEBUG=INFO output (gpu_env); no NCCL setting eyas knows fixes it")
