"""The stop drill (marker `slow`): the pipeline's commands (``eyas prepare``, ``eyas extract``,
``eyas train``), each a process of its own as in a user's terminal, get one SIGTERM or Ctrl-C
(SIGINT) to their whole process group mid-work -- as ``timeout``, a container runtime and a
terminal send them -- and are run again until they finish. Each stopped command must exit
with 128 + the signal and its one line saying what it kept, at the next small unit (an
answer in flight, a forward batch: the shard under way abandoned, a training step), leave no
process running and no concurrency slot taken; the outputs of the reruns must equal an
uninterrupted run's, file by file (`fault_drill.differences`). The second test does the same
for ``eyas evaluate``, ``eyas preflight`` (Ctrl-C) and ``eyas pipeline`` on a copy of that
uninterrupted run (no new preparation or extraction: little CPU).

Every command starts its own temporary Prefect server (no ``PREFECT_API_URL``), as in a plain
terminal: stopping it is part of the stop. docs/stopping.md says what a user can expect.
"""

from __future__ import annotations

import re
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from support.fault_drill import (
    KillPoint,
    active_slots,
    answers,
    differences,
    drill_env,
    drill_recipe,
    logged_step,
    run_command,
    shards_done,
    shared_reference,
    stop_command,
)

from eyas.cli import KEPT_ON_STOP

pytestmark = [pytest.mark.slow, pytest.mark.serve]

STOP_BOUND_S = 30.0
"""How long a stopped command may take to exit: the issue's 10 s, plus 20 s because this 2-core
machine is shared (preflight measured 15.5 s with the full suite and the demo running beside it) (measured after `eyas.stopping.exit_now`: 1.5-5.7 s at load 2-3; before it,
13-14 s at load 8-14, docs/stopping.md). Each stop prints its own figure; the unit it waits for
is checked by what it did."""

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


def _assert_stopped_cleanly(stopped, sig, point, home: Path, figures: list[str]) -> str:
    """What every stop must show: exit 128 + the signal, the one line saying what was kept,
    no process left (servers, training ranks, the temporary Prefect server), an exit within
    `STOP_BOUND_S`, every slot given back. Appends the stop's figure; returns the output's
    tail for the caller's own assertions."""
    phase = stopped.phase
    figures.append(f"{phase}: {sig.name} at {point.what} ({stopped.on_disk}) -> exit "
                   f"{stopped.returncode} in {stopped.stop_s:.1f} s")
    tail = stopped.text[-3000:]
    assert stopped.returncode == 128 + sig, tail
    last = [line for line in stopped.text.splitlines() if line.startswith(f"eyas {phase}: ")]
    assert last == [f"eyas {phase}: stopped by {sig.name}; stopped cleanly "
                    f"({KEPT_ON_STOP[phase]}): run the same command again to resume"], tail
    assert stopped.left == [], stopped.left
    assert stopped.stop_s < STOP_BOUND_S, figures[-1]
    assert set(active_slots(home).values()) <= {0}, active_slots(home)  # given back
    return tail


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_target) -> Path:
    """The uninterrupted run (`shared_reference`: the fault drill's too): ``<root>/run``."""
    return shared_reference(tmp_path_factory)


def test_one_signal_mid_work_stops_each_command_at_its_next_unit_and_the_reruns_equal_an_uninterrupted_run(  # noqa: E501
        reference, tmp_path):
    config = drill_recipe(tmp_path)
    workdir = tmp_path / "run"
    home = tmp_path / "prefect-home"
    env = drill_env(home)
    figures = []
    for phase, sig, point in STOPS:
        stopped = stop_command(phase, [phase], config, workdir, env, point, sig)
        tail = _assert_stopped_cleanly(stopped, sig, point, home, figures)
        if phase == "extract":
            # The stop came at a forward batch inside a shard, which was abandoned; two shard
            # tasks may be under way at once (the task runner's threads): each one abandoned.
            # Under load the signal can land between shards (a slot handed over, a 2-sample
            # shard done in 0.2 s): then nothing is under way and nothing is abandoned.
            cut = _ABANDONED.findall(stopped.text)
            assert all(int(done) < int(total) for *_, done, total in cut), tail
            for split, shard, *_ in cut:
                assert not (workdir / "hidden" / split / shard / "manifest.json").exists()
        if phase == "train":
            assert "training stopped at step" in stopped.text, tail
        done = run_command(phase, [phase], config, workdir, env)
        assert done.returncode == 0, (workdir / ".drill-log").read_text()[-3000:]
    print("\n".join(figures))
    assert differences(reference, workdir) == []
    assert set(active_slots(home).values()) == {0}


