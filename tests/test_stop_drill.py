"""The stop drill (marker `slow`): the pipeline's commands (``eyas prepare``, ``eyas extract``,
``eyas train``), each a process of its own as in a user's terminal, get one SIGTERM or Ctrl-C
(SIGINT) to their whole process group mid-work -- as ``timeout``, a container runtime and a
terminal send them -- and are run again until they finish. Each stopped command must exit
with 128 + the signal and its one line saying what it kept, at the next small unit (an
answer in flight, a forward batch: the shard under way abandoned, a training step), leave no
process running and no concurrency slot taken; the outputs of the reruns must equal an
uninterrupted run's, file by file (`fault_drill.differences`).

Every command starts its own temporary Prefect server (no ``PREFECT_API_URL``), as in a plain
terminal: stopping it is part of the stop. docs/stopping.md says what a user can expect.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
from fault_drill import (
    KillPoint,
    active_slots,
    answers,
    differences,
    drill_env,
    drill_recipe,
    logged_step,
    run_command,
    run_pipeline,
    shards_done,
    stop_command,
)

from eyas.cli import KEPT_ON_STOP

pytestmark = [pytest.mark.slow, pytest.mark.serve]

BATCH_TOKENS = 96
"""Extraction's forward batches: one record each (merge.max_seq_len is 96), so a shard of 8
records takes several and a stop lands inside one."""
STOP_BOUND_S = 60.0
"""How long a stopped command may take to exit: a liveness bound on a loaded 2-core machine,
not the figure (each stop prints its own; the unit it waits for is checked by what it did)."""

STOPS = [
    ("prepare", signal.SIGINT,
     KillPoint("prepare", "generation, after 2 answers", lambda w: answers(w) >= 2)),
    ("extract", signal.SIGTERM,
     KillPoint("extract", "extraction, 0.5 s after the first shard was complete",
               lambda w: shards_done(w) >= 1, 0.5)),
    ("train", signal.SIGTERM,
     KillPoint("train", "training, after the step-3 log line", lambda w: logged_step(w) >= 3)),
]
_ABANDONED = re.compile(r"(train|eval): (shard-\d{5}) abandoned after (\d+) of (\d+) samples")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_target) -> Path:
    """The uninterrupted run: ``<root>/run``."""
    root = tmp_path_factory.mktemp("stop-reference")
    config = drill_recipe(root, batch_tokens=BATCH_TOKENS)
    run_pipeline(config, root / "run", drill_env(root / "prefect-home"))
    return root / "run"


def test_one_signal_mid_work_stops_each_command_at_its_next_unit_and_the_reruns_equal_an_uninterrupted_run(  # noqa: E501
        reference, tmp_path):
    config = drill_recipe(tmp_path, batch_tokens=BATCH_TOKENS)
    workdir = tmp_path / "run"
    home = tmp_path / "prefect-home"
    env = drill_env(home)
    figures = []
    for phase, sig, point in STOPS:
        stopped = stop_command(phase, [phase], config, workdir, env, point, sig)
        figures.append(f"{phase}: {sig.name} at {point.what} ({stopped.on_disk}) -> exit "
                       f"{stopped.returncode} in {stopped.stop_s:.1f} s")
        tail = stopped.text[-3000:]
        assert stopped.returncode == 128 + sig, tail
        last = [line for line in stopped.text.splitlines() if line.startswith(f"eyas {phase}: ")]
        assert last == [f"eyas {phase}: stopped by {sig.name}; stopped cleanly "
                        f"({KEPT_ON_STOP[phase]}): run the same command again to resume"], tail
        assert stopped.left == [], stopped.left  # servers, training, the temporary Prefect
        assert stopped.stop_s < STOP_BOUND_S, figures[-1]
        assert set(active_slots(home).values()) <= {0}, active_slots(home)  # given back
        if phase == "extract":
            # The stop came at a forward batch inside a shard, which was abandoned.
            cut = _ABANDONED.findall(stopped.text)
            assert len(cut) == 1 and int(cut[0][2]) < int(cut[0][3]), tail
            split, shard = cut[0][:2]
            assert not (workdir / "hidden" / split / shard / "manifest.json").exists()
        if phase == "train":
            assert "training stopped at step" in stopped.text, tail
        done = run_command(phase, [phase], config, workdir, env)
        assert done.returncode == 0, (workdir / ".drill-log").read_text()[-3000:]
    print("\n".join(figures))
    assert differences(reference, workdir) == []
    assert set(active_slots(home).values()) == {0}
