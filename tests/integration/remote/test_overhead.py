"""Round-trip overhead of a remote command and of a job poll (printed, never asserted on time).

Run with ``pytest tests/integration/remote/test_overhead.py -s -m ssh`` to see the figures.
"""

from __future__ import annotations

import statistics
import time

import pytest

from eyas.remote.hosts import SSHHost
from eyas.remote.jobs import read_log, start_job


@pytest.mark.ssh
@pytest.mark.slow
def test_round_trip_overhead(sshd):
    with SSHHost(sshd.spec()) as host:
        host.run("true")  # connection opened outside the measurement
        runs, polls = [], []
        for _ in range(20):
            t = time.perf_counter()
            host.run("true")
            runs.append(time.perf_counter() - t)
        start_job(host, "sleep 30", job_id="overhead")
        for _ in range(20):
            t = time.perf_counter()
            st, _, _ = read_log(host, "overhead")
            polls.append(time.perf_counter() - t)
        assert st.state == "running"
        from eyas.remote.jobs import cancel

        cancel(host, "overhead", grace=1)
    print(f"\nremote `true`: median {statistics.median(runs) * 1000:.0f} ms; "
          f"job poll: median {statistics.median(polls) * 1000:.0f} ms (n=20 each)")
