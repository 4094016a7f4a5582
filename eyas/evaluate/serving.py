"""The serving benchmark: SGLang without and with the drafter on a GPU host, one server at a time.

    with connect(spec) as host:
        result = run_serving_benchmark(host, cfg, model_path="/data/models/kimi-k2.5",
                                       draft_model_path="/data/runs/100k/drafter/export",
                                       prompts_path="/data/runs/100k/merged/eval.jsonl")
    print(result.verdict)

For the baseline, SGLang's own n-gram speculation (`ServingConfig.ngram`), and then each EAGLE-3
setting of the grid (`ServingConfig.spec_grid`):

0. check that the GPUs the server will use are free (``nvidia-smi`` on the host; waits
   `gpu_free_wait_s` for the previous server's memory, then fails naming each busy GPU and what
   holds it; a host without ``nvidia-smi`` is not checked);
1. start the server as a detached job on the host (`eyas.remote.jobs`: its own session, pid
   and log files; it outlives a dropped connection), listening on the host's 127.0.0.1;
2. poll its health endpoint (`ServingConfig.health_path`) until it answers 200; a server that
   exits, or does not answer within `startup_timeout_s`, is stopped and reported with its log's
   last lines;
3. run the load generator ON THE HOST as a second job (``python -m eyas.evaluate.loadgen`` with
   the host's eyas venv): warm-up requests, then each batch size `repeats` times, each run
   after emptying SGLang's prefix cache (``POST /flush_cache``), on the held-out prompts,
   streamed (time to first token, decode speed per request), with per-request timeouts,
   retries and a deadline per run; its result lines stream back here;
4. stop the server (TERM to its process group, KILL after `stop_grace_s`) — always: after a
   failure, an interrupt or a cancelled flow too (``finally``). A run killed outright (SIGKILL,
   a rebooted laptop) leaves its detached server running; the next run finds it by its job id
   prefix (``sglang-<port>-``) and stops it before starting anything.

A baseline that fails is fatal (nothing to compare against); the n-gram server or an EAGLE-3
setting that fails is recorded with its error and the sweep goes on, unless every EAGLE-3 setting
fails. The result holds one row per server and batch size (median and spread of the runs,
`eyas.evaluate.serving_verdict`), the verdict, and the draft and verification costs measured on
SGLang (`draft_cost_measured`, from the batch-1 rows: `serving_verdict.measured_costs`).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import shlex
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from eyas.errors import EyasError, RemoteError
from eyas.evaluate.loadgen import parse_results
from eyas.evaluate.serving_config import ServingConfig, SpecKnobs
from eyas.evaluate.serving_verdict import compare, make_row, measured_costs, verdict
from eyas.evaluate.sglang_server import (
    LOOPBACK,
    PINNED_SGLANG,
    ServerSpec,
    server_command,
)
from eyas.hf_target import WRAPPER_KEYS
from eyas.manifest import code_version
from eyas.remote.hosts import Host, RemoteTimeoutError, shell_join
from eyas.remote.jobs import (
    JobStatus,
    attach,
    cancel,
    job_status,
    new_job_id,
    read_log,
    running_jobs,
    start_job,
)

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 40
POLL_S = 2.0
"""Seconds between health polls of a starting server."""
POLL_FAILURES = 5
"""Health polls in a row that may fail on the network before the benchmark gives up."""
PROBE_TIMEOUT_S = 30
"""Seconds one health request may take on the host."""


class ServingError(EyasError):
    """The benchmark could not measure: a server did not start, the load generator failed."""


@dataclass
class ServerRecord:
    """One server of the sweep: how it was started and what became of it."""

    mode: str
    knobs: SpecKnobs | None
    command: str
    job_id: str | None = None
    startup_s: float | None = None
    """Seconds from start to the first healthy answer."""
    error: str | None = None
    results: list[dict] = field(default_factory=list)
    """The load generator's result per batch size (`LoadResult.to_dict`)."""
    notes: list[str] = field(default_factory=list)
    """What the load generator said about the prompts (records skipped without a prompt)."""

    def to_dict(self) -> dict:
        out = asdict(self)
        out["knobs"] = asdict(self.knobs) if self.knobs else None
        return out


