"""One rank of the collectives check (run by torchrun): an all-reduce and an all-gather over
every rank, checked for the right values and timed; rank 0 prints one JSON line.

    python -m torch.distributed.run --standalone --nproc-per-node N \\
        -m eyas.preflight.collective_worker --mib 64 --iters 5

NCCL on GPUs (rank r on GPU r), gloo on CPU. ``EYAS_PREFLIGHT_SIMULATE_HANG`` (tests only):
``p2p`` makes every rank hang in its first collective unless ``NCCL_P2P_DISABLE=1`` (what a
host with broken peer-to-peer does), ``always`` makes it hang whatever the settings.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

SIMULATE_HANG = "EYAS_PREFLIGHT_SIMULATE_HANG"


def _simulated_hang() -> bool:
    mode = os.environ.get(SIMULATE_HANG, "")
    return mode == "always" or (mode == "p2p" and os.environ.get("NCCL_P2P_DISABLE") != "1")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eyas.preflight.collective_worker")
    p.add_argument("--mib", type=float, default=64.0, help="all-reduce size per rank, MiB")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--timeout-s", type=float, default=60.0)
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist

    from eyas.proc import die_with_parent

    die_with_parent()  # torchrun runs workers in sessions of their own: none outlives the agent
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if cuda else "gloo",
                            timeout=datetime.timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if _simulated_hang():
        time.sleep(10**6)
    n = max(1, int(args.mib * (1 << 20) / 4))
    x = torch.full((n,), float(rank + 1), device=device)
    expected = world * (world + 1) / 2
    dist.all_reduce(x)  # warm-up, and the first check
    if not torch.all(x == expected):
        print(f"error: rank {rank}: all-reduce gave {x[:4].tolist()}, expected {expected}",
              file=sys.stderr, flush=True)
        return 1
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        dist.all_reduce(x)
    if cuda:
        torch.cuda.synchronize()
    ar_s = (time.perf_counter() - t0) / args.iters
    mine = torch.full((1024,), float(rank), device=device)
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine)
    bad = [r for r, t in enumerate(parts) if not torch.all(t == r)]
    if bad:
        print(f"error: rank {rank}: all-gather returned wrong data from ranks {bad}",
              file=sys.stderr, flush=True)
        return 1
    # Bus bandwidth as nccl-tests counts it for all-reduce: 2 (w-1)/w x bytes / time.
    busbw = 2 * (world - 1) / world * n * 4 / max(ar_s, 1e-9)
    dist.barrier()
    if rank == 0:
        print(json.dumps({"backend": "nccl" if cuda else "gloo", "world": world,
                          "bytes": n * 4, "all_reduce_s": ar_s, "busbw_bps": busbw,
                          "gpu": torch.cuda.get_device_name(0) if cuda else None}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
