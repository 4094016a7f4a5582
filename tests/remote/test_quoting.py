"""Values from a config or block go into remote shell commands as one word each
(`eyas.remote.hosts.shell_join`): an injected ``python`` runs nothing, wherever it is used."""

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