@dataclass
class ServingResult:
    """Rows, verdict, and everything needed to trust them."""

    rows: list[dict]
    verdict: str
    comparisons: list[dict]
    """The best EAGLE-3 setting against the baseline per batch size (the verdict's)."""
    servers: list[ServerRecord]
    skipped: list[dict]
    warnings: list[str]
    host: str
    model_path: str
    draft_model_path: str
    prompts_path: str
    sglang_version: str | None
    config: dict
    code_version: str = ""
    """eyas version (and git commit) that measured."""
    finished_at: str = ""
    """UTC time the benchmark ended (ISO 8601)."""
    ngram_comparisons: list[dict] = field(default_factory=list)
    """The best EAGLE-3 setting against SGLang's n-gram speculation per batch size."""
    draft_cost_measured: dict | None = None
    """Draft and verification costs on SGLang at batch 1 (`serving_verdict.measured_costs`):
    ``target_step_ms``, ``draft_step_ms``, ``verify_ms``, ``draft_to_target``,
    ``verify_to_target``, ``method``, ``settings``; None without a batch-1 baseline."""

    def to_dict(self) -> dict:
        out = asdict(self)
        out["servers"] = [s.to_dict() for s in self.servers]
        return out


# --------------------------------------------------------------------------- host helpers


_PREFLIGHT = r"""
import json, os, socket, sys
model, draft, prompts, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rejection = sys.argv[5] == "1"
wrapper_keys = json.loads(sys.argv[6])  # eyas.hf_target.WRAPPER_KEYS (the host runs stdlib only)
problems = []
if not os.path.isfile(os.path.join(model, "config.json")):
    problems.append(f"target model {model}: no config.json (a model folder on the host?)")
if not os.path.isfile(os.path.join(draft, "config.json")):
    problems.append(f"drafter {draft}: no config.json (export the drafter first: drafter/export)")
if rejection and not problems:
    # SGLang 0.5.23 (eagle_worker_v2.py) refuses rejection sampling unless the drafter drafts
    # over the target's whole vocabulary; say so before a server is started.
    with open(os.path.join(model, "config.json")) as f:
        target = json.load(f)
    with open(os.path.join(draft, "config.json")) as f:
        drafter = json.load(f)
    for key in wrapper_keys:  # as eyas.hf_target.wrapper_key reads a wrapper's config
        if isinstance(target.get(key), dict) and "num_hidden_layers" in target[key]:
            target = target[key]
            break
    vocab = target.get("vocab_size")
    drafted = drafter.get("draft_vocab_size") or drafter.get("vocab_size")
    if drafted != vocab:
        problems.append(f"drafter {draft}: drafts {drafted} of the target's {vocab} tokens; "
                        "serving.rejection_sampling needs the whole vocabulary (SGLang 0.5.23 "
                        "refuses a reduced one): train with train.draft_vocab_size "
                        f"{vocab}, or set serving.rejection_sampling false")
if not os.path.isfile(prompts) or os.path.getsize(prompts) == 0:
    problems.append(f"held-out prompts {prompts}: missing or empty (merged/eval.jsonl; is "
                    "merge.eval_fraction 0?)")
s = socket.socket()
s.settimeout(2)
if s.connect_ex(("127.0.0.1", port)) == 0:
    problems.append(f"port {port} on the host's 127.0.0.1 is taken by another process "
                    "(not an eyas server job); set serving.port to a free one")
s.close()
print(json.dumps(problems))
"""

_HEALTH = r"""
import sys, urllib.request, urllib.error
try:
    with urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])) as r:
        print(r.status)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception as e:
    print("down", type(e).__name__)
"""


_GPU_QUERY = ("--query-gpu=index,uuid,name,memory.used,memory.total "
              "--format=csv,noheader,nounits")
_APP_QUERY = "--query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits"


def server_gpus(cfg: ServingConfig) -> list[int]:
    """nvidia-smi indices of the GPUs a server takes: the first `tp_size` of the server env's
    ``CUDA_VISIBLE_DEVICES`` (indices), else GPUs 0 .. tp_size - 1."""
    visible = cfg.server_env.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [int(x) for x in visible.split(",") if x.strip().isdigit()]
        if ids:
            return ids[:cfg.tp_size]
    return list(range(cfg.tp_size))


