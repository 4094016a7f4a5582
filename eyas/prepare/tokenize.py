"""Phase 2: conversations → ``tokenized_data.jsonl`` (``input_ids`` + assistant-only ``loss_mask``).

`tokenize_dataset` writes into `out_dir`, each file atomically, the manifest last:

    tokenized_data.jsonl  one {"id", "input_ids", "loss_mask"} per line, in input order
    rejects.jsonl         only when records were rejected (on_bad_record: reject)
    stats.json            samples, tokens, mean_len, max_len, supervised_tokens,
                          supervised_fraction, rejected, rejected_reasons ({reason: count},
                          `eyas.prepare.rejects`), cut_answers (samples with an answer cut
                          at max_tokens), cut_answer_share (of the samples seen),
                          cut_answers_dropped (those left out: cut_answers "drop", or
                          nothing of them left to train), final_turn (the mode used),
                          reasoning_tokens / reasoning_supervised (the target's reasoning,
                          all turns), final_reasoning_tokens / final_reasoning_supervised
                          and their fraction (final turns), reasoning_undertrained (under 90%)
    manifest.json         inputs' hashes, outputs' sizes and hashes, config, counts

Rejected records: a conversation whose assistant content or reasoning spells one of the
chat template's special tokens (`eyas.prepare.special_text`: a server without its
parsers) is bad like a malformed one. With ``on_bad_record: reject`` a dataset whose rejected
share passes ``max_rejected_share`` fails (a DataError naming the share, the top reasons and
the rejects file, which is kept).

A folder whose manifest is missing or does not verify is partial by definition: any old
manifest is removed before the first byte is written, so an interrupted run never leaves a
folder that looks complete.

Work is spread over ``cfg.num_proc`` worker processes (spawned, each loading the tokenizer
once); batches of ``cfg.batch_size`` records are handed out with a bounded number in flight and
collected in submission order, so the output is the same for any ``num_proc``.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import multiprocessing
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from eyas import stopping
from eyas.conversation import Conversation
from eyas.errors import DataError
from eyas.hf import transformers_names
from eyas.io import AtomicJsonlWriter, dumps_line, write_json
from eyas.manifest import MANIFEST_NAME, write_manifest
from eyas.prepare.config import TokenizeConfig
from eyas.prepare.loss_mask import (
    REASONING_KEYS,
    TemplateError,
    cached_probe,
    final_turn_mode,
    mask_from_offsets,
    reasoning_counts,
    render_with_spans,
)
from eyas.prepare.offsets import encode_with_offsets, supports_offsets
from eyas.prepare.rejects import RejectTally, check_rejected_share
from eyas.prepare.sources import TokenizedRecord, count_dropped_turns
from eyas.prepare.special_text import template_markers
from eyas.proc import exit_with_parent

TOKENIZED_NAME = "tokenized_data.jsonl"
REJECTS_NAME = "rejects.jsonl"
STATS_NAME = "stats.json"

Item = Conversation | TokenizedRecord | DataError

MIN_FINAL_REASONING_SUPERVISED = 0.9
"""Below this share of its final turns' reasoning tokens supervised, a dataset is flagged
(``reasoning_undertrained``) and a warning logged: the drafter would not learn the thinking
that makes most of a thinking target's output."""

log = logging.getLogger(__name__)


def load_tokenizer(
    tokenizer_dir: Path | str, *, trust_remote_code: bool = False, chat_template: str | None = None
) -> Any:
    """Load a tokenizer from a local folder (offline) and check it can be masked.

    The fast version is preferred; a slow one is accepted when it wraps a tiktoken encoding
    (Kimi's class, loaded with `trust_remote_code`; see `eyas.prepare.offsets`). Raises
    TemplateError for any other slow tokenizer or one without any chat template.
    """
    (AutoTokenizer,) = transformers_names("AutoTokenizer")

    tok = AutoTokenizer.from_pretrained(
        str(tokenizer_dir), trust_remote_code=trust_remote_code, use_fast=True
    )
    if not supports_offsets(tok):
        raise TemplateError(
            f"{tokenizer_dir}: {type(tok).__name__} is a slow tokenizer that neither reports "
            "character offsets nor wraps a tiktoken encoding; eyas needs one of the two (a "
            "tokenizer.json, or a tiktoken-based class) to build loss masks"
        )
    if chat_template is None and not tok.chat_template:
        raise TemplateError(
            f"{tokenizer_dir}: the tokenizer has no chat template; set target.chat_template"
        )
    return tok


_TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
_TOKENIZER_SUFFIXES = {".py", ".model", ".tiktoken"}  # remote code and tiktoken ranks


def tokenizer_files(tokenizer_dir: Path | str) -> dict[str, Path]:
    """The files of a tokenizer folder that decide its ids and template, by name.

    The usual ``tokenizer.json`` / ``tokenizer_config.json`` / ``chat_template.jinja``, plus
    the Python code and ranks file of a ``trust_remote_code`` tokenizer (Kimi's
    ``tokenization_kimi.py`` and ``tiktoken.model``): a change to any of them means other ids.
    """
    folder = Path(tokenizer_dir)
    return {
        p.name: p
        for p in sorted(folder.iterdir())
        if p.is_file() and (p.name in _TOKENIZER_FILES or p.suffix in _TOKENIZER_SUFFIXES)
    }


def read_chat_template(path: Path | str) -> str:
    """The text of a jinja chat-template file."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError("chat template file not found", path=path) from None


# ----------------------------------------------------------------------------- worker side

_WORKER: dict[str, Any] = {}
"""A pool worker's state (`_worker_state`), loaded once per worker process."""


def _init_pool_worker(parent_pid: int, *init_args: Any) -> None:
    """A pool worker: ends with the process that started it (`exit_with_parent`), then loads."""
    exit_with_parent(parent_pid)
    _WORKER.update(_worker_state(*init_args))


