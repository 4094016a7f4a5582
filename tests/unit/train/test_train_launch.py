"""`python -m eyas.train.run --processes 2`: torchrun's agent in process over 2 gloo workers on
CPU, on the tiny target's shards. One stream (rank 0's records, one summary), the failed rank
named, and no rank outliving its launch however the launch ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid

import psutil
import pytest
import yaml
from support.train_fixtures import merged_run, processes_with, split_launcher, wait_until

from eyas.errors import ConfigError
from eyas.train import run as core
from eyas.train.launch import check_processes, resolve_processes, run_child, torchrun_args
from eyas.train.tiny_data import extract_shards


def test_process_count_follows_the_setting_then_the_gpus():
    assert resolve_processes(None, 8) == 8
    assert resolve_processes(None, 0) == 1
    assert resolve_processes(2, 0) == 2 and resolve_processes(1, 8) == 1
    check_processes(4, cuda=False, visible_gpus=0)  # gloo processes on CPU: any number
    with pytest.raises(ConfigError, match="8 training processes need 8 GPUs, but 4"):
        check_processes(8, cuda=True, visible_gpus=4)


def test_the_command_line_runs_torchrun_inside_the_entry_point():
    cmd = core.argv("/venv/bin/python", data="offline", train="/w/hidden/train",
                    eval_="/w/hidden/eval", model="/m", out="/w/drafter",
                    config_file="/w/.eyas/train.yaml", processes=8, die_with_parent=True)
    assert cmd[:3] == ["/venv/bin/python", "-m", "eyas.train.run"]
    assert cmd[cmd.index("--processes") + 1] == "8" and "--die-with-parent" in cmd
    assert core.command("/venv/bin/python", data="offline", train="/a b", eval_="/e", model="/m",
                        out="/o", config_file="/c").endswith("--shards '/a b' --eval-shards /e")
    assert torchrun_args(8, "eyas.train.run", ["--out", "/o"]) == [
        "--standalone", "--nnodes", "1", "--nproc-per-node", "8", "--max-restarts", "0",
        "--module", "eyas.train.run", "--out", "/o"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory, tiny_target):
    root = tmp_path_factory.mktemp("launch")
    workdir = merged_run(root, tiny_target)
    for split in ("train", "eval"):
        extract_shards(tiny_target, workdir / "merged" / f"{split}.jsonl",
                       workdir / "hidden" / split, storage="final", shard_size=4)
    return workdir


def _argv(shards, tiny_target, out, *, steps: int, extra: tuple[str, ...] = ()) -> list[str]:
    config = out.parent / f"{out.name}.yaml"
    config.write_text(yaml.safe_dump({
        "steps": steps, "eval_every": 2, "checkpoint_every": 2, "log_every": 1, "ttt_steps": 2,
        "micro_batch": 2, "lr": 1e-3, "warmup_steps": 1, "draft_vocab_size": 4100,
        "device": "cpu", "max_len": 64}))
    return [*core.argv(sys.executable, data="offline", train=str(shards / "hidden" / "train"),
                       eval_=str(shards / "hidden" / "eval"), model=str(tiny_target),
                       out=str(out), config_file=str(config), processes=2), *extra]


@pytest.mark.slow
def test_two_processes_print_one_stream_rank_0s_records_and_one_summary(shards, tiny_target,
                                                                        tmp_path):
    lines: list[str] = []
    code = run_child(_argv(shards, tiny_target, tmp_path / "out", steps=2),
                     on_line=lines.append, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert code == 0, "\n".join(lines[-30:])
    records = [core.parse_record(x) for x in lines if core.parse_record(x)]
    assert [(r["kind"], r["step"]) for r in records] == [("train", 1), ("train", 2), ("eval", 2)]
    summaries = [x for x in lines if x.startswith('{"steps"')]
    assert len(summaries) == 1 and '"export"' in summaries[0]
    assert not any(x.startswith("error") for x in lines)


def _launch(argv, marker, **kw) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "EYAS_TEST_MARK": marker}
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **kw)


def _running_ranks(marker: str) -> tuple[psutil.Process, list[psutil.Process]]:
    """Wait until the launch marked `marker` runs its 2 workers; return (agent, workers)."""
    found: dict = {}

    def ready() -> bool:
        launcher, workers = split_launcher(processes_with("EYAS_TEST_MARK", marker))
        found.update(launcher=launcher, workers=workers)
        return launcher is not None and len(workers) == 2

    wait_until(ready, 120, "the launcher and its 2 workers")
    return found["launcher"], found["workers"]


def _first_step(proc: subprocess.Popen, seen: list[str]) -> None:
    for line in proc.stdout:
        seen.append(line)
        if line.startswith('{"kind": "train"'):
            return
    raise AssertionError("no training step:\n" + "".join(seen[-30:]))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["launcher-killed", "rank-1-killed", "rank-1-killed-agent-late",
                                 "parent-killed"])
def test_no_rank_outlives_its_launch(shards, tiny_target, tmp_path, how):
    """However the launch ends -- its agent killed outright (OOM killer, a job's KILL), one
    worker killed, or the process that started a ``--die-with-parent`` launch gone -- every
    rank is gone within seconds; a failed rank is named with its exit code."""
    marker = uuid.uuid4().hex
    argv = _argv(shards, tiny_target, tmp_path / "out", steps=10_000,
                 extra=("--die-with-parent",) if how == "parent-killed" else ())
    if how == "parent-killed":  # the launcher's parent: a shell that waits for it
        argv = ["sh", "-c", " ".join(f"'{a}'" for a in argv) + " & wait"]
    proc = _launch(argv, marker, start_new_session=True)
    seen: list[str] = []
    try:
        _first_step(proc, seen)
        launcher, workers = _running_ranks(marker)
        if how == "launcher-killed":
            launcher.kill()
        elif how == "rank-1-killed":
            next(w for w in workers if w.environ().get("RANK") == "1").kill()
        elif how == "rank-1-killed-agent-late":
            # The agent looks after rank 0 has met the lost peer in a collective (a loaded
            # host): rank 0's "Connection closed by peer" is not the cause.
            launcher.suspend()
            next(w for w in workers if w.environ().get("RANK") == "1").kill()
            wait_until(lambda: [w for w in workers if w.is_running()
                                and w.status() != psutil.STATUS_ZOMBIE] == [], 60,
                       "rank 0 failing on its lost peer")
            launcher.resume()
        else:
            os.kill(proc.pid, signal.SIGKILL)
        wait_until(lambda: not processes_with("EYAS_TEST_MARK", marker), 60,
                   "every training process ending")
    finally:
        for p in processes_with("EYAS_TEST_MARK", marker):
            p.kill()
        rest = proc.stdout.read()
        proc.wait(timeout=30)
    if how.startswith("rank-1-killed"):
        assert proc.returncode == 128 + signal.SIGKILL, rest
        assert "error: training rank 1 of 2 failed (exit code -9): Signal 9 (SIGKILL)" in rest


@pytest.mark.slow
def test_an_interrupted_run_child_stops_every_rank(shards, tiny_target, tmp_path):
    """What a cancelled local flow does: the caller of `run_child` is interrupted."""
    marker = uuid.uuid4().hex
    argv = _argv(shards, tiny_target, tmp_path / "out", steps=10_000,
                 extra=("--die-with-parent",))
    started = threading.Event()

    def on_line(line: str) -> None:
        if line.startswith('{"kind": "train"'):
            started.set()
            raise KeyboardInterrupt  # as Ctrl-C in the flow's process would

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "EYAS_TEST_MARK": marker}
    with pytest.raises(KeyboardInterrupt):
        run_child(argv, env=env, on_line=on_line)
    assert started.is_set()
    wait_until(lambda: not processes_with("EYAS_TEST_MARK", marker), 30,
               "every training process ending")


def test_a_lost_peer_is_told_from_a_ranks_own_error():
    from eyas.train.launch import peer_lost
    gloo = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553]"
            " Connection closed by peer [127.0.0.1]:12719. This is typically caused by a remote"
            " worker crashing.")
    assert peer_lost({"message": gloo, "extraInfo": {}}) and peer_lost(gloo)
    assert not peer_lost("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert not peer_lost("Signal 9 (SIGKILL) received by PID 23782") and not peer_lost(None)
