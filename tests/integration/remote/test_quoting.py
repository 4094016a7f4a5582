"""Values from a config, block or command line reach a host safely: each is one word of a
remote shell command (`eyas.remote.hosts.shell_join`: an injected ``python`` runs nothing,
wherever it is used), a malformed ``--host`` and a missing known_hosts file are named as
such."""

from __future__ import annotations

import pytest

from eyas.errors import RemoteError
from eyas.remote.hosts import HostSpec, LocalHost, shell_join


def _host(tmp_path) -> tuple[LocalHost, object]:
    marker = tmp_path / "X"
    spec = HostSpec(kind="local", data_root=str(tmp_path), known_hosts=None,
                    python=f"touch {marker}; python3")
    return LocalHost(spec), marker


def test_shell_join_makes_each_value_one_word(tmp_path):
    host = LocalHost(HostSpec.local(data_root=str(tmp_path)))
    words = ["printf", "%s|", "a b", "$(touch X)", "'", ";", "x\ny"]
    assert host.run(shell_join(*words), cwd=str(tmp_path)).stdout == "a b|$(touch X)|'|;|x\ny|"
    assert not (tmp_path / "X").exists()


def test_an_injected_python_runs_nothing_in_the_status_probe(tmp_path):
    from eyas.remote.probe import probe_workdir

    host, marker = _host(tmp_path)
    with pytest.raises(RemoteError):
        probe_workdir(host, str(tmp_path))
    assert not marker.exists()


def test_an_injected_python_runs_nothing_in_the_host_check(tmp_path):
    from eyas.remote.host_check import probe_host

    host, marker = _host(tmp_path)
    facts = probe_host(host)
    assert facts.python_path is None  # no such program
    assert not marker.exists()


def test_an_injected_python_runs_nothing_when_shipping(tmp_path):
    from eyas.remote.ship import ship

    host, marker = _host(tmp_path)
    with pytest.raises(RemoteError):
        ship(host, venv=str(tmp_path / "venv"), install_deps=False)
    assert not marker.exists()


def test_an_injected_python_runs_nothing_in_serving_probes(tmp_path):
    from eyas.evaluate.serving import _py
    from eyas.evaluate.sglang_server import server_command

    host, marker = _host(tmp_path)
    res = _py(host, host.spec.python, "print(1)", "arg", check=False)
    assert not res.ok and not marker.exists()
    assert server_command(host.spec.python, _any_spec()).startswith(f"'touch {marker}; python3' -m ")


def _any_spec():
    from eyas.evaluate.sglang_server import ServerSpec

    return ServerSpec(model_path="/m", port=30000)


@pytest.mark.parametrize(("text", "want"), [
    ("u@h", ("u", "h", 22)), ("h:2222", (None, "h", 2222)), ("u@10.0.0.5:22", ("u", "10.0.0.5", 22)),
    ("u@[::1]:2222", ("u", "::1", 2222)),
])
def test_host_logins_parse(text, want):
    from eyas.remote.probe import parse_login

    assert parse_login(text) == want


@pytest.mark.parametrize("text", ["u@h:abc", "u@h:0", "u@h:70000", "u@", "u@:22"])
def test_a_malformed_host_login_is_a_clear_error(text, capsys):
    """``eyas status --host u@h:abc`` says what is wrong with --host (was a raw ValueError)."""
    from eyas.cli import main

    assert main(["status", "--workdir", "/w", "--host", text]) == 2
    err = capsys.readouterr().err
    assert "--host" in err and "user@address[:port]" in err and "Traceback" not in err


def test_a_missing_known_hosts_file_is_named_as_missing_not_as_an_unknown_key(tmp_path):
    from eyas.remote.hosts import HostKeyError, open_connection

    spec = HostSpec(host="127.0.0.1", port=9, known_hosts=str(tmp_path / "nope"),
                    data_root="/data")
    with pytest.raises(HostKeyError, match=r"known_hosts file .*nope does not exist"):
        open_connection(spec)
