"""Artifacts of a data-preparation run: a table, a markdown summary, a picture."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

from eyas.layout import RunLayout
from eyas.prepare.report import (
    composition_picture,
    cut_answer_lines,
    dataset_rows,
    markdown_summary,
    reasoning_lines,
)
from tasks.artifacts import artifact_key


def publish_prepare_report(
    run_name: str, tokenized: dict[str, dict[str, Any]], merge_stats: dict[str, Any] | None,
    workdir: Path, cut_answers_policy: str | None = None,
) -> Path:
    """Create the run's artifacts and return the composition picture's path.

    The PNG is written beside the merged data and embedded in the markdown artifact
    (Prefect's image artifacts only take public URLs); the text chart in the same
    artifact reads without it.
    """
    rows = dataset_rows(tokenized, merge_stats)
    key = artifact_key(run_name)[:40]
    create_table_artifact(rows, key=f"{key}-datasets", description="Per-dataset statistics (phase 2) and share of the merge")
    picture = composition_picture(rows, RunLayout(workdir).composition_picture)
    b64 = base64.b64encode(picture.read_bytes()).decode()
    md = markdown_summary(run_name, rows, merge_stats,
                          cut_answer_lines(tokenized, cut_answers_policy),
                          reasoning_lines(tokenized))
    md += f"\n![dataset composition](data:image/png;base64,{b64})\n\nPicture file: `{picture}`\n"
    create_markdown_artifact(md, key=f"{key}-summary", description="Data preparation summary")
    create_link_artifact(picture.resolve().as_uri(), link_text="composition.png", key=f"{key}-composition",
                         description="Dataset composition picture (file on the flow's host)")
    return picture
