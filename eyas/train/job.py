"""One training of a run's drafter, on the run's `Host`: the settings built once (`TrainJob.of`)
and one `run` that decides how it runs there.

- on a GPU host: ``python -m eyas.train.run`` (`eyas.train.run.command`, the host's eyas
  interpreter) as a detached job (`eyas.remote.jobs.run_job`), re-attached after a restart
  and cancelled with its follower;
- here, one process: `eyas.train.run.train_drafter` in this process;
- here, several: torchrun's agent and its workers as a child of this process that dies with
  it (`eyas.train.launch.run_child`).

Training here is never a detached job: a flow killed outright takes its training with it, as
the fault drill's ``kill -9`` case expects. Whichever way, each step record is handed to
`on_record` and every other line to `say`; the summary comes back with the history's records.
Prefect-free: `tasks.train` adds the slots, the cache and the artifacts.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from eyas.errors import USER_ERROR_EXIT, ConfigError, RemoteError
from eyas.layout import RunLayout
from eyas.remote.hosts import Host, HostSpec, connect
from eyas.remote.jobs import OFFLINE_ENV, error_lines, last_json_line, new_job_id, run_job
from eyas.train import run as core
from eyas.train.config import TrainConfig
from eyas.train.launch import STOP_GRACE_S, run_child

if TYPE_CHECKING:
    from eyas.config import PipelineConfig

@dataclass(frozen=True)
class TrainJob:
    """What one training is: its run, data, target and settings, and how many processes."""

    workdir: Path
    """The run's work directory (on the host when remote)."""
    data: str
    """``offline`` (the extraction's shards) or ``online`` (the merged records)."""
    model: str
    """The target model folder, where the training runs."""
    cfg: TrainConfig
    aux_layers: list[int] | None
    """The target layers the drafter reads (the extraction's; None: the target's default)."""
    trust_remote_code: bool
    processes: int
    """Training processes: more than one runs torchrun over them."""
    run_name: str
    """The recipe's name: a host's job is named after it (one training per run and host)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for a child or job here (the recipe's ``gpu_env``)."""

    @classmethod
    def of(cls, cfg: PipelineConfig, workdir: str | Path, data: str, model: str,
           processes: int) -> TrainJob:
        """The training of recipe `cfg` in `workdir` on `data`, `model` resolved already."""
        return cls(Path(workdir), core.check_data_kind(data), model, cfg.train,
                   cfg.extract.aux_layers, cfg.target.trust_remote_code, processes, cfg.name,
                   dict(cfg.gpu_env))

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.workdir)

    @property
    def paths(self) -> tuple[Path, Path]:
        """The train and eval data it reads (`eyas.train.run.data_paths`)."""
        return core.data_paths(self.workdir, self.data)

    def inputs(self) -> dict[str, str]:
        """The files (or globs) whose checksums say what data it trains on: the shards'
        manifests offline, the merged files online, and the target's config."""
        train, eval_ = self.paths
        if self.data == "offline":
            found = {"train": f"{train}/shard-*/manifest.json",
                     "eval": f"{eval_}/shard-*/manifest.json"}
        else:
            found = {"train": str(train), "eval": str(eval_)}
        return {**found, "target_config": f"{self.model}/config.json"}

    def argv(self, python: str, *, die_with_parent: bool = False) -> list[str]:
        """The command line of `eyas.train.run` for this training, reading its settings from
        ``<workdir>/.eyas/train.yaml`` (`write_settings`)."""
        train, eval_ = self.paths
        return core.argv(python, data=self.data, train=str(train), eval_=str(eval_),
                         model=self.model, out=str(self.layout.drafter_dir),
                         config_file=str(self.layout.job_settings("train")),
                         aux_layers=self.aux_layers, trust_remote_code=self.trust_remote_code,
                         processes=self.processes, die_with_parent=die_with_parent)

    def write_settings(self, host: Host) -> None:
        """Put the ``train:`` section where the command reads it, on `host`."""
        path = str(self.layout.job_settings("train"))
        host.mkdir(str(Path(path).parent))
        host.write_text(path, yaml.safe_dump(self.cfg.model_dump(mode="json")))

    def run(self, host: Host, *, say: Callable[[str], None],
            on_record: Callable[[dict], None] = lambda record: None,
            warn: Callable[[str], None] | None = None,
            job_id: Callable[[str], str] = new_job_id) -> dict[str, Any]:
        """Train (or resume) on `host` and return `eyas.train.run.train_drafter`'s summary plus
        ``history``. `say` gets each line (a step record made readable), `on_record` each step
        or evaluation record, `warn` what needs a look (default: `say`); `job_id(prefix)` names
        a host's job. Raises ConfigError when training refuses its settings or data (a retry
        cannot help; exit `USER_ERROR_EXIT`, here or there), RemoteError / RuntimeError when it
        fails."""
        warn = warn or say
        if host.spec.kind != "local":
            summary = self._as_job(host, say, on_record, job_id)
        elif self.processes > 1:
            summary = self._as_child(say, on_record)
        else:
            summary = self._here(say, on_record, warn)
        # A connection of its own: `host`'s may have idled through days of training.
        history = str(self.layout.history)
        with connect(host.spec) as h:
            summary["history"] = json.loads(h.read_text(history)) if h.exists(history) else []
        return summary

    # -- the three ways -------------------------------------------------------------------
    def _readable(self, on_record: Callable[[dict], None]) -> Callable[[str], str | None]:
        def readable(line: str) -> str | None:
            record = core.parse_record(line)
            if record is None:
                return None
            on_record(record)
            return core.format_record(record)

        return readable

    def _here(self, say: Callable[[str], None], on_record: Callable[[dict], None],
              warn: Callable[[str], None]) -> dict[str, Any]:
        train, eval_ = self.paths
        train_source, eval_source = core.open_sources(
            self.data, train, eval_, Path(self.model), self.cfg, aux_layers=self.aux_layers,
            trust_remote_code=self.trust_remote_code)
        if eval_source is None:
            warn(f"no {self.data} eval data in {eval_}: no evaluation; the last weights are "
                 "exported")

        def record(r: dict) -> None:
            say(core.format_record(r))
            on_record(r)

        return core.train_drafter(train_source, eval_source, Path(self.model),
                                  self.layout.drafter_dir, self.cfg,
                                  aux_layers=train_source.aux_layers, on_log=record)

    def _as_child(self, say: Callable[[str], None],
                  on_record: Callable[[dict], None]) -> dict[str, Any]:
        from eyas.remote.hosts import LocalHost

        n = self.processes
        self.write_settings(LocalHost(HostSpec.local()))
        argv = self.argv(HostSpec.local().eyas_python, die_with_parent=True)
        say(f"training with {n} processes here (torchrun): {' '.join(argv)}")
        readable = self._readable(on_record)
        lines: list[str] = []

        def sink(line: str) -> None:
            lines.append(line)
            shown = readable(line)
            say(line if shown is None else shown)

        code = run_child(argv, env={**os.environ, **OFFLINE_ENV, **self.env}, on_line=sink)
        if code == USER_ERROR_EXIT:
            raise ConfigError(f"training refused its configuration or data:\n{error_lines(lines)}",
                              where=f"recipe {self.run_name!r}, train")
        if code != 0:
            raise RuntimeError(f"training ({n} processes) exited with {code}:\n"
                               f"{error_lines(lines)}")
        summary = last_json_line(lines)
        if summary is None:
            raise RuntimeError(f"training ({n} processes) printed no summary")
        return summary

    def _as_job(self, host: Host, say: Callable[[str], None], on_record: Callable[[dict], None],
                job_id: Callable[[str], str]) -> dict[str, Any]:
        # One training per run name and host: a restarted flow re-attaches to the running job.
        prefix = "train-" + re.sub(r"[^A-Za-z0-9_.]+", "-", self.run_name)[:40]
        self.write_settings(host)
        train, eval_ = self.paths
        cmd = shlex.join(self.argv(host.spec.eyas_python))
        job, lines = run_job(
            host.spec, cmd, prefix=prefix, job_id=job_id(prefix), say=say, env=OFFLINE_ENV,
            on_line=self._readable(on_record),
            uses=[str(self.layout.drafter_dir), str(train), str(eval_)],
            cancel_grace=STOP_GRACE_S,  # stopped, training ends its step and checkpoints first
            refusal_where=f"recipe {self.run_name!r}, train")
        summary = last_json_line(lines)
        if summary is None:
            raise RemoteError(f"{host.spec.login}: training job {job} printed no summary")
        return summary