def busy_gpus(host: Host, cfg: ServingConfig) -> list[str] | None:
    """One line per GPU of `server_gpus` with more than `gpu_busy_mib` in use (what holds it);
    None when the host has no ``nvidia-smi`` (nothing to check: a CPU stand-in)."""
    smi = shlex.quote(cfg.nvidia_smi)
    res = host.run(f"command -v {smi} >/dev/null 2>&1 || exit 127; {smi} {_GPU_QUERY}",
                   check=False, timeout=60)
    if res.exit_code == 127:
        return None
    if not res.ok:
        raise ServingError(f"{host.spec.login}: `{cfg.nvidia_smi} {_GPU_QUERY}` failed "
                           f"(exit {res.exit_code}): {(res.stderr or res.stdout).strip()[:300]}")
    gpus = {}
    for line in res.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 5 and parts[0].isdigit():
            gpus[int(parts[0])] = parts
    apps = host.run(f"{smi} {_APP_QUERY}", check=False, timeout=60)
    holders: dict[str, list[str]] = {}
    for line in (apps.stdout if apps.ok else "").strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4:
            holders.setdefault(parts[0], []).append(
                f"pid {parts[1]} {parts[2]} ({parts[3]} MiB)")
    out = []
    for i in server_gpus(cfg):
        if i not in gpus:
            out.append(f"GPU {i}: not on the host (nvidia-smi lists {sorted(gpus)}; check "
                       f"serving.tp_size and CUDA_VISIBLE_DEVICES in serving.server_env)")
            continue
        _, uuid, name, used, total = gpus[i]
        if float(used) > cfg.gpu_busy_mib:
            who = ", ".join(holders.get(uuid, [])) or "no process listed (another container?)"
            out.append(f"GPU {i} ({name}): {used} of {total} MiB in use by {who}")
    return out


def wait_gpus_free(host: Host, cfg: ServingConfig, say: Callable[[str], None], *,
                   poll_s: float = 5.0) -> bool:
    """Wait up to `gpu_free_wait_s` until the server's GPUs are free; False when the host has
    no ``nvidia-smi``. Raises ServingError naming each busy GPU and what holds it."""
    start = time.monotonic()
    while True:
        busy = busy_gpus(host, cfg)
        if busy is None:
            return False
        if not busy:
            return True
        if time.monotonic() - start >= cfg.gpu_free_wait_s:
            raise ServingError(
                f"{host.spec.login}: the GPUs the server needs are not free after "
                f"{cfg.gpu_free_wait_s:g}s (more than serving.gpu_busy_mib = "
                f"{cfg.gpu_busy_mib} MiB in use):\n  " + "\n  ".join(busy)
                + "\nStop what holds them, or point serving.server_env's CUDA_VISIBLE_DEVICES "
                "at free GPUs.")
        say("waiting for the GPUs to free: " + "; ".join(busy))
        time.sleep(poll_s)


def _py(host: Host, python: str, script: str, *args: str, **kw: Any):
    return host.run(shell_join(python, "-c", script, *args), **kw)


