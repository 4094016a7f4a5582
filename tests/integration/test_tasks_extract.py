"""tasks.extract: which host's GPUs a shard holds, the device pool (where its data is:
`eyas.layout.RunLayout`, tests/unit/test_layout.py)."""

from __future__ import annotations

import threading

from eyas.devices import DevicePool
from eyas.remote.hosts import HostSpec
from tasks.extract import gpu_count, gpu_spec
from tasks.limits import gpu_pool_name


def test_gpus_of_a_host():
    gpu = HostSpec(host="192.0.2.10", port=2222, num_gpus=8)
    assert gpu_count(gpu) == 8 and gpu_count(HostSpec(host="h")) == 1  # at least one slot
    assert gpu_pool_name(gpu_spec(gpu)) == "eyas-gpu-192.0.2.10-2222"
    assert gpu_pool_name(gpu_spec(None)) == "eyas-gpu-local"


def test_device_pool_hands_each_device_to_one_shard_at_a_time():
    pool = DevicePool(["0", "1"])
    held: list[str] = []
    with pool.take() as a, pool.take() as b:
        held += [a, b]
        got: list[str] = []
        waiter = threading.Thread(target=lambda: got.append(pool._free.get(timeout=5)))
        waiter.start()
        assert got == []  # both devices held: a third shard waits
    waiter.join()
    assert sorted(held) == ["0", "1"] and len(got) == 1
