"""The fault drill: run the pipeline's commands as a user would, SIGKILL them at points drawn
from a seed, rerun, and compare what is left with an uninterrupted run, file by file.

- `drill_recipe` writes a tiny pipeline (sources, YAML) on the tiny target: one dataset
  answered again by the target (phase 1, through `transformers serve`), two kept as given;
  small shards and a few training steps, so that the whole drill runs in minutes on 2 cores.
- `PHASES` are the commands, in order (``eyas prepare``, ``eyas extract``, ``eyas train``);
  `WHOLE_PIPELINE` may replace them by one command that runs everything: a `KillPoint` names
  what it waits for by what appears on disk, not by which command runs.
- `run_command` runs one command in its own process (its own temporary Prefect server, as a
  user's terminal does) and SIGKILLs it when its kill point comes: the process gets no chance
  to clean up, exactly like the OOM killer. What the killed process left running (its
  temporary Prefect server, a `transformers serve`) is recorded, and ended by the drill.
- `outputs` lists every file a run leaves, with its SHA-256, for the comparison; `HALF_WRITTEN`
  names the temporary files a killed writer may leave (never read as complete; a rerun removes
  or ignores them).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from support.paths import REPO
from support.terminal import as_in_a_terminal

PHASES: list[tuple[str, list[str]]] = [
    ("prepare", ["prepare"]),
    ("extract", ["extract"]),
    ("train", ["train"]),
]
"""(name, eyas arguments before --config/--workdir), run in this order."""
WHOLE_PIPELINE: list[tuple[str, list[str]]] | None = None
"""Set to ``[("pipeline", [...])]`` to drill one command that runs every phase instead."""

CHAT, KEPT, REASONING = "drill_chat", "drill_kept", "drill_reasoning"
TRAIN_STEPS = 8
BATCH_TOKENS = 96
"""Extraction's forward batches: one record each (merge.max_seq_len is 96), so a shard of 8
records takes several and a kill or a stop lands inside one."""


def drill_recipe(root: Path, *, chat: int = 6, kept: int = 30, reasoning: int = 10) -> Path:
    """A tiny pipeline under `root`: sources cut from the demo data, and its YAML."""
    from eyas.prepare.phases import demo_data_dir

    demo = demo_data_dir()
    sources = root / "sources"
    sources.mkdir(parents=True, exist_ok=True)
    for name, src, n in ((CHAT, "demo_chat.jsonl", chat), (KEPT, "demo_sharegpt.jsonl", kept),
                         (REASONING, "demo_reasoning.jsonl", reasoning)):
        lines = (demo / src).read_text().splitlines()[:n]
        (sources / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    raw = {
        "name": "drill",
        "target": {"model": "eyas:tiny"},
        "generation": {"launch_server": True, "concurrency": 2, "max_tokens": 16,
                       "temperature": 0.0, "max_retries": 4, "timeout_s": 120},
        "tokenize": {"train_on_reasoning": True, "num_proc": 1},
        "merge": {"max_seq_len": 96, "eval_fraction": 0.2, "seed": 42, "exclude": []},
        "extract": {"shard_size": 8, "batch_tokens": BATCH_TOKENS, "device": "cpu",
                    "storage": "final", "dtype": "float32"},
        "train": {"steps": TRAIN_STEPS, "eval_every": 4, "checkpoint_every": 2, "log_every": 1,
                  "ttt_steps": 3, "micro_batch": 2, "lr": 1e-3, "warmup_steps": 1,
                  "draft_vocab_size": 4100, "device": "cpu"},
        "datasets": [
            {"name": CHAT, "source": f"sources/{CHAT}.jsonl", "format": "messages",
             "regenerate": True},
            {"name": KEPT, "source": f"sources/{KEPT}.jsonl", "format": "sharegpt",
             "regenerate": False},
            {"name": REASONING, "source": f"sources/{REASONING}.jsonl", "regenerate": False},
        ],
    }
    path = root / "drill.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


# -- where a run is, seen from outside -------------------------------------------------------
def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return 0


def answers(workdir: Path) -> int:
    """Answers phase 1 has written so far."""
    return _lines(workdir / "generated" / CHAT / "responses.jsonl")


def merging(workdir: Path) -> bool:
    """Every dataset is tokenized and the merge has not finished."""
    prepared = [workdir / "prepared" / d / "manifest.json" for d in (CHAT, KEPT, REASONING)]
    return all(p.exists() for p in prepared) and not (workdir / "merged" / "manifest.json").exists()


def shards_done(workdir: Path) -> int:
    """Extraction shards (both splits) whose manifest is in place."""
    return sum(1 for _ in (workdir / "hidden").glob("*/shard-*/manifest.json"))


def checkpoint_step(workdir: Path) -> int:
    """The step of the training checkpoint in place (0: none yet)."""
    try:
        return json.loads((workdir / "drafter" / "checkpoint" / "meta.json").read_text())["step"]
    except (OSError, ValueError, KeyError):
        return 0


@dataclass(frozen=True)
class KillPoint:
    """When to SIGKILL: once `ready(workdir)` holds, after `delay_s` more."""

    phase: str
    """The command this point falls in (a key of `PHASES`)."""
    what: str
    ready: Callable[[Path], bool] = field(compare=False)
    delay_s: float = 0.0


def kill_points(seed: int, *, chat: int = 6, shards: int = 4) -> list[KillPoint]:
    """One point in each of generation, merge, extraction and training, drawn from `seed`."""
    rng = random.Random(seed)
    k_answer = rng.randint(1, chat - 1)
    k_shard = rng.randint(0, shards - 1)
    k_step = rng.randint(1, TRAIN_STEPS - 2)
    return [
        KillPoint("prepare", f"generation, after {k_answer} answer(s)",
                  lambda w, k=k_answer: answers(w) >= k, rng.uniform(0.0, 0.5)),
        KillPoint("prepare", "merge, once every dataset is tokenized", merging,
                  rng.uniform(0.0, 0.3)),
        KillPoint("extract", f"extraction, after {k_shard} shard(s)",
                  lambda w, k=k_shard: shards_done(w) >= k and (w / "hidden").exists(),
                  rng.uniform(0.0, 2.0)),
        KillPoint("train", f"training, after the step-{k_step} log line",
                  lambda w, k=k_step: logged_step(w) >= k, rng.uniform(0.0, 1.0)),
    ]


_STEP = re.compile(r" - step\s+(\d+)\s")


def logged_step(workdir: Path) -> int:
    log = workdir / ".drill-log"
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return 0
    return max((int(m) for m in _STEP.findall(text)), default=0)


# -- running a command -----------------------------------------------------------------------
@dataclass
class Outcome:
    """What one command did."""

    phase: str
    returncode: int | None
    """None: killed by the drill."""
    pid: int
    seconds: float
    killed_at: str | None = None
    """Where the kill landed: the point, and what was on disk then."""
    leftovers: list[str] = field(default_factory=list)
    """Processes the killed command left running (ended by the drill)."""


def slots_dir(prefect_home: Path) -> Path:
    """The drill's slot pools (`eyas.slots`: ``EYAS_SLOTS_DIR``), beside its Prefect home."""
    return prefect_home.parent / "slots"