def log_tail(host: Host, job_id: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a job's log (empty text when it wrote nothing)."""
    st = job_status(host, job_id)
    _, text, _ = read_log(host, job_id, max(0, st.log_bytes - 64_000))
    return "\n".join(text.splitlines()[-lines:])


def stop_stale_servers(host: Host, port: int, say: Callable[[str], None]) -> list[str]:
    """Stop the server and load generator jobs an earlier run left on `port`; return their ids."""
    stale = running_jobs(host, f"sglang-{port}-") + running_jobs(host, f"loadgen-{port}-")
    for job_id in stale:
        say(f"stopping job {job_id} left running by an earlier run on port {port}")
        cancel(host, job_id)
    return stale


def wait_healthy(host: Host, job_id: str, url: str, *, timeout_s: float, probe_python: str,
                 poll_s: float = POLL_S) -> float:
    """Seconds until `url` answers 200 on the host while job `job_id` runs.

    Raises ServingError (with the job's log tail) when the job ends first or `timeout_s` passes.
    A poll that fails on the network is retried, up to `POLL_FAILURES` in a row.
    """
    start = time.monotonic()
    failures = 0
    last = "no answer yet"
    while True:
        try:
            st: JobStatus = job_status(host, job_id)
            if st.state != "running":
                code = f"exit code {st.exit_code}" if st.exit_code is not None else st.state
                raise ServingError(
                    f"{host.spec.login}: the server (job {job_id}) ended ({code}) before "
                    f"{url} answered. Its log ends with:\n{log_tail(host, job_id)}")
            # SGLang's /health_generate may take up to its HEALTH_CHECK_TIMEOUT (20 s in
            # 0.5.23) to answer 200 on an idle server: give the probe longer than that.
            answer = _py(host, probe_python, _HEALTH, url, str(PROBE_TIMEOUT_S), check=False,
                         timeout=PROBE_TIMEOUT_S + 30).stdout.strip()
            failures = 0
        except RemoteTimeoutError:
            answer = "probe timed out"
        except ServingError:
            raise
        except RemoteError:
            failures += 1
            if failures > POLL_FAILURES:
                raise
            answer = "poll failed on the network"
        if answer == "200":
            return time.monotonic() - start
        last = answer or last
        if time.monotonic() - start > timeout_s:
            tail = log_tail(host, job_id)
            raise ServingError(
                f"{host.spec.login}: the server (job {job_id}) did not answer {url} within "
                f"{timeout_s:g}s (last answer: {last}). Raise serving.startup_timeout_s if it is "
                f"still loading. Its log ends with:\n{tail}")
        time.sleep(poll_s)


# --------------------------------------------------------------------------- the benchmark


def loadgen_command(python: str, cfg: ServingConfig, prompts_path: str, *,
                    tokenizer: str | None = None, trust_remote_code: bool = False) -> str:
    """The load generator's command line on the host (every batch size, one result line each);
    `tokenizer` (the target folder) renders a messages prompt file with its chat template."""
    argv = [python, "-m", "eyas.evaluate.loadgen",
            "--base-url", f"http://{LOOPBACK}:{cfg.port}", "--api", "generate",
            "--prompts", prompts_path, "--num-prompts", str(cfg.num_prompts),
            "--batch-sizes", ",".join(str(b) for b in cfg.batch_sizes),
            "--warmup", str(cfg.warmup_requests), "--max-tokens", str(cfg.max_tokens),
            "--temperature", str(cfg.temperature),
            "--request-timeout", str(cfg.request_timeout_s),
            "--run-timeout", str(cfg.run_timeout_s), "--max-retries", str(cfg.max_retries),
            "--repeats", str(cfg.repeats)]
    if cfg.flush_cache:
        argv.append("--flush-cache")
    if tokenizer:
        argv += ["--tokenizer", tokenizer] + (["--trust-remote-code"] if trust_remote_code else [])
    return shell_join(*argv)


def _sglang_version(host: Host, cfg: ServingConfig) -> str:
    res = host.run(shell_join(cfg.sglang_python, "-c", "import sglang; print(sglang.__version__)"),
                   env=cfg.server_env, check=False, timeout=300)
    if not res.ok:
        detail = "\n  ".join((res.stderr or res.stdout).strip().splitlines()[-5:])
        raise ServingError(
            f"{host.spec.login}: `{cfg.sglang_python}` cannot import sglang (set "
            f"serving.sglang_python to the python of the host's SGLang venv):\n  {detail}")
    return res.stdout.strip().splitlines()[-1]


def _run_one(host: Host, server: ServerRecord, spec: ServerSpec, cfg: ServingConfig, *,
             prompts_path: str, eyas_python: str, job_id: Callable[[str], str],
             say: Callable[[str], None]) -> None:
    """Start one server, wait for health, drive the load, and stop it whatever happens."""
    server.job_id = job_id(f"sglang-{cfg.port}-{spec.mode}")
    if wait_gpus_free(host, cfg, say):
        say(f"GPUs {server_gpus(cfg)} free")
    say(f"starting {spec.mode} server" + (f" ({spec.knobs.label()})" if spec.knobs else "")
        + f": job {server.job_id}\n  {server.command}")
    uses = [p for p in (spec.model_path, spec.draft_model_path) if p]
    start_job(host, server.command, job_id=server.job_id, env=cfg.server_env, uses=uses)
    load_id = None
    try:
        url = f"http://{LOOPBACK}:{cfg.port}{cfg.health_path}"
        server.startup_s = wait_healthy(host, server.job_id, url,
                                        timeout_s=cfg.startup_timeout_s,
                                        probe_python=host.spec.python)
        say(f"{spec.mode} server healthy after {server.startup_s:.0f}s")
        lines: list[str] = []

        def sink(line: str) -> None:
            lines.append(line)
            say(f"[loadgen] {line}")

        load_id = job_id(f"loadgen-{cfg.port}")
        start_job(host, loadgen_command(eyas_python, cfg, prompts_path,
                                        tokenizer=spec.model_path,
                                        trust_remote_code=spec.trust_remote_code),
                  job_id=load_id, uses=[prompts_path])
        runs = len(cfg.batch_sizes) * cfg.repeats
        bound = (cfg.run_timeout_s + 120) * (runs + (cfg.warmup_requests > 0))
        code = attach(host, load_id, stream=sink, poll_interval=1.0, timeout=bound)
        results = parse_results(lines)
        if code != 0 or len(results) != runs:
            tail = "\n".join(lines[-20:])
            raise ServingError(f"{host.spec.login}: the load generator (job {load_id}) exited "
                               f"with {code} after {len(results)} of {runs} runs "
                               f"({len(cfg.batch_sizes)} batch sizes x {cfg.repeats}):\n{tail}")
        server.results = results
        server.notes = [line for line in lines if line.startswith("note: skipped")]
        server.notes += [f"{spec.mode}: {line[6:]}" for line in lines
                         if line.startswith("note: batch")]
    except BaseException as exc:
        jobs = [j for j in (load_id, server.job_id) if j]
        if isinstance(exc, Exception):
            _stop(host, jobs, cfg.stop_grace_s, say)
        else:  # an interrupt (Ctrl-C, a stop, a cancelled flow) goes on up, whatever happens
            try:
                _stop(host, jobs, cfg.stop_grace_s, say)
            except RemoteError as failure:  # never raised in its place: the sweep would go on
                say(str(failure))
        raise
    _stop(host, [j for j in (load_id, server.job_id) if j], cfg.stop_grace_s, say)


def _stop(host: Host, job_ids: list[str], grace: float, say: Callable[[str], None]) -> None:
    """Cancel every job of `job_ids` (all are tried); raise the first failure afterwards."""
    failed: list[str] = []
    for jid in job_ids:
        try:
            st = cancel(host, jid, grace=grace)
            say(f"stopped job {jid} ({st.state})")
        except RemoteError as exc:
            failed.append(f"{jid}: {exc}")
    if failed:
        raise RemoteError(
            f"{host.spec.login}: could not stop " + "; ".join(failed) + ". The next benchmark "
            "on this port stops them first, or stop them by hand with eyas.remote.jobs.cancel")


def run_serving_benchmark(
    host: Host,
    cfg: ServingConfig,
    *,
    model_path: str,
    draft_model_path: str,
    prompts_path: str,
    trust_remote_code: bool = False,
    job_id: Callable[[str], str] = new_job_id,
    say: Callable[[str], None] | None = None,
) -> ServingResult:
    """Benchmark SGLang serving `model_path` alone and with the drafter (paths on the host).

    `job_id` makes the id of each detached job from a prefix (a Prefect task passes one that
    names its flow run, so cancelling the flow stops them); `say` receives progress lines.
    Raises ServingError when the host is not ready (missing folders, no SGLang, a taken port),
    when the baseline fails, or when every EAGLE-3 setting fails; every server is stopped first.
    """
    say = say or log.info
    eyas_python = cfg.eyas_python or f"{host.spec.venv_path.rstrip('/')}/bin/python"
    stop_stale_servers(host, cfg.port, say)
    problems = json.loads(_py(host, host.spec.python, _PREFLIGHT, model_path, draft_model_path,
                              prompts_path, str(cfg.port),
                              "1" if cfg.rejection_sampling else "0",
                              json.dumps(list(WRAPPER_KEYS))).stdout)
    if problems:
        raise ServingError(f"{host.spec.login}: not ready for the serving benchmark:\n  "
                           + "\n  ".join(problems))
    version = _sglang_version(host, cfg)
    warnings: list[str] = []
    if version != PINNED_SGLANG:
        warnings.append(f"SGLang {version} on the host; eyas's flags and HTTP shapes were "
                        f"checked against {PINNED_SGLANG}")
        say(warnings[-1])
    skipped = [{"knobs": asdict(k), "reason": why} for k, why in cfg.skipped_knobs()]
    for s in skipped:
        say(f"skipping {SpecKnobs(**s['knobs']).label()}: {s['reason']}")

    common = dict(model_path=model_path, port=cfg.port, tp_size=cfg.tp_size,
                  trust_remote_code=trust_remote_code, extra_args=tuple(cfg.extra_server_args))
    specs = [ServerSpec(**common)]
    if cfg.ngram:
        specs.append(ServerSpec(**common, ngram=True, ngram_args=tuple(cfg.ngram_flags())))
    specs += [ServerSpec(**common, draft_model_path=draft_model_path, knobs=k,
                         rejection_sampling=cfg.rejection_sampling)
              for k in cfg.spec_grid()]
    servers: list[ServerRecord] = []
    for spec in specs:
        record = ServerRecord(spec.mode, spec.knobs, server_command(cfg.sglang_python, spec))
        servers.append(record)
        try:
            _run_one(host, record, spec, cfg, prompts_path=prompts_path,
                     eyas_python=eyas_python, job_id=job_id, say=say)
        except (ServingError, RemoteError) as exc:
            record.error = str(exc)
            if spec.mode == "baseline":
                raise ServingError(f"the baseline server failed, nothing to compare with: "
                                   f"{exc}") from exc
            what = (f"EAGLE-3 {spec.knobs.label()}" if spec.knobs else
                    "SGLang's n-gram speculation")
            say(f"{what} failed: {exc}")
            warnings.append(f"{what} failed: {str(exc).splitlines()[0]}")

    # The same prompts for every server: what was skipped is said once.
    warnings += [n for n in servers[0].notes if n.startswith("note: skipped")]
    warnings += [n for s in servers for n in s.notes if not n.startswith("note: skipped")]
    measured = [s for s in servers if s.results]
    if not any(s.mode == "eagle3" for s in measured):
        raise ServingError("every EAGLE-3 setting failed:\n" + "\n".join(
            f"- {s.knobs.label()}: {s.error}" for s in servers if s.mode == "eagle3"))
    rows = []
    for s in measured:
        what = s.knobs.label() if s.knobs else {"ngram": "n-gram"}.get(s.mode, s.mode)
        for size in cfg.batch_sizes:
            runs = [r for r in s.results if r["batch_size"] == size]
            good = [r for r in runs if r["ok"]]
            for res in runs:
                run = f" (run {res.get('repeat', 0) + 1})" if cfg.repeats > 1 else ""
                if not res["ok"]:  # no throughput to speak of: no row, and say why
                    warnings.append(f"{what}, batch {size}{run}: no request succeeded "
                                    f"({'; '.join(res['first_errors'][:2]) or 'none sent'})")
                elif res["failed"] or res["not_sent"]:
                    kinds = ", ".join(f"{k}: {v}" for k, v in res["errors"].items())
                    warnings.append(
                        f"{what}, batch {size}{run}: {res['failed']} of {res['requests']} "
                        f"requests failed and {res['not_sent']} were not sent "
                        f"({kinds or 'deadline'})")
            if not good:
                continue
            # Σ tokens / Σ verifications over the runs (each run's accept length is its own).
            spec_runs = [r for r in good if r.get("accept_length")]
            accept = (sum(r["completion_tokens"] for r in spec_runs)
                      / sum(r["completion_tokens"] / r["accept_length"] for r in spec_runs)
                      if spec_runs else good[-1].get("server_accept_length"))
            rows.append(make_row(
                s.mode, size, s.knobs, [r["output_tok_s"] for r in good],
                accept if s.mode != "baseline" else None,
                decode_tok_s=[r["decode_tok_s"] for r in good if r.get("decode_tok_s")],
                ttft_s=[r["ttft_s"] for r in good if r.get("ttft_s") is not None]))
    text = verdict(rows, tie_band=cfg.tie_band)
    if warnings:
        text += f" ({len(warnings)} warning{'s' if len(warnings) > 1 else ''}: see the result)"
    say(text)
    return ServingResult(
        rows=rows, verdict=text,
        comparisons=[c.to_dict() for c in compare(rows, tie_band=cfg.tie_band)],
        ngram_comparisons=[c.to_dict() for c in compare(rows, tie_band=cfg.tie_band,
                                                         reference="ngram")],
        draft_cost_measured=measured_costs(rows),
        servers=servers, skipped=skipped, warnings=warnings, host=host.spec.login,
        model_path=model_path, draft_model_path=draft_model_path, prompts_path=prompts_path,
        sglang_version=version, config=cfg.model_dump(mode="json"),
        code_version=code_version(),
        finished_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )
