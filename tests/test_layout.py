"""Where each phase keeps its outputs (eyas.layout): the paths the docs and the probe name."""

from __future__ import annotations

from pathlib import Path

from eyas.layout import SPLITS, RunLayout


def test_paths_of_every_phase():
    run = RunLayout(Path("/data/run"))
    assert run.responses("B1") == Path("/data/run/generated/B1/responses.jsonl")
    assert run.tokenized("B1") == Path("/data/run/prepared/B1/tokenized_data.jsonl")
    assert run.prepared_stats("B1").parent == run.rejects("B1").parent == run.prepared_dir("B1")
    assert (run.train, run.eval, run.merged_stats) == (
        Path("/data/run/merged/train.jsonl"), Path("/data/run/merged/eval.jsonl"),
        Path("/data/run/merged/stats.json"))
    assert [run.hidden_dir(s) for s in SPLITS] == [Path("/data/run/hidden/train"),
                                                   Path("/data/run/hidden/eval")]
    assert run.drafter_dir == Path("/data/run/drafter")


def test_the_probe_script_looks_where_the_layout_writes():
    """`_probe_script.py` runs without eyas on a host, so it names the folders itself: they
    must be the layout's."""
    from eyas.remote import _probe_script

    source = Path(_probe_script.__file__).read_text()
    run = RunLayout(Path("w"))
    for folder in (run.generated_dir("x").parent, run.prepared_dir("x").parent, run.merged_dir,
                   run.hidden_dir().parent, run.drafter_dir):
        assert f'"{folder.name}"' in source, folder.name