def drill_env(prefect_home: Path, api_url: str | None = None) -> dict[str, str]:
    """A user's terminal, offline: with `api_url`, commands use that Prefect server; without,
    each command starts a temporary one (its database under `prefect_home`). The commands'
    slot pools are the drill's own (`slots_dir`)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PREFECT_") or k == "PREFECT_SERVER_ANALYTICS_ENABLED"}
    env.update(PREFECT_HOME=str(prefect_home), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_LOGGING_LEVEL="INFO", PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               EYAS_SLOTS_DIR=str(slots_dir(prefect_home)))
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


@contextlib.contextmanager
def prefect_server(home: Path, startup_s: float = 180.0, ui: bool = False):
    """``prefect server start`` on a free loopback port, as a team runs it: its database and
    (persistent) concurrency leases under `home`. Yields the API URL; stopped at the end.
    With `ui`, it also serves its web UI (at the URL without ``/api``)."""
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/api"
    env = drill_env(home)
    env.update(PREFECT_UI_ENABLED=str(ui).lower(), PREFECT_UI_API_URL=url,
               PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT="false",
               PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE=(
                   "prefect.server.concurrency.lease_storage.filesystem"))
    home.mkdir(parents=True, exist_ok=True)
    log = open(home / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host",
                             "127.0.0.1", "--port", str(port)], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + startup_s
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"prefect server did not start: {(home / 'server.log').read_text()}")
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _wait_for_point(point: KillPoint, word: str, proc: subprocess.Popen, phase: str,
                    workdir: Path, t0: float, timeout_s: float, log_path: Path) -> None:
    """Poll until `point` is ready in `workdir`; AssertionError when the command ends first
    or the point does not come within `timeout_s` of `t0` (`word`: "kill" or "stop")."""
    while not point.ready(workdir):
        if proc.poll() is not None:
            raise AssertionError(f"{phase} ended (exit {proc.returncode}) before the {word} "
                                 f"point ({point.what}); log: {log_path}")
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"{phase}: {word} point {point.what} never came")
        time.sleep(0.02)


def run_command(phase: str, args: list[str], config: Path, workdir: Path, env: dict[str, str],
                *, kill: KillPoint | None = None, timeout_s: float = 900.0) -> Outcome:
    """Run ``eyas <args> --config C --workdir W``; SIGKILL it at `kill` when given.

    Its output goes to ``<workdir>/.drill-log`` (appended: a kill point may read it).
    Raises AssertionError when it fails or hangs, or when the kill point never came.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / ".drill-log"
    argv = [sys.executable, "-m", "eyas.cli", *args, "--config", str(config), "--workdir",
            str(workdir)]
    t0 = time.monotonic()
    with open(log_path, "ab") as log:
        log.write(f"\n=== {' '.join(args)} (kill: {kill.what if kill else 'none'})\n".encode())
        log.flush()
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            if kill is None:
                code = proc.wait(timeout_s)
                return Outcome(phase, code, proc.pid, time.monotonic() - t0)
            _wait_for_point(kill, "kill", proc, phase, workdir, t0, timeout_s, log_path)
            time.sleep(kill.delay_s)
            children = _children(proc.pid)
            if proc.poll() is not None:
                return Outcome(phase, proc.returncode, proc.pid, time.monotonic() - t0,
                               killed_at=f"{kill.what}: the command had already finished")
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            where = f"{kill.what} (+{kill.delay_s:.2f} s): {describe(workdir)}"
            left = _end_leftovers(children)
            return Outcome(phase, None, proc.pid, time.monotonic() - t0, killed_at=where,
                           leftovers=left)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@dataclass