def _worker_state(
    tokenizer_dir: str, trust_remote_code: bool, chat_template: str | None, train_on_reasoning: bool,
    cut_answers: str = "unsupervised_end", final_turn: str = "auto",
) -> dict[str, Any]:
    """What `_process_batch` works with: a tokenizer of its own and the settings. A call
    tokenizing in its own process (one batch, or ``num_proc: 1``) keeps it to itself: a flow
    tokenizes its datasets at once in threads, and a tokenizer is not shared between them."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    tok = load_tokenizer(
        tokenizer_dir, trust_remote_code=trust_remote_code, chat_template=chat_template
    )
    return dict(
        tok=tok,
        probe=cached_probe(tok, chat_template),
        vocab_size=len(tok),
        chat_template=chat_template,
        train_on_reasoning=train_on_reasoning,
        cut_answers=cut_answers,
        final_turn=final_turn,
        special_text=template_markers(tok, chat_template),
    )


def _reject(item: Conversation | TokenizedRecord, err: DataError) -> tuple:
    record = item.to_json()
    return ("bad", record, err.as_reject())


def _check_ids(rec: TokenizedRecord, vocab_size: int) -> None:
    for i, t in enumerate(rec.input_ids):
        if t >= vocab_size:
            raise DataError(
                f"sample {rec.id!r}: token id {t} at position {i} is outside the tokenizer's "
                f"vocabulary (size {vocab_size})",
                path=rec.path,
                line=rec.line,
                field="input_ids",
            )


def _process_batch(batch: list[Conversation | TokenizedRecord],
                   state: dict[str, Any] | None = None) -> list[tuple]:
    """Tokenize one batch with `state` (`_worker_state`; a pool worker's own by default);
    outcomes in batch order.

    ``("ok", jsonl_line_bytes, n_tokens, n_supervised, cut, reasoning)`` (`reasoning`: the
    sample's `reasoning_counts`, None for a pre-tokenized record), ``("cut-dropped",)`` (an
    answer cut at max_tokens, with ``cut_answers: drop`` or with nothing left to train) or
    ``("bad", record, error_dict)``.
    """
    w = _WORKER if state is None else state
    tok = w["tok"]
    outcomes: list[tuple | None] = [None] * len(batch)
    texts: list[str] = []
    pending: list[tuple[int, Conversation, list[tuple[int, int]]]] = []
    for k, item in enumerate(batch):
        try:
            if isinstance(item, TokenizedRecord):
                _check_ids(item, w["vocab_size"])
                outcomes[k] = (
                    "ok",
                    dumps_line(item.to_json()),
                    len(item.input_ids),
                    sum(item.loss_mask),
                    False,
                    None,
                )
                continue
            if item.truncated and w["cut_answers"] == "drop":
                outcomes[k] = ("cut-dropped",)
                continue
            spelled = w["special_text"].check(item)
            if spelled is not None:
                raise spelled
            rendered = render_with_spans(
                tok,
                item,
                train_on_reasoning=w["train_on_reasoning"],
                chat_template=w["chat_template"],
                probe=w["probe"],
                supervise_truncated_end=w["cut_answers"] == "keep",
                final_turn=w["final_turn"],
            )
        except DataError as err:
            outcomes[k] = _reject(item, err)
            continue
        texts.append(rendered.text)
        pending.append((k, item, rendered))
    if texts:
        for (k, conv, rendered), (ids, offsets) in zip(
            pending, encode_with_offsets(tok, texts), strict=True
        ):
            mask = mask_from_offsets(offsets, rendered.spans)
            n_sup = sum(mask)
            if n_sup == 0 and conv.truncated:
                outcomes[k] = ("cut-dropped",)  # cut before it wrote anything trained
                continue
            if n_sup == 0:
                err = DataError(
                    f"sample {conv.id!r}: the loss mask is empty",
                    path=conv.meta.get("path"),
                    line=conv.meta.get("line"),
                )
                outcomes[k] = _reject(conv, err)
                continue
            line = dumps_line({"id": conv.id, "input_ids": list(ids), "loss_mask": mask})
            outcomes[k] = ("ok", line, len(ids), n_sup, conv.truncated,
                           reasoning_counts(tok, rendered, offsets, mask))
    return outcomes  # type: ignore[return-value]


# ----------------------------------------------------------------------------- driver side


def _batches(items: Iterable[Item], size: int) -> Iterator[list[Item]]:
    batch: list[Item] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _run_batches(
    items: Iterable[Item],
    *,
    cfg: TokenizeConfig,
    init_args: tuple,
) -> Iterator[tuple]:
    """Outcomes for every item in input order; source-level DataErrors pass through as
    ``("bad", None, error_dict)`` after being raised in error mode by the caller."""

    def split(batch: list[Item]) -> tuple[list[Item], list]:
        work = [x for x in batch if not isinstance(x, DataError)]
        return batch, work

    def merge(batch: list[Item], outcomes: list[tuple]) -> Iterator[tuple]:
        it = iter(outcomes)
        for x in batch:
            if isinstance(x, DataError):
                yield ("source-bad", None, x)
            else:
                yield next(it)

    batches = _batches(items, cfg.batch_size)
    ahead = list(itertools.islice(batches, 2 if cfg.num_proc > 1 else 1))
    if len(ahead) < 2:
        # One process asked for, or the whole input is one batch: it is tokenized here.
        # Worker processes would take longer to start (each imports the tokenizer: seconds)
        # than a batch takes, and only one of them could have work.
        state = _worker_state(*init_args)
        for batch in itertools.chain(ahead, batches):
            batch, work = split(batch)
            yield from merge(batch, _process_batch(work, state) if work else [])
        return

    ctx = multiprocessing.get_context("spawn")
    max_in_flight = 2 * cfg.num_proc
    with ctx.Pool(cfg.num_proc, initializer=_init_pool_worker,
                  initargs=(os.getpid(), *init_args)) as pool:
        queue: collections.deque = collections.deque()
        try:
            for batch in itertools.chain(ahead, batches):
                batch, work = split(batch)
                queue.append((batch, pool.apply_async(_process_batch, (work,))))
                while len(queue) >= max_in_flight:
                    done_batch, res = queue.popleft()
                    yield from merge(done_batch, res.get())
            while queue:
                done_batch, res = queue.popleft()
                yield from merge(done_batch, res.get())
        finally:
            pool.terminate()


def tokenize_dataset(
    records: Iterable[Item],
    out_dir: Path,
    *,
    tokenizer_dir: Path,
    cfg: TokenizeConfig,
    trust_remote_code: bool = False,
    chat_template: str | None = None,
    source_label: str = "",
) -> dict:
    """Tokenize `records` into `out_dir` (see the module docstring for the files); return stats.

    `records` are Conversations (rendered with the chat template and masked, see
    `eyas.prepare.loss_mask`), TokenizedRecords (validated: every id below the tokenizer's vocabulary
    size, then passed through) or DataErrors yielded by ``iter_records(on_error="yield")``.
    `chat_template` is template *text* replacing the tokenizer's own (see
    `read_chat_template`). With ``cfg.on_bad_record == "error"`` the first bad record raises
    its DataError (file, line, field) and no output is committed; with ``"reject"`` it goes to
    ``rejects.jsonl`` with its error and is counted per reason, and more than
    ``cfg.max_rejected_share`` rejected is a DataError (the rejects file kept). A conversation with an answer cut at
    ``max_tokens`` is counted (``cut_answers``) and treated as ``cfg.cut_answers`` says (see
    `eyas.config.TokenizeConfig`). Zero surviving samples is a DataError.
    """
    out_dir = Path(out_dir)
    tokenizer_dir = Path(tokenizer_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        (out_dir / MANIFEST_NAME).unlink()

    # Fail fast (before any worker starts) on a bad tokenizer or template.
    tok = load_tokenizer(
        tokenizer_dir, trust_remote_code=trust_remote_code, chat_template=chat_template
    )
    probe = cached_probe(tok, chat_template)
    vocab_size = len(tok)
    del tok

    final_turn = final_turn_mode(cfg.final_turn, probe)
    init_args = (str(tokenizer_dir), trust_remote_code, chat_template, cfg.train_on_reasoning,
                 cfg.cut_answers, final_turn)
    reject_mode = cfg.on_bad_record == "reject"
    dropped: dict[str, int] = {}
    records = count_dropped_turns(records, dropped)
    samples = tokens = supervised = max_len = rejected = cut = cut_dropped = 0
    reasoning = dict.fromkeys(REASONING_KEYS, 0)
    tally = RejectTally()
    rejects_path = out_dir / REJECTS_NAME
    rejects = AtomicJsonlWriter(rejects_path) if reject_mode else None
    keep_rejects = False
    try:
        with AtomicJsonlWriter(out_dir / TOKENIZED_NAME) as out:
            for outcome in _run_batches(records, cfg=cfg, init_args=init_args):
                # A stop (SIGTERM, Ctrl-C: `eyas.stopping`) ends the dataset here: its file
                # stays a temporary one (dropped), the rerun tokenizes it again.
                stopping.check(f"tokenizing {out_dir.name} stopped (not written; the rerun "
                               "tokenizes it again)")
                kind = outcome[0]
                if kind == "ok":
                    _, line, n_tok, n_sup, was_cut, counts = outcome
                    for key, n in (counts or {}).items():
                        reasoning[key] += n
                    out.write_raw(line)
                    samples += 1
                    tokens += n_tok
                    supervised += n_sup
                    max_len = max(max_len, n_tok)
                    cut += was_cut
                    continue
                if kind == "cut-dropped":
                    cut += 1
                    cut_dropped += 1
                    continue
                if kind == "source-bad":
                    err: DataError = outcome[2]
                    record = None
                else:
                    record, info = outcome[1], outcome[2]
                    err = DataError(
                        info["error"], path=info["path"], line=info["line"], field=info["field"],
                        kind=info.get("kind"),
                    )
                if not reject_mode:
                    raise err
                rejected += 1
                reason = tally.add(err.as_reject())
                assert rejects is not None
                rejects.write({"record": record, **err.as_reject(), "reason": reason})
            if samples == 0:
                keep_rejects = True
                raise DataError(
                    f"no sample survived tokenization ({rejected} rejected"
                    + (f", see {rejects_path}" if rejected else "")
                    + (f", {cut_dropped} cut at max_tokens and dropped" if cut_dropped else "")
                    + ")",
                    path=source_label or None,
                )
            keep_rejects = True  # over the share: the error points at the rejects file
            check_rejected_share(dataset=out_dir.name, tally=tally,
                                 seen=samples + rejected + cut_dropped,
                                 max_share=cfg.max_rejected_share, rejects_path=rejects_path,
                                 source=source_label or None)
            keep_rejects = False
    except BaseException:
        if rejects is not None:
            if keep_rejects:
                rejects.commit()  # every record was bad: keep the evidence
            else:
                rejects.abort()
        raise
    if rejects is not None and rejected:
        rejects.commit()
    else:
        if rejects is not None:
            rejects.abort()
        with contextlib.suppress(FileNotFoundError):
            rejects_path.unlink()  # a stale file from an earlier run

    stats = {
        "samples": samples,
        "tokens": tokens,
        "mean_len": tokens / samples,
        "max_len": max_len,
        "supervised_tokens": supervised,
        "supervised_fraction": supervised / tokens if tokens else 0.0,
        "rejected": rejected,
        "rejected_reasons": tally.as_dict(),
        "cut_answers": cut,
        "cut_answer_share": cut / (samples + cut_dropped) if samples + cut_dropped else 0.0,
        "cut_answers_dropped": cut_dropped,
        "trimmed_conversations": dropped.get("trimmed_conversations", 0),
        "trimmed_turns": dropped.get("trimmed_turns", 0),
        # Only with datasets[].max_user_turns: stats of earlier runs keep their keys.
        **{k: v for k, v in dropped.items() if k.startswith("capped_")},
        **_reasoning_stats(reasoning, final_turn, cfg.train_on_reasoning, source_label),
    }
    write_json(out_dir / STATS_NAME, stats)
    outputs = [TOKENIZED_NAME, STATS_NAME] + ([REJECTS_NAME] if rejected else [])
    inputs = {f"tokenizer/{name}": p for name, p in tokenizer_files(tokenizer_dir).items()}
    write_manifest(
        out_dir,
        phase="tokenize",
        inputs=inputs,
        outputs=outputs,
        config={
            "source": source_label,
            "tokenizer_dir": str(tokenizer_dir),
            "tokenize": cfg.model_dump(),
            "chat_template_override": chat_template,
            "end_of_turn": probe.end_of_turn,
            "assistant_header": probe.header,
            "vocab_size": vocab_size,
        },
        counts=stats,
    )
    return stats


def _reasoning_stats(counts: dict[str, int], final_turn: str, train_on_reasoning: bool,
                     source_label: str) -> dict[str, Any]:
    """The reasoning part of ``stats.json``; logs a warning for a thinking dataset whose final
    turns' reasoning is supervised under `MIN_FINAL_REASONING_SUPERVISED` (only when
    `train_on_reasoning` asks for it to be trained)."""
    total = counts["final_reasoning_tokens"]
    fraction = counts["final_reasoning_supervised"] / total if total else None
    undertrained = bool(train_on_reasoning and fraction is not None
                        and fraction < MIN_FINAL_REASONING_SUPERVISED)
    if undertrained:
        log.warning(
            "%s: only %.1f%% of the final turns' reasoning is supervised (%d of %d tokens the "
            "target generated; tokenize.final_turn is %s): the drafter will not learn most of "
            "what a thinking target writes. Use tokenize.final_turn: as_generated, or a chat "
            "template whose generation prompt opens the thought.",
            source_label or "dataset", 100 * fraction, counts["final_reasoning_supervised"],
            total, final_turn)
    return {"final_turn": final_turn, **counts,
            "final_reasoning_supervised_fraction": fraction,
            "reasoning_undertrained": undertrained}