def _log_has(pattern: str) -> Callable[[Path], bool]:
    """A stop point: `pattern` appears in the command output so far (``<workdir>/.drill-log``)."""
    rx = re.compile(pattern)

    def ready(workdir: Path) -> bool:
        try:
            return bool(rx.search((workdir / ".drill-log").read_text(errors="replace")))
        except OSError:
            return False
    return ready


def _evaluate_recipe(config: Path) -> Path:
    """The drill's recipe with a small offline evaluation (2 prompts, 12 new tokens)."""
    raw = yaml.safe_load(config.read_text())
    raw["evaluate"] = {"prompt_files": ["eyas:demo/eval_prompts.jsonl"], "prompts_per_dataset": 2,
                       "max_new_tokens": 12, "threads": 1, "device": "cpu"}
    path = config.with_name("drill-evaluate.yaml")
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


LATER_STOPS = [
    ("evaluate", signal.SIGTERM,
     KillPoint("evaluate", "evaluation, 1 s after it began generating",
               _log_has(r"evaluating \S+ on \d+ held-out prompts"), 1.0)),
    ("preflight", signal.SIGINT,
     KillPoint("preflight", "preflight, once its first check reported",
               _log_has(r"preflight \S+: (NO-)?GO \("))),
    ("pipeline", signal.SIGTERM,
     KillPoint("pipeline", "the pipeline's training, after the step-2 log line",
               lambda w: logged_step(w) >= 2)),
]


def test_one_signal_stops_evaluate_preflight_and_the_pipeline_and_the_reruns_complete(
        reference, tmp_path):
    """The drill's finished run, copied, is evaluated, checked and trained again by the whole
    pipeline (its drafter removed), each stopped once mid-work and run again to its end."""
    config = drill_recipe(tmp_path)
    with_eval = _evaluate_recipe(config)
    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir, symlinks=True)
    (workdir / ".drill-log").unlink()  # its step lines are the reference's
    shutil.rmtree(workdir / "drafter" / "checkpoint")
    home = tmp_path / "prefect-home"
    env = drill_env(home)
    figures = []
    for phase, sig, point in LATER_STOPS:
        args = [phase] + (["--no-preflight"] if phase == "pipeline" else [])
        cfg = with_eval if phase == "evaluate" else config
        if phase == "pipeline":
            shutil.rmtree(workdir / "drafter")  # the pipeline trains again
        stopped = stop_command(phase, args, cfg, workdir, env, point, sig)
        tail = _assert_stopped_cleanly(stopped, sig, point, home, figures)
        if phase == "evaluate":  # its files are written at its end: none of them yet
            assert not (workdir / "evaluate" / "evaluated_from.json").exists(), tail
        if phase == "pipeline":
            assert "training stopped at step" in stopped.text, tail
        done = run_command(phase, args, cfg, workdir, env)
        assert done.returncode == 0, (workdir / ".drill-log").read_text()[-3000:]
        if phase == "evaluate":
            assert (workdir / "evaluate" / "evaluated_from.json").exists()
    print("\n".join(figures))
    # The pipeline's rerun resumed its training from the stop's checkpoint: the drafter and
    # its export equal the uninterrupted run's, as every other output does. What only the
    # commands the uninterrupted run did not run write (the evaluation, its job's folder and
    # settings, its model card in the export, preflight's folder and job) is the one thing it
    # lacks: preflight's disk probe (hidden/.eyas-preflight-disk-<pid>) is not among them.
    extra = ("evaluate/", ".eyas/evaluate.yaml", ".eyas/jobs/evaluate-", "preflight/",
             ".eyas/jobs/preflight-",
             "drafter/export/README.md")
    assert [d for d in differences(reference, workdir) if not (
        d.startswith(extra) and d.endswith(": not written by the uninterrupted run"))] == []
    assert set(active_slots(home).values()) == {0}
