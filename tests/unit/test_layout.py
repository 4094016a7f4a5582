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
    assert run.generation_settings("B1") == Path("/data/run/generated/B1/settings.json")
    assert run.merged_manifest == Path("/data/run/merged/manifest.json")
    # What a shard reads and where it writes, on the host that runs it (tasks.extract).
    assert str(run.merged("eval")) == "/data/run/merged/eval.jsonl"
    assert str(run.hidden_dir("train")) == "/data/run/hidden/train"
    assert run.placement("eval") == Path("/data/run/hidden/eval/placement.json")


def test_paths_of_the_drafter_the_evaluation_and_the_reports():
    run = RunLayout(Path("/data/run"))
    d = Path("/data/run/drafter")
    assert (run.checkpoint, run.best, run.export, run.vocab) == (
        d / "checkpoint", d / "best", d / "export", d / "vocab")
    assert (run.history, run.resume_record, run.trained_from) == (
        d / "history.json", d / "settings.json", d / "trained_from.json")
    e = Path("/data/run/evaluate")
    assert (run.report, run.report_html, run.generations, run.evaluated_from) == (
        e / "report.json", e / "report.html", e / "generations.jsonl", e / "evaluated_from.json")
    assert (run.composition_picture, run.training_picture) == (
        Path("/data/run/reports/composition.png"), Path("/data/run/reports/training.png"))


def test_the_trainer_and_the_evaluator_write_the_names_the_layout_reads():
    """The trainer and the evaluator take any output folder, so they name its entries: by the
    layout's names."""
    from eyas.evaluate import run as evaluate_run
    from eyas.train import trainer

    run = RunLayout(Path("w"))
    assert trainer._COMPLETE.keys() == {run.checkpoint.name, run.best.name, run.export.name}
    assert (evaluate_run.REPORT, evaluate_run.HTML, evaluate_run.GENERATIONS) == (
        run.report.name, run.report_html.name, run.generations.name)


def test_the_probe_script_looks_where_the_layout_writes():
    """`_probe_script.py` runs without eyas on a host, so it names the folders itself: they
    must be the layout's."""
    from eyas.remote import _probe_script

    source = Path(_probe_script.__file__).read_text()
    run = RunLayout(Path("w"))
    for folder in (run.generated_dir("x").parent, run.prepared_dir("x").parent, run.merged_dir,
                   run.hidden_dir().parent, run.drafter_dir):
        assert f'"{folder.name}"' in source, folder.name
    for entry in (run.export, run.checkpoint, run.best, run.history):
        assert f'"{entry.name}"' in source, entry.name
