from pathlib import Path

from eyas.cli import main

REPO = Path(__file__).resolve().parent.parent


def test_check_config_ok_and_bad(tmp_path, capsys):
    assert main(["check-config", "--config", str(REPO / "recipes" / "tiny-demo.yaml")]) == 0
    assert "OK" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntarget: {model: m}\ndatasets: [{name: a, source: s, limit: lots}]\n")
    assert main(["check-config", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "datasets.0.limit" in err


def test_prepare_refuses_a_bad_config_before_starting_prefect(tmp_path, capsys):
    assert main(["prepare", "--config", str(tmp_path / "missing.yaml"), "--workdir", str(tmp_path)]) == 2
    assert "config file not found" in capsys.readouterr().err
