"""eyas.serve: `transformers serve` started, answering, pinned to the folder, and stopped."""

from __future__ import annotations

import json
import os

import httpx
import psutil
import pytest

from eyas.errors import EyasError
from eyas.serve import launch_server, served_model_name, server_command


def _server_children() -> list[psutil.Process]:
    out = []
    for child in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if "transformers.cli.transformers" in " ".join(child.cmdline()):
                out.append(child)
        except psutil.NoSuchProcess:
            pass
    return out


def test_served_model_name_is_the_absolute_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    assert served_model_name("m") == str(tmp_path.resolve() / "m")
    cmd = server_command("m", 8123, device="cpu")
    assert cmd[cmd.index("serve") + 1] == served_model_name("m")
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and "8123" in cmd
    assert "--trust-remote-code" not in cmd
    assert "--trust-remote-code" in server_command("m", 8123, trust_remote_code=True)
    assert "--dtype" not in cmd and "--continuous-batching" not in cmd
    cmd = server_command("m", 8123, dtype="bfloat16", continuous_batching=True)
    assert cmd[cmd.index("--dtype") + 1] == "bfloat16" and "--continuous-batching" in cmd


def test_folder_without_config_is_refused_before_starting(tmp_path):
    with pytest.raises(EyasError, match="no config.json"):
        with launch_server(tmp_path):
            pass
    assert _server_children() == []


@pytest.mark.serve
@pytest.mark.slow
def test_launch_server_answers_is_pinned_and_stops(tmp_path, tiny_target):
    log_path = tmp_path / "serve.log"
    name = served_model_name(tiny_target)
    with launch_server(tiny_target, log_path=log_path, device="cpu") as base_url:
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        assert len(_server_children()) >= 1
        models = httpx.get(base_url + "/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == [name]
        body = {"model": name, "messages": [{"role": "user", "content": "Hello"}],
                "max_tokens": 8, "temperature": 0}
        r = httpx.post(base_url + "/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        data = r.json()
        assert data["choices"][0]["message"]["role"] == "assistant"
        assert 1 <= data["usage"]["completion_tokens"] <= 8
        wrong = httpx.post(base_url + "/chat/completions", json={**body, "model": "other"},
                           timeout=60)
        assert wrong.status_code == 400 and "pinned" in wrong.text
    assert _server_children() == []
    with pytest.raises(httpx.TransportError):
        httpx.get(base_url + "/models", timeout=2)
    assert "Uvicorn running" in log_path.read_text()


@pytest.mark.serve
@pytest.mark.slow
def test_server_that_dies_is_reported_with_its_log_tail(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "no_such_model_type"}))
    with pytest.raises(EyasError, match=r"exited with code \d+ before answering") as info:
        with launch_server(bad, log_path=tmp_path / "serve.log", device="cpu",
                           startup_timeout_s=120):
            pass
    message = str(info.value)
    assert str(tmp_path / "serve.log") in message
    tail = message.split("(last lines):\n", 1)[1]
    assert "Error" in tail  # the server's own exception, quoted from its log
    assert _server_children() == []


@pytest.mark.serve
@pytest.mark.slow
def test_a_run_killed_with_sigkill_leaves_no_server_behind(tmp_path, tiny_target):
    import signal
    import subprocess
    import sys

    script = ("import sys, time\n"
              "from eyas.serve import launch_server\n"
              "with launch_server(sys.argv[1], log_path=sys.argv[2], device='cpu') as url:\n"
              "    print(url, flush=True)\n"
              "    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(tiny_target),
                             str(tmp_path / "serve.log")], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("http://127.0.0.1:")
        servers = [c for c in psutil.Process(proc.pid).children(recursive=True)
                   if "transformers.cli.transformers" in " ".join(c.cmdline())]
        assert servers
    finally:
        proc.send_signal(signal.SIGKILL)  # no exit code runs: no `finally`, no atexit
        proc.wait()
    _, alive = psutil.wait_procs(servers, timeout=30)
    for p in alive:
        p.kill()
    assert not alive, "the server outlived the run that started it"



def _pool_parent_script(tmp_path) -> str:
    script = tmp_path / "pool_parent.py"
    script.write_text(
        "import os, sys, time\n"
        "from concurrent.futures import ProcessPoolExecutor\n"
        "from multiprocessing import get_context\n"
        "from eyas.proc import exit_with_parent\n\n"
        "def pid(_):\n    time.sleep(0.2)\n    return os.getpid()\n\n"
        "if __name__ == '__main__':\n"
        "    tied = sys.argv[1] == 'tied'\n"
        "    pool = ProcessPoolExecutor(2, mp_context=get_context('spawn'),\n"
        "                               initializer=exit_with_parent if tied else None,\n"
        "                               initargs=(os.getpid(),) if tied else ())\n"
        "    print(' '.join(map(str, sorted(set(pool.map(pid, range(8)))))), flush=True)\n"
        "    time.sleep(600)\n")
    return str(script)


@pytest.mark.parametrize("tied", [True, False])
def test_pool_workers_end_with_a_parent_killed_with_sigkill(tmp_path, tied):
    """What merge's and tokenize's spawned pools do: workers started with `exit_with_parent`
    end when their parent is SIGKILLed; without it they stay, blocked on their queue (so the
    test can fail)."""
    import signal
    import subprocess
    import sys

    import psutil

    proc = subprocess.Popen([sys.executable, _pool_parent_script(tmp_path),
                             "tied" if tied else "free"], stdout=subprocess.PIPE, text=True)
    workers = [psutil.Process(int(p)) for p in proc.stdout.readline().split()]
    assert workers
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _, alive = psutil.wait_procs(workers, timeout=10)
    try:
        assert (alive == []) is tied, alive
    finally:
        for p in alive:
            p.kill()