class Stopped:
    """What one command did when stopped by a signal to its process group."""

    phase: str
    returncode: int
    pid: int
    stop_s: float
    """Seconds from the signal to the command's exit."""
    text: str
    """The command's output (stdout and stderr)."""
    left: list[str]
    """Its processes still running once it exited (none expected)."""
    on_disk: str
    """`describe` of the workdir when the signal went."""


def stop_command(phase: str, args: list[str], config: Path, workdir: Path, env: dict[str, str],
                 point: KillPoint, sig: int, *, timeout_s: float = 900.0,
                 exit_s: float = 120.0) -> Stopped:
    """Run ``eyas <args> --config C --workdir W`` in a session of its own and, at `point`,
    send `sig` to its whole process group, as ``timeout``, a container runtime and a
    terminal's Ctrl-C do; wait up to `exit_s` for it to exit. Its output is appended to
    ``<workdir>/.drill-log`` (a point may read it). Raises AssertionError when it ends before
    the point or does not exit."""
    import psutil

    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / ".drill-log"
    argv = [sys.executable, "-m", "eyas.cli", *args, "--config", str(config), "--workdir",
            str(workdir)]
    t0 = time.monotonic()
    with open(log_path, "ab") as log:
        log.write(f"\n=== {' '.join(args)} (stop: {signal.Signals(sig).name} at "
                  f"{point.what})\n".encode())
        log.flush()
        start = log.tell()
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=as_in_a_terminal)
        try:
            _wait_for_point(point, "stop", proc, phase, workdir, t0, timeout_s, log_path)
            time.sleep(point.delay_s)
            children = _children(proc.pid)
            on_disk = describe(workdir)
            os.killpg(proc.pid, sig)
            sent = time.monotonic()
            try:
                code = proc.wait(exit_s)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{phase} did not exit within {exit_s} s of "
                                     f"{signal.Signals(sig).name}; log: {log_path}") from None
            took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    left = []
    for p in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(" ".join(p.cmdline())[:160])
                p.kill()
    text = log_path.read_bytes()[start:].decode(errors="replace")
    return Stopped(phase, code, proc.pid, took, text, left, on_disk)


