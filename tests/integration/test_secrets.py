"""The phase-1 API key: Prefect Secret block first, then the environment; never in the open."""

import pytest

from eyas.config import GenerationConfig
from eyas.errors import ConfigError
from tasks.secrets import resolve_api_key


def test_environment_variable(monkeypatch):
    monkeypatch.setenv("MY_ROUTER_KEY", "sk-env")
    assert resolve_api_key(GenerationConfig(api_key_env="MY_ROUTER_KEY")) == "sk-env"
    monkeypatch.delenv("MY_ROUTER_KEY")
    assert resolve_api_key(GenerationConfig(api_key_env="MY_ROUTER_KEY")) is None


def test_secret_block_wins_and_a_missing_block_is_named(monkeypatch, prefect_harness):
    from prefect.blocks.system import Secret

    Secret(value="sk-block").save("eyas-test-key", overwrite=True)
    monkeypatch.setenv("EYAS_API_KEY", "sk-env")
    assert resolve_api_key(GenerationConfig(api_key_block="eyas-test-key")) == "sk-block"
    with pytest.raises(ConfigError, match="no-such-block") as err:
        resolve_api_key(GenerationConfig(api_key_block="no-such-block"))
    assert "sk-" not in str(err.value)


def test_cli_secret_set_reads_stdin(monkeypatch, prefect_harness, capsys):
    import io

    from prefect.blocks.system import Secret

    from eyas.cli import main

    monkeypatch.setattr("sys.stdin", io.StringIO("sk-from-stdin\n"))
    assert main(["secret", "set", "eyas-cli-key"]) == 0
    assert Secret.load("eyas-cli-key").get() == "sk-from-stdin"
    assert "sk-from-stdin" not in capsys.readouterr().out
