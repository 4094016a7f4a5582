import json

import pytest
from support.paths import REPO

from eyas.cli import main


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


TINY = str(REPO / "recipes" / "tiny-demo.yaml")


def test_check_config_on_a_folder_is_a_clear_error(tmp_path, capsys):
    assert main(["check-config", "--config", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is a folder" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ["extract", "--plan", "--records", "-6", "--tokens", "100"],
    ["extract", "--plan", "--records", "6", "--tokens", "0"],
    ["extract", "--plan", "--records", "6", "--tokens", "100", "--hidden-size", "-1"],
    ["train", "--plan", "--records", "-6", "--tokens", "100"],
])
def test_plans_refuse_counts_below_one(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--config", TINY])
    assert exit_.value.code == 2 and "expected 1 or more" in capsys.readouterr().err


def test_extract_plan_takes_a_builtin_target_for_what_it_is_not_a_path(capsys):
    """``target.model: eyas:tiny`` names the tiny target eyas builds (its hidden size read from
    its config.json), not a folder called ``eyas:tiny`` beside the recipe."""
    from eyas.extract.target import target_shape
    from eyas.tiny import build_tiny_target

    assert main(["extract", "--plan", "--records", "10", "--tokens", "1000", "--config", TINY,
                 "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["hidden_size"] == target_shape(build_tiny_target()).hidden_size


def test_a_workdir_that_is_a_file_is_named_as_such(tmp_path, capsys):
    wd = tmp_path / "run"
    wd.write_text("not a folder")
    assert main(["train", "--config", TINY, "--workdir", str(wd)]) == 2
    assert "is a file; expected the run's folder" in capsys.readouterr().err


def test_a_second_run_on_the_same_workdir_is_refused_naming_the_holder(tmp_path, capsys):
    """One process holds the work directory's lock (a real flock, another process): a second
    run there is refused naming the holder's pid; once the holder dies -- killed, no cleanup
    -- the kernel has released the lock and the folder is free again."""
    import signal
    import subprocess
    import sys

    from eyas.workdir_lock import workdir_lock

    wd = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; from eyas.workdir_lock import workdir_lock\n"
         "with workdir_lock(Path(sys.argv[1]), 'eyas train'):\n"
         "    print('held', flush=True); time.sleep(600)", str(wd)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(["extract", "--config", TINY, "--workdir", str(wd)]) == 2
        err = capsys.readouterr().err
        assert f"pid {holder.pid}: eyas train" in err and "in use by another eyas run" in err
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with workdir_lock(wd, "eyas extract"):  # free again: no stale lock after a kill -9
        pass
