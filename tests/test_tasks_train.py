"""How the train task builds the remote training command (no host needed)."""

from eyas.config import parse_config
from eyas.remote.hosts import HostSpec
from tasks.train import _train_command


def _cfg(trust: bool):
    return parse_config({"name": "t", "target": {"model": "/models/kimi", "trust_remote_code": trust},
                         "datasets": [{"name": "a", "source": "a.jsonl"}],
                         "extract": {"aux_layers": [1, 29, 57]}})


def test_online_command_carries_layers_and_remote_code_permission():
    host = HostSpec(host="127.0.0.1", data_root="/data", known_hosts=None)
    cmd = _train_command(host, _cfg(True), "/data/run", "online", "/models/kimi", "/data/run/t.yaml", True)
    assert "--train-jsonl /data/run/merged/train.jsonl" in cmd and "--eval-jsonl" in cmd
    assert "--aux-layers 1,29,57" in cmd and cmd.endswith("--trust-remote-code")
    cmd = _train_command(host, _cfg(False), "/data/run", "offline", "/models/kimi", "/data/run/t.yaml", False)
    assert "--shards /data/run/hidden/train" in cmd
    assert "--eval-shards" not in cmd and "--trust-remote-code" not in cmd
