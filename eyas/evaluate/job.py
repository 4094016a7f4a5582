"""One offline evaluation of a run's drafter, on the run's `Host`: the settings built once
(`EvaluateJob.of`) and one `run`.

The evaluator runs as a detached job where the run's folder is, with the same command line
(``python -m eyas.evaluate.run``, `eyas.evaluate.run.command`) here and on a GPU host: on the
host with its eyas interpreter, here in ``<workdir>/.eyas/jobs`` with this interpreter. So a
dropped connection does not stop it on a host, a stop or a cancelled flow cancels it in both
places (`eyas.remote.jobs.run_job`), and a flow's cancellation hook finds it by its id.

Paths the recipe names (``evaluate.drafter``, ``evaluate.prompt_files``,
``target.chat_template``, ``target.tokenizer``) are taken as the machine that runs the job
reads them: here resolved against the recipe's folder (prompt files also from eyas's package
and demo data); on a host as written, paths there. Prefect-free: `tasks.evaluate` adds the
slot, the cache and the artifacts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from eyas.errors import DataError, RemoteError
from eyas.evaluate.config import EvaluateConfig
from eyas.layout import RunLayout
from eyas.remote.hosts import Host, HostSpec, connect
from eyas.remote.jobs import OFFLINE_ENV, new_job_id, run_job

if TYPE_CHECKING:
    from eyas.config import PipelineConfig


def drafter_of(cfg: PipelineConfig, workdir: str | Path, *, local: bool) -> str:
    """The drafter folder an evaluation of recipe `cfg` reads: ``evaluate.drafter`` (resolved
    against the recipe's folder when `local`; as written on a host), else the run's export
    (``<workdir>/drafter/export``)."""
    if cfg.evaluate.drafter:
        return str(cfg.resolve_path(cfg.evaluate.drafter)) if local else cfg.evaluate.drafter
    return str(RunLayout(Path(workdir)).export)


@dataclass(frozen=True)
class EvaluateJob:
    """What one evaluation is: its run, target, drafter, settings and the files it reads."""

    workdir: Path
    """The run's work directory (on the host when remote)."""
    model: str
    """The target model folder, where the evaluation runs."""
    drafter: str
    """The drafter folder (`drafter_of`)."""
    cfg: EvaluateConfig
    """The ``evaluate:`` section, its prompt files as the running machine reads them."""
    aux_layers: list[int] | None
    """The target layers the drafter reads (the extraction's; None: the target's default)."""
    trust_remote_code: bool
    run_name: str
    """The recipe's name: the job and the report are named after it."""
    chat_template: str | None = None
    tokenizer: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for the job here (the recipe's ``gpu_env``; a host's block has its own)."""

    @classmethod
    def of(cls, cfg: PipelineConfig, workdir: str | Path, model: str, *,
           local: bool) -> EvaluateJob:
        """The evaluation of recipe `cfg` in `workdir` with `model` resolved already, run here
        (`local`) or on a host."""
        ecfg = cfg.evaluate
        if local:
            from eyas.evaluate.run import resolve_prompt_file

            ecfg = ecfg.model_copy(update={"prompt_files": [
                str(resolve_prompt_file(f, cfg.source_dir)) for f in ecfg.prompt_files]})

        def path(value: str | None) -> str | None:
            return value and (str(cfg.resolve_path(value)) if local else value)

        return cls(Path(workdir), model, drafter_of(cfg, workdir, local=local), ecfg,
                   cfg.extract.aux_layers, cfg.target.trust_remote_code, cfg.name,
                   chat_template=path(cfg.target.chat_template),
                   tokenizer=path(cfg.target.tokenizer), env=dict(cfg.gpu_env))

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.workdir)

    @property
    def prefix(self) -> str:
        """The job's name prefix: one evaluation per run and host (``evaluate-<run>``)."""
        return "evaluate-" + re.sub(r"[^A-Za-z0-9_.]+", "-", self.run_name)[:40]

    def settings(self) -> dict[str, Any]:
        """The ``evaluate:`` fields the command reads from its YAML (the drafter goes on the
        command line; the serving benchmark is not the evaluator's)."""
        return self.cfg.model_dump(mode="json", exclude={"drafter", "serving"})

    def command(self, python: str) -> str:
        """``python -m eyas.evaluate.run`` over the run's paths with `python` (a host's eyas
        interpreter, or this one), reading ``<workdir>/.eyas/evaluate.yaml``."""
        from eyas.evaluate.run import command

        layout = self.layout
        return command(python, model=self.model, drafter=self.drafter,
                       out=str(layout.evaluate_dir),
                       config_file=str(layout.job_settings("evaluate")),
                       train_jsonl=str(layout.train),
                       eval_jsonl=str(layout.eval) if self.cfg.merged_eval else None,
                       aux_layers=self.aux_layers, trust_remote_code=self.trust_remote_code,
                       chat_template=self.chat_template, tokenizer=self.tokenizer,
                       run_name=self.run_name)

    def run(self, host: Host, *, say: Callable[[str], None],
            job_id: Callable[[str], str] = new_job_id) -> dict[str, Any]:
        """Evaluate on `host` (a `LocalHost`: this machine) and return the ``report.json`` it
        wrote. Raises DataError when the drafter is missing, ConfigError when the evaluator
        refuses its settings or data (a retry cannot help), RemoteError when the job fails or
        writes no report."""
        layout = self.layout
        if not host.exists(self.drafter):
            raise DataError("no trained drafter (run `eyas train` first, or set "
                            f"evaluate.drafter){host.on}", path=self.drafter)
        host.write_text(str(layout.job_settings("evaluate")), yaml.safe_dump(self.settings()))
        # Here the job's folder is the run's (``<workdir>/.eyas/jobs``), where a cancelled
        # flow's hook looks; a host keeps its own data root.
        spec = (host.spec if host.spec.kind != "local"
                else HostSpec.local(data_root=str(self.workdir), gpu_env=self.env))
        job, _ = run_job(spec, self.command(spec.eyas_python), prefix=self.prefix,
                         job_id=job_id(self.prefix), say=say, env=OFFLINE_ENV,
                         uses=[str(layout.evaluate_dir), str(layout.drafter_dir)],
                         refusal_where="evaluate")
        # A connection of its own: `host`'s may have idled through hours of evaluation.
        with connect(host.spec) as h:
            if not h.exists(str(layout.report)):
                raise RemoteError(f"{spec.login}: evaluation job {job} wrote no {layout.report}")
            return json.loads(h.read_text(str(layout.report)))