def _children(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


PREFECT_TEMPORARY_SERVER = "prefect.server.api.server:create_app"
"""In the command line of the temporary Prefect server a command starts (without
``PREFECT_API_URL``); Prefect does not stop it when its parent is killed."""


def _end_leftovers(children: list, wait_s: float = 15.0) -> list[str]:
    """Processes of a killed command that outlive it: each named (``[prefect] ...`` for
    Prefect's temporary server, which Prefect leaves running; anything else is eyas's), then
    ended. eyas's own children get `wait_s` to stop by themselves first."""
    import psutil

    def running(p) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def name(p) -> str:
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            return ""
        return ("[prefect] " if PREFECT_TEMPORARY_SERVER in cmd else "") + cmd[:160]

    names = {p.pid: name(p) for p in children}
    ours = [p for p in children if not names[p.pid].startswith("[prefect]")]
    deadline = time.monotonic() + wait_s
    while any(running(p) for p in ours) and time.monotonic() < deadline:
        time.sleep(0.2)
    alive = [p for p in children if running(p)]
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, still = psutil.wait_procs(alive, timeout=5)
    for p in still:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    return [names[p.pid] for p in alive if names[p.pid]]


def describe(workdir: Path) -> str:
    """What is on disk: answers, merged, shards, checkpoint step."""
    return (f"{answers(workdir)} answer(s), merged "
            f"{'done' if (workdir / 'merged' / 'manifest.json').exists() else 'not done'}, "
            f"{shards_done(workdir)} shard(s), checkpoint step {checkpoint_step(workdir)}")


def active_slots(prefect_home: Path) -> dict[str, int]:
    """Held slots of each pool of the drill's commands (`slots_dir`): a slot is held while
    some process holds its flock (`eyas.slots.is_held`)."""
    from eyas.slots import is_held, pool_slots

    root = slots_dir(prefect_home)
    pools = sorted(root.iterdir()) if root.is_dir() else []  # none: no command took a slot
    return {pool.name: sum(is_held(slot) for slot in pool_slots(pool))
            for pool in pools if pool.is_dir() and not pool.name.startswith(".")}


# -- comparing runs ------------------------------------------------------------------------
HALF_WRITTEN = (".tmp-", ".old-")
"""Prefixes of what an interrupted writer leaves: never a complete output."""
NOT_COMPARED = {".drill-log", "logs", "reports", ".eyas-lock"}
"""Top-level entries that hold run-specific text (logs; pictures of the training history,
whose throughput differs between runs; the workdir lock, naming the last command's pid)."""
TIMING_KEYS = {"tok_s", "elapsed_s"}
"""Measured durations: the only values allowed to differ between two runs of the same work."""
RUN_KEYS = {"created", "code_version", "requests", "retries", "samples_done", "samples_skipped",
            "state_sha256"}
"""When and by which commit a manifest was written, and what the last call of phase 1 did
(requests sent, answers received or found already written): a resumed call sends fewer. And a
checkpoint's ``state_sha256``: the checksum of ``state.pt``'s bytes, whose tensors are compared
exactly instead (its history, with timings, differs between runs)."""


def outputs(workdir: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file a run left, leftovers included."""
    out = {}
    for p in sorted(workdir.rglob("*")):
        rel = p.relative_to(workdir)
        if rel.parts[0] in NOT_COMPARED or not p.is_file():
            continue
        out[str(rel)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _scrub(obj, root: str):
    """`obj` without timings and run stamps, with the run's folder written as ``<root>``."""
    if isinstance(obj, dict):
        return {k: _scrub(v, root) for k, v in obj.items() if k not in TIMING_KEYS | RUN_KEYS}
    if isinstance(obj, list):
        return [_scrub(v, root) for v in obj]
    if isinstance(obj, str):
        return obj.replace(root, "<root>")
    return obj


def _json_view(path: Path, root: Path):
    return _scrub(json.loads(path.read_text()), str(root))


def _checkpoint_view(path: Path, root: Path):
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True)
    state["state"]["history"] = _scrub(json.loads(state["state"]["history"]), str(root))
    return state


def _equal(a, b) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def differences(reference: Path, run: Path) -> list[str]:
    """Every way the outputs of `run` differ from those of `reference` (two run folders whose
    parent folders hold their configs): empty when equal.

    Files are compared byte for byte, except: manifests and other JSON records, compared
    without timings (``tok_s``, ``elapsed_s``), run stamps (``created``, ``code_version``)
    and with each run's own folder written alike; the training checkpoint, compared tensor for
    tensor (exactly) with its history read the same way. Anything a writer left half done
    (``.tmp-*``, ``.old-*``) is a difference too.
    """
    a, b = outputs(reference), outputs(run)
    problems = []
    for rel in sorted(set(a) | set(b)):
        if any(part.startswith(HALF_WRITTEN) for part in Path(rel).parts):
            problems.append(f"{rel}: left behind by an interrupted writer")
        elif rel not in b:
            problems.append(f"{rel}: missing")
        elif rel not in a:
            problems.append(f"{rel}: not written by the uninterrupted run")
        elif a[rel] != b[rel]:
            ra, rb = reference.parent, run.parent
            if rel.endswith(".json"):
                same = _json_view(reference / rel, ra) == _json_view(run / rel, rb)
            elif rel.endswith("checkpoint/state.pt"):
                same = _equal(_checkpoint_view(reference / rel, ra), _checkpoint_view(run / rel, rb))
            else:
                same = False
            if not same:
                problems.append(f"{rel}: differs")
    return problems


def shared_reference(tmp_path_factory) -> Path:
    """The uninterrupted run of `drill_recipe` that the fault and the stop drill compare with
    (``<root>/run``; only ever read or copied), made once per test session: under
    pytest-xdist by the first worker that asks, while any other waits on a lock (the drills
    run side by side; one run of the pipeline less on 2 cores). Each command starts its own
    temporary Prefect server, as in a plain terminal. A run that failed half way is made
    again from nothing, never finished by a resume (what the drills test)."""
    import fcntl
    import shutil

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # this session's folder, which its workers share
    root = base / "drill-reference"
    with open(base / "drill-reference.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # let go of by the kernel if this worker dies
        if not (root / "complete").exists():
            shutil.rmtree(root, ignore_errors=True)
            config = drill_recipe(root)
            run_pipeline(config, root / "run", drill_env(root / "prefect-home"))
            (root / "complete").write_text("")
    return root / "run"


def run_pipeline(config: Path, workdir: Path, env: dict[str, str],
                 points: list[KillPoint] = (), *, commands=None) -> list[Outcome]:
    """Run every command of the pipeline until it succeeds, killing it at each of `points`
    (those of a command in the order given) first. Raises AssertionError when a command
    fails."""
    outcomes = []
    for phase, args in commands or WHOLE_PIPELINE or PHASES:
        for point in [p for p in points if WHOLE_PIPELINE or p.phase == phase]:
            outcomes.append(run_command(phase, args, config, workdir, env, kill=point))
        done = run_command(phase, args, config, workdir, env)
        outcomes.append(done)
        if done.returncode != 0:
            tail = (workdir / ".drill-log").read_text(errors="replace")[-3000:]
            raise AssertionError(f"{phase} failed (exit {done.returncode}):\n{tail}")
    return outcomes
