"""Start a local OpenAI-compatible server (`transformers serve`) for a model folder.

For small targets (the tiny demo model, tests) phase 1 can answer prompts without a GPU
serving engine: `launch_server` starts ``transformers serve`` (the ``transformers[serving]``
extra) as a subprocess on 127.0.0.1, waits until it answers, yields its base URL (ending
in ``/v1``) and stops it on exit.

The command it runs (transformers 5.x)::

    python -m transformers.cli.transformers serve <ABS_MODEL_DIR> \\
        --host 127.0.0.1 --port <PORT> --device <DEVICE> --log-level info \\
        [--dtype <DTYPE>] [--continuous-batching] [--trust-remote-code]

with ``HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1`` in its environment. The positional
argument pins the server to that one model ("force model"): it is loaded before the port
opens, and every request must carry exactly that string as ``model`` (or none) — any other
name is answered with 400. `served_model_name` gives that string.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from eyas import stopping
from eyas.errors import EyasError
from eyas.proc import dies_with_this_process, free_port, stop_group

LOG_TAIL_LINES = 40


def served_model_name(model_dir: str | Path) -> str:
    """The ``model`` string requests to a `launch_server` server must carry: the absolute path
    of the folder it serves (`eyas.hf_target.serving_folder`: the target, or the flat view of
    a multimodal wrapper such as Kimi-K2.5's, which ``transformers serve`` cannot load)."""
    path = Path(model_dir).expanduser().resolve()
    if not (path / "config.json").is_file():
        return str(path)
    from eyas.hf_target import serving_folder

    return str(serving_folder(path))


def server_command(
    model_dir: str | Path, port: int, *, device: str = "auto", trust_remote_code: bool = False,
    dtype: str = "auto", continuous_batching: bool = False,
) -> list[str]:
    """The argv that starts ``transformers serve`` for `model_dir` on 127.0.0.1:`port`.

    `trust_remote_code` lets the server run the model folder's own Python code (a
    tiktoken tokenizer class such as Kimi's). `dtype` other than "auto" is passed as
    ``--dtype``; `continuous_batching` adds ``--continuous-batching`` (requests in flight
    decode together; ``generation.server_continuous_batching``).
    """
    return [
        sys.executable, "-m", "transformers.cli.transformers", "serve", served_model_name(model_dir),
        "--host", "127.0.0.1", "--port", str(port), "--device", device, "--log-level", "info",
    ] + (["--dtype", dtype] if dtype != "auto" else []) + (
        ["--continuous-batching"] if continuous_batching else []
    ) + (["--trust-remote-code"] if trust_remote_code else [])


def _log_tail(log_path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(log is empty)"


@contextlib.contextmanager
def launch_server(
    model_dir: str | Path,
    *,
    port: int | None = None,
    log_path: Path | None = None,
    device: str = "auto",
    startup_timeout_s: float = 300.0,
    trust_remote_code: bool = False,
    dtype: str = "auto",
    continuous_batching: bool = False,
) -> Iterator[str]:
    """Run ``transformers serve`` for `model_dir` on 127.0.0.1 while the block runs.

    A multimodal wrapper's folder (Kimi-K2.5's layout) is served through its flat text view
    (`eyas.hf_target.ensure_serving_folder`). Yields the base URL, ``http://127.0.0.1:PORT/v1``. `port` defaults to a free one. The
    server's stdout and stderr go to `log_path` (default: ``eyas-serve-PORT.log`` in the
    system temp folder); errors name that file and quote its last lines. `trust_remote_code`
    is passed on to the server (``target.trust_remote_code``); `dtype` and
    `continuous_batching` as `server_command` says.

    Raises EyasError when the model folder has no ``config.json``, when the server exits
    before answering or does not answer ``GET /v1/models`` within `startup_timeout_s`;
    the message carries the command and the tail of the log. On exit the whole process
    group is terminated (SIGTERM, then SIGKILL after 10 s). On Linux the server also gets
    SIGTERM when this process dies without running any exit code (SIGKILL, the OOM killer):
    a killed run leaves no server behind. The calling thread must outlive the block (it does:
    the block runs in it).
    """
    model_dir = Path(model_dir).expanduser().resolve()
    if not (model_dir / "config.json").is_file():
        raise EyasError(f"{model_dir}: not a model folder (no config.json) — cannot serve it")
    port = port or free_port()
    if log_path is None:
        import tempfile

        log_path = Path(tempfile.gettempdir()) / f"eyas-serve-{port}.log"
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    from eyas.hf_target import ensure_serving_folder

    cmd = server_command(ensure_serving_folder(model_dir), port, device=device,
                         trust_remote_code=trust_remote_code, dtype=dtype,
                         continuous_batching=continuous_batching)
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_UPDATE_CHECK="1",
               HF_HUB_DISABLE_TELEMETRY="1")
    base_url = f"http://127.0.0.1:{port}/v1"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True, preexec_fn=dies_with_this_process(),
        )
    try:
        _wait_ready(proc, base_url, cmd, log_path, startup_timeout_s)
        yield base_url
    finally:
        stop_group(proc)


def _wait_ready(
    proc: subprocess.Popen, base_url: str, cmd: list[str], log_path: Path, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5.0) as client:
        while True:
            code = proc.poll()
            if code is not None:
                raise EyasError(
                    f"`transformers serve` exited with code {code} before answering.\n"
                    f"command: {' '.join(cmd)}\nlog {log_path} (last lines):\n{_log_tail(log_path)}"
                )
            try:
                if client.get(base_url + "/models").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise EyasError(
                    f"`transformers serve` did not answer {base_url}/models within {timeout_s:.0f} s.\n"
                    f"command: {' '.join(cmd)}\nlog {log_path} (last lines):\n{_log_tail(log_path)}"
                )
            if stopping.wait(0.25):  # a stop while it starts: the caller's block stops it
                stopping.check(f"while `transformers serve` started on {base_url}")
