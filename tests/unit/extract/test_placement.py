"""Placement of shards over hosts and engines: deterministic, weighted, recorded."""

from __future__ import annotations

import pytest

from eyas.errors import ConfigError
from eyas.extract.placement import (
    engine_groups,
    place,
    placement_record,
    recorded_placement,
    split_among,
    weighted_cycle,
)


def test_weighted_cycle_interleaves_by_weight():
    assert weighted_cycle([1]) == [0]
    assert weighted_cycle([1, 1]) == [0, 1]
    assert weighted_cycle([8, 4]) == [0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0]
    for weights in ([3, 1, 2], [8, 8, 4], [1, 7]):
        cycle = weighted_cycle(weights)
        assert [cycle.count(i) for i in range(len(weights))] == weights
    with pytest.raises(ConfigError, match="weight"):
        weighted_cycle([2, 0])


def test_place_is_a_function_of_index_and_hosts():
    hosts = [("a", 8), ("b", 4)]
    first = place(range(24), hosts)
    assert first == place(reversed(range(24)), hosts)  # order of the indices does not matter
    assert [first[i] for i in range(24)].count("a") == 16
    # Only some shards still to do: each keeps the host it had in the full placement.
    assert place([5, 17], hosts) == {5: first[5], 17: first[17]}
    with pytest.raises(ConfigError, match="twice"):
        place([0], [("a", 1), ("a", 2)])


def test_recorded_placement_wins_while_its_host_is_listed():
    hosts = [("a", 1), ("b", 1)]
    placed = place(range(4), hosts)
    assert placed == {0: "a", 1: "b", 2: "a", 3: "b"}
    record = placement_record(placed, hosts)
    assert record["shards"] == {"00000": "a", "00001": "b", "00002": "a", "00003": "b"}
    assert recorded_placement(record) == placed
    # Host b leaves, c joins: b's shards move, a's stay where their input was staged.
    moved = place(range(4), [("a", 1), ("c", 1)], recorded_placement(record))
    assert moved == {0: "a", 1: "c", 2: "a", 3: "c"}
    # Reversed list: the recorded shards stay put.
    assert place(range(4), [("b", 1), ("a", 1)], recorded_placement(record)) == placed
    # A new record keeps the shards of the old one that were not placed again.
    merged = placement_record({3: "a"}, hosts, record)
    assert merged["shards"]["00001"] == "b" and merged["shards"]["00003"] == "a"
    assert recorded_placement(None) == {}


def test_engine_groups_and_sharing_a_hosts_shards():
    assert engine_groups(8, 8) == ["0,1,2,3,4,5,6,7"]  # Kimi-K2.5: one engine over 8 GPUs
    assert engine_groups(8, 2) == ["0,1", "2,3", "4,5", "6,7"]
    assert engine_groups(6, 4) == ["0,1,2,3"]  # two GPUs left idle
    assert engine_groups(0, 8) == [""]  # a host without GPUs runs one engine on its CPU
    with pytest.raises(ConfigError, match="tp_size 8"):
        engine_groups(4, 8, where="train@gpu:22")
    assert split_among([9, 1, 5, 3], 2) == [[1, 5], [3, 9]]
    assert split_among([4], 3) == [[4], [], []]
