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


def test_without_prefect_the_hint_installs_from_the_checkout_never_from_an_index(monkeypatch):
    """eyas is not on a package index: `pip install 'eyas[orchestrate]'` would fail, or install
    whatever someone later publishes under that name. No hint or doc may say it."""
    import sys

    import pytest

    from eyas.cli import _need_prefect
    from eyas.errors import EyasError

    monkeypatch.setitem(sys.modules, "prefect", None)  # `import prefect` raises ImportError
    with pytest.raises(EyasError) as exc:
        _need_prefect("pipeline")
    msg = str(exc.value)
    assert "pip install -e '.[orchestrate]'" in msg and "extras=['orchestrate']" in msg
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
                 *sorted((REPO / "eyas").rglob("*.py")), *sorted((REPO / "recipes").glob("*")),
                 *sorted((REPO / "scripts").glob("*"))]:
        text = path.read_text(encoding="utf-8")
        for bad in ("install 'eyas[", 'install "eyas[', "install eyas["):
            assert bad not in text, f"{path.relative_to(REPO)} installs eyas from an index"
