"""Where shards are extracted when several hosts, or several engines on one host, share a split.

Placement is a function of the shard index and of the hosts' order and weights only, so a
rerun, a retry or another process computes the same answer: shard ``i`` goes to the host at
position ``i mod W`` of a smooth weighted round-robin cycle of length ``W`` (the sum of the
weights). A host's weight is what it runs at once: its GPUs for one-shard-per-GPU extraction,
its engines for SGLang. Hosts 8 and 4 GPUs: the cycle ``A A B A A B A A B A A B`` -- each
host's shards spread over the whole split, not one block at its end.

The placement is also recorded (`placement_record`, kept beside the split's shards on the host
where the run lives, ``hidden/<split>/placement.json``). A recorded shard stays on its host
while that host is still in the list: a retry goes where its merged input was staged and
where a finished-but-not-yet-delivered shard may already wait; only shards of a host that left
the list move.

Inside a host, an SGLang engine spans ``tp_size`` GPUs (`engine_groups`), and the host's shards
go round-robin to its engines (`split_among`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from eyas.errors import ConfigError


def weighted_cycle(weights: Sequence[int]) -> list[int]:
    """One cycle of smooth weighted round robin: host positions, each ``weights[i]`` times,
    interleaved as evenly as the weights allow (ties go to the earlier host)."""
    if not weights or any(w < 1 for w in weights):
        raise ConfigError(f"every host needs a weight >= 1, got {list(weights)}", where="hosts")
    total, current, cycle = sum(weights), [0] * len(weights), []
    for _ in range(total):
        for i, w in enumerate(weights):
            current[i] += w
        best = max(range(len(weights)), key=lambda i: (current[i], -i))
        current[best] -= total
        cycle.append(best)
    return cycle


def place(indices: Iterable[int], hosts: Sequence[tuple[str, int]],
          recorded: Mapping[int, str] | None = None) -> dict[int, str]:
    """``{shard index: host name}`` for `indices` over `hosts` (``(name, weight)``, in order).

    A shard in `recorded` whose host is still among `hosts` keeps that host; every other shard
    goes to ``hosts[cycle[index % len(cycle)]]`` (`weighted_cycle`).
    """
    names = [name for name, _ in hosts]
    if len(set(names)) != len(names):
        raise ConfigError(f"a host is listed twice: {names}", where="hosts")
    cycle = weighted_cycle([w for _, w in hosts])
    recorded = recorded or {}
    return {i: recorded[i] if recorded.get(i) in names else names[cycle[i % len(cycle)]]
            for i in sorted(indices)}


def placement_record(placement: Mapping[int, str], hosts: Sequence[tuple[str, int]],
                     previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON record of a split's placement: ``hosts`` (name, weight) and ``shards``
    ({"00003": host}); shards of `previous` (an earlier record) not placed now are kept."""
    shards = dict((previous or {}).get("shards", {}))
    shards.update({f"{i:05d}": host for i, host in placement.items()})
    return {"hosts": [{"name": n, "weight": w} for n, w in hosts],
            "shards": dict(sorted(shards.items()))}


def recorded_placement(record: Mapping[str, Any] | None) -> dict[int, str]:
    """``{shard index: host}`` of a `placement_record` (empty for None)."""
    return {int(k): v for k, v in (record or {}).get("shards", {}).items()}


def engine_groups(num_gpus: int, tp_size: int, *, where: str = "host") -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` of each engine a host runs: ``num_gpus // tp_size`` groups of
    `tp_size` consecutive GPUs (GPUs left over stay idle); ``[""]`` (one engine, no GPU
    named) for a host without GPUs. Raises ConfigError when the host has fewer GPUs than one
    engine needs."""
    if num_gpus == 0:
        return [""]
    if num_gpus < tp_size:
        raise ConfigError(f"{where} has {num_gpus} GPU(s); one engine with tp_size {tp_size} "
                          f"needs {tp_size}", where="extract.tp_size")
    return [",".join(str(g) for g in range(e * tp_size, (e + 1) * tp_size))
            for e in range(num_gpus // tp_size)]


def split_among(indices: Iterable[int], n: int) -> list[list[int]]:
    """`indices` (sorted) dealt round-robin into `n` lists: the shards of each of a host's
    `n` engines."""
    groups: list[list[int]] = [[] for _ in range(n)]
    for k, i in enumerate(sorted(indices)):
        groups[k % n].append(i)
    return groups
