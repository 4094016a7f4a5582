"""Read a registry dataset into `Conversation`s or pre-tokenized records.

One entry point, `iter_records(ds, path)`, reads every supported container:

- JSONL (one object per line; line numbers are real),
- JSON (one array of objects; the 1-based element index stands in for the line),
- parquet (through ``datasets.load_dataset("parquet", streaming=True)``: no cache written),
- a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``
  (``datasets.load_from_disk``; `ds.split` picks the split).

Row numbers (1-based) stand in for line numbers outside JSONL. Record shapes:

- OpenAI ``messages`` / SpecForge ``conversations`` with ``role``/``content`` turns;
- ShareGPT ``from``/``value`` turns (human, gpt, system, tool, function_call, ...);
- pre-tokenized ``input_ids`` + ``loss_mask``.

``format: auto`` decides per record: ``input_ids`` → tokenized; turns keyed ``from`` →
ShareGPT; otherwise messages. JSON arrays are streamed element by element with the standard
decoder rather than read by ``datasets``: Arrow schema inference would merge keys across rows
(every turn gains ``tool_calls: None``) and refuse rows whose ``content`` types differ, and we
want to report such rows, not lose them; a file cut off inside an element (the packaged
ShareGPT file) yields its complete elements and then a `TRUNCATED` error.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from eyas.conversation import ROLES, Conversation, Message
from eyas.errors import DataError
from eyas.io import iter_jsonl_items
from eyas.prepare.config import DatasetConfig

SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
    "function_response": "tool",
    "observation": "tool",
    "ipython": "tool",
    "function_call": "assistant",
}
MESSAGE_ROLES = {r: r for r in ROLES} | {"developer": "system", "function": "tool"}


@dataclass
class TokenizedRecord:
    """A pre-tokenized sample: token ids and the matching 0/1 loss mask, with provenance."""

    id: str
    input_ids: list[int]
    loss_mask: list[int]
    path: str | None = None
    line: int | None = None

    def to_json(self) -> dict[str, Any]:
        """``{"id", "input_ids", "loss_mask"}`` as written to ``tokenized_data.jsonl``."""
        return {"id": self.id, "input_ids": self.input_ids, "loss_mask": self.loss_mask}


Record = Conversation | TokenizedRecord


# ----------------------------------------------------------------------------- containers


def iter_rows(path: Path, *, split: str = "train") -> Iterator[tuple[int, dict | DataError]]:
    """Yield ``(line_or_row, object)`` from any supported container.

    A malformed JSONL line is yielded as a DataError (so a caller may reject it and go on);
    a missing, empty or unreadable file raises DataError.
    """
    path = Path(path)
    if not path.exists():
        raise DataError("file not found", path=path)
    if path.is_dir():
        yield from _iter_saved_dataset(path, split)
        return
    if path.stat().st_size == 0:
        raise DataError("file is empty (expected records)", path=path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        yield from _iter_parquet(path)
        return
    if suffix == ".json" and _first_char(path) == "[":
        yield from _iter_json_array(path)
        return
    yield from iter_jsonl_items(path)


def _first_char(path: Path) -> str:
    with open(path, "rb") as fh:
        while chunk := fh.read(4096):
            stripped = chunk.lstrip()
            if stripped:
                return chr(stripped[0])
    return ""


JSON_CHUNK = 1 << 20
"""Bytes read at a time from a JSON array (its records are parsed one by one, streamed)."""
TRUNCATED = "truncated-json"
"""The `DataError.kind` of a JSON array that stops inside a record (ShareGPT's packaged file)."""


class _JsonArrayReader:
    """The elements of a JSON array file, parsed one at a time from a sliding text buffer.

    Memory holds one chunk plus the record being parsed, not the file (ShareGPT's 125 MB);
    `offset` turns a position in the buffer into the file's byte offset.
    """

    def __init__(self, fh: Any) -> None:
        import codecs

        self.fh = fh
        self.utf8 = codecs.getincrementaldecoder("utf-8")()
        self.buf = ""
        self.base = 0
        """Byte offset of ``buf[0]`` in the file."""
        self.eof = False
        self.decoder = json.JSONDecoder()

    def more(self) -> bool:
        """Append the next chunk to the buffer; False at the end of the file."""
        if self.eof:
            return False
        chunk = self.fh.read(JSON_CHUNK)
        self.eof = not chunk
        self.buf += self.utf8.decode(chunk, final=self.eof)
        return not self.eof

    def skip_space(self, pos: int) -> int:
        """The first non-blank position at or after `pos` (reading on), ``len(buf)`` at EOF."""
        while True:
            while pos < len(self.buf) and self.buf[pos] in " \t\r\n":
                pos += 1
            if pos < len(self.buf) or not self.more():
                return pos

    def drop(self, pos: int) -> int:
        """Forget the text before `pos` (counting its bytes); the new position of `pos`."""
        if pos > JSON_CHUNK:
            self.base += len(self.buf[:pos].encode("utf-8"))
            self.buf = self.buf[pos:]
            return 0
        return pos

    def offset(self, pos: int) -> int:
        return self.base + len(self.buf[:pos].encode("utf-8"))

    def decode(self, pos: int) -> tuple[Any, int] | json.JSONDecodeError:
        """The value starting at `pos` and the position after it, reading on while the
        buffer ends inside it; the decoder's error when the file ends first (or it is bad)."""
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, pos)
            except json.JSONDecodeError as exc:
                if self.more():
                    continue
                return exc
            if end < len(self.buf) or not self.more():  # a number may go on in the next chunk
                return value, end


def _iter_json_array(path: Path) -> Iterator[tuple[int, dict | DataError]]:
    """The objects of a JSON array file, streamed, 1-based element index as the line.

    A file that stops inside an element (the array never closed: an interrupted download, a
    truncated copy) yields, after every complete element, one DataError of kind `TRUNCATED`
    naming the byte offset where the broken element starts and how many complete records
    precede it; a caller that rejects bad records keeps those and counts the cut. Other
    malformed JSON after an element is such an error too (nothing after it can be trusted).
    Raises DataError when the file is not a JSON array at all or is not UTF-8.
    """
    size = path.stat().st_size
    with open(path, "rb") as fh:
        reader = _JsonArrayReader(fh)
        try:
            pos = reader.skip_space(0)
            if reader.buf[pos:pos + 1] != "[":
                raise DataError("expected a JSON array of objects", path=path)
            pos += 1
            row = 0
            while True:
                pos = reader.drop(reader.skip_space(pos))
                head = reader.buf[pos:pos + 1]
                if head == "]":
                    rest = reader.skip_space(pos + 1)
                    if rest < len(reader.buf):
                        raise DataError(f"not valid JSON (text after the array's end at byte "
                                        f"{reader.offset(rest):,})", path=path)
                    return
                if row:
                    if head != ",":
                        yield row + 1, _broken(path, reader, pos, row, size,
                                               "expected ',' or ']' between records", None)
                        return
                    pos = reader.skip_space(pos + 1)
                got = reader.decode(pos)
                if isinstance(got, json.JSONDecodeError):
                    yield row + 1, _broken(path, reader, pos, row, size, got.msg, got.pos)
                    return
                obj, pos = got
                row += 1
                if not isinstance(obj, dict):
                    yield row, DataError(f"expected a JSON object, got {type(obj).__name__}",
                                         path=path, line=row)
                else:
                    yield row, obj
        except UnicodeDecodeError as exc:
            raise DataError(f"not UTF-8 text ({exc.reason} near byte "
                            f"{reader.base + exc.start:,})", path=path) from None


def _broken(path: Path, reader: _JsonArrayReader, pos: int, complete: int, size: int,
            why: str, err_pos: int | None) -> DataError:
    """The error for an element that does not parse: a cut (the file ends inside it) or bad
    JSON (it breaks before the end of the file)."""
    offset = reader.offset(pos)
    end = len(reader.buf.rstrip())
    if reader.eof and (err_pos is None and pos >= end or err_pos is not None and (
            err_pos >= end - 1 or why.startswith("Unterminated string"))):
        what = (f"the JSON array is cut off: the record starting at byte {offset:,} of "
                f"{size:,} never ends and the array is not closed")
    else:
        what = f"not valid JSON in the record starting at byte {offset:,} ({why})"
    return DataError(f"{what}; {complete:,} complete records precede it (with "
                     f"tokenize.on_bad_record: reject they are kept and the cut is counted)",
                     path=path, line=complete + 1, kind=TRUNCATED)


def _iter_parquet(path: Path) -> Iterator[tuple[int, dict | DataError]]:
    import datasets

    try:
        ds = datasets.load_dataset("parquet", data_files=str(path), split="train", streaming=True)
        yield from enumerate(ds, start=1)
    except DataError:
        raise
    except Exception as exc:  # pyarrow raises many types for a bad file
        raise DataError(f"cannot read parquet file: {exc}", path=path) from exc


def _iter_saved_dataset(path: Path, split: str) -> Iterator[tuple[int, dict | DataError]]:
    import datasets

    if not ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
        raise DataError(
            "folder is not a datasets.save_to_disk folder (expected dataset_dict.json or "
            "state.json)",
            path=path,
        )
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise DataError(f"cannot load saved dataset: {exc}", path=path) from exc
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataError(
                f"split {split!r} not in the saved DatasetDict (has {sorted(loaded)})",
                path=path,
                field="split",
            )
        loaded = loaded[split]
    yield from enumerate(loaded, start=1)


# ----------------------------------------------------------------------------- records


Shape = Literal["messages", "sharegpt", "tokenized"]


def _turns_key(obj: dict, ds: DatasetConfig) -> str | None:
    if ds.fields.messages:
        return ds.fields.messages if ds.fields.messages in obj else None
    for key in ("messages", "conversations"):
        if obj.get(key) is not None:
            return key
    return None


def detect_shape(obj: dict, ds: DatasetConfig) -> Shape:
    """The record's shape under ``ds.format`` (``auto`` inspects the record)."""
    if ds.format != "auto":
        return ds.format
    if obj.get("input_ids") is not None:
        return "tokenized"
    key = _turns_key(obj, ds)
    turns = obj.get(key) if key else None
    if isinstance(turns, list) and any(
        isinstance(t, dict) and t.get("from") is not None for t in turns
    ):
        return "sharegpt"
    return "messages"


def _text(value: Any, *, path: Path, line: int, field: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in value
    ):
        return "".join(p["text"] for p in value)
    raise DataError(
        f"expected a string (or a list of text parts), got {type(value).__name__}",
        path=path,
        line=line,
        field=field,
    )


def _tool_calls(value: Any, *, path: Path, line: int, field: str) -> list[dict] | None:
    if value is None or value == []:
        return None
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        raise DataError("expected a list of tool-call objects", path=path, line=line, field=field)
    return value


def _parse_turns(
    obj: dict, ds: DatasetConfig, shape: Shape, *, path: Path, line: int
) -> tuple[list[Message], list[dict] | None]:
    key = _turns_key(obj, ds)
    expected_key = ds.fields.messages or "messages' or 'conversations"
    if key is None:
        raise DataError(
            f"no list of turns (expected field '{expected_key}')",
            path=path,
            line=line,
            field=ds.fields.messages or "messages",
        )
    turns = obj[key]
    if not isinstance(turns, list):
        raise DataError(
            f"expected a list of turns, got {type(turns).__name__}", path=path, line=line, field=key
        )
    sharegpt = shape == "sharegpt"
    role_key = ds.fields.role or ("from" if sharegpt else "role")
    content_key = ds.fields.content or ("value" if sharegpt else "content")
    roles = SHAREGPT_ROLES if sharegpt else MESSAGE_ROLES
    messages: list[Message] = []
    for i, turn in enumerate(turns):
        where = f"{key}[{i}]"
        if not isinstance(turn, dict):
            raise DataError(
                f"expected a turn object, got {type(turn).__name__}",
                path=path,
                line=line,
                field=where,
            )
        raw_role = turn.get(role_key)
        if not isinstance(raw_role, str) or raw_role.lower() not in roles:
            raise DataError(
                f"unknown role {raw_role!r} (expected one of {sorted(roles)})",
                path=path,
                line=line,
                field=f"{where}.{role_key}",
            )
        role = roles[raw_role.lower()]
        content = _text(turn.get(content_key), path=path, line=line, field=f"{where}.{content_key}")
        reasoning = turn.get(ds.fields.reasoning)
        if reasoning is not None and not isinstance(reasoning, str):
            raise DataError(
                f"expected a string, got {type(reasoning).__name__}",
                path=path,
                line=line,
                field=f"{where}.{ds.fields.reasoning}",
            )
        calls = _tool_calls(
            turn.get("tool_calls"), path=path, line=line, field=f"{where}.tool_calls"
        )
        if sharegpt and raw_role.lower() == "function_call":
            calls = [_sharegpt_call(content, path=path, line=line, field=f"{where}.{content_key}")]
            content = ""
        messages.append(
            Message(
                role=role, content=content, reasoning_content=reasoning or None, tool_calls=calls
            )
        )
    tools = obj.get("tools")
    if isinstance(tools, str):  # glaive-style datasets keep tools as a JSON string
        try:
            tools = json.loads(tools) if tools.strip() else None
        except json.JSONDecodeError:
            raise DataError(
                "tools is a string but not JSON", path=path, line=line, field="tools"
            ) from None
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise DataError("expected a list of tool objects", path=path, line=line, field="tools")
    return messages, tools or None


def _sharegpt_call(value: str, *, path: Path, line: int, field: str) -> dict:
    try:
        call = json.loads(value)
    except json.JSONDecodeError:
        call = None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise DataError(
            'a function_call turn must hold JSON {"name": ..., "arguments": ...}',
            path=path,
            line=line,
            field=field,
        )
    return {
        "type": "function",
        "function": {"name": call["name"], "arguments": call.get("arguments", {})},
    }


TRIMMED = "trimmed_turns"
"""`Conversation.meta` key: how many turns after the last answer were dropped."""


CAPPED = "capped_user_turns"
"""`Conversation.meta` key: how many user turns past ``max_user_turns`` were dropped."""


def keep_user_turns(conv: Conversation, n: int) -> int:
    """Keep `conv`'s first `n` user turns and what follows each up to the next user turn (its
    answers, tool turns); drop the rest and note in its meta under `CAPPED` how many user
    turns went; return that number (0 when it has `n` or fewer)."""
    users = [i for i, m in enumerate(conv.messages) if m.role == "user"]
    if len(users) <= n:
        return 0
    conv.messages = conv.messages[:users[n]]
    conv.meta[CAPPED] = len(users) - n
    return len(users) - n


def count_dropped_turns(records: Iterable[Any], counts: dict[str, int]) -> Iterator[Any]:
    """`records` as they are (bad records' DataErrors too), adding to `counts` the
    conversations whose unanswered last turns this reader dropped (``trimmed_conversations``,
    ``trimmed_turns``: `trim_to_last_answer`) and those whose user turns past
    ``max_user_turns`` it dropped (``capped_conversations``, ``capped_turns``:
    `keep_user_turns`); a key appears once its count is above 0."""
    for rec in records:
        meta = rec.meta if isinstance(rec, Conversation) else {}
        for key, kind in ((TRIMMED, "trimmed"), (CAPPED, "capped")):
            if meta.get(key, 0):
                counts[f"{kind}_conversations"] = counts.get(f"{kind}_conversations", 0) + 1
                counts[f"{kind}_turns"] = counts.get(f"{kind}_turns", 0) + meta[key]
        yield rec


def trim_to_last_answer(conv: Conversation) -> int:
    """Drop the turns after `conv`'s last assistant turn (a ShareGPT conversation that ends
    with an unanswered user turn keeps what was answered) and note how many in its meta under
    `TRIMMED`; return that number. A conversation without an assistant turn is left as it is
    (`validate_conversation` refuses it)."""
    last = max((i for i, m in enumerate(conv.messages) if m.role == "assistant"), default=None)
    if last is None or last == len(conv.messages) - 1:
        return 0
    dropped = len(conv.messages) - 1 - last
    conv.messages = conv.messages[:last + 1]
    conv.meta[TRIMMED] = dropped
    return dropped


def validate_conversation(
    conv: Conversation, *, require_answer: bool, path: Path | str | None, line: int | None
) -> None:
    """Check a conversation is usable; raise DataError naming file, line and field otherwise.

    Always: at least one turn. With `require_answer` (answers are kept, not regenerated): the
    last turn is an assistant turn with content or tool calls. Without it (prompts to be
    answered again): at least one user turn.
    """
    if not conv.messages:
        raise DataError("empty conversation (no turns)", path=path, line=line, field="messages")
    if require_answer:
        last = conv.messages[-1]
        n = len(conv.messages) - 1
        if last.role != "assistant":
            raise DataError(
                f"the conversation ends with a {last.role!r} turn; expected a final assistant "
                "answer (set regenerate: true to have the target answer it)",
                path=path,
                line=line,
                field=f"messages[{n}].role",
            )
        if not last.content and not last.tool_calls:
            raise DataError(
                "the final assistant turn is empty (expected content or tool calls)",
                path=path,
                line=line,
                field=f"messages[{n}].content",
            )
    elif not any(m.role == "user" for m in conv.messages):
        raise DataError(
            "no user turn: nothing to regenerate an answer for",
            path=path,
            line=line,
            field="messages",
        )


def _int_list(value: Any, *, path: Path, line: int, field: str, binary: bool = False) -> list[int]:
    if not isinstance(value, list | tuple) and not hasattr(value, "tolist"):
        raise DataError(
            f"expected a list of integers, got {type(value).__name__}",
            path=path,
            line=line,
            field=field,
        )
    values = value.tolist() if hasattr(value, "tolist") else list(value)
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise DataError(
                f"item {i} is {v!r}; expected a non-negative integer",
                path=path,
                line=line,
                field=field,
            )
        if binary and v not in (0, 1):
            raise DataError(
                f"item {i} is {v!r}; expected 0 or 1", path=path, line=line, field=field
            )
    return values


def parse_record(obj: dict, ds: DatasetConfig, *, path: Path, line: int) -> Record:
    """One source object → a Conversation or TokenizedRecord (id from ``ds.fields.id`` or
    ``<name>-<line>``). Raises DataError naming file, line and field."""
    raw_id = obj.get(ds.fields.id)
    if raw_id is None or raw_id == "":
        rec_id = f"{ds.name}-{line}"
    elif isinstance(raw_id, str | int):
        rec_id = str(raw_id)
    else:
        raise DataError(
            f"expected a string or integer id, got {type(raw_id).__name__}",
            path=path,
            line=line,
            field=ds.fields.id,
        )
    shape = detect_shape(obj, ds)
    if shape == "tokenized":
        for key in ("input_ids", "loss_mask"):
            if obj.get(key) is None:
                raise DataError(
                    "missing (expected a list of integers)", path=path, line=line, field=key
                )
        ids = _int_list(obj["input_ids"], path=path, line=line, field="input_ids")
        mask = _int_list(obj["loss_mask"], path=path, line=line, field="loss_mask", binary=True)
        if len(ids) != len(mask):
            raise DataError(
                f"has {len(mask)} items but input_ids has {len(ids)} (expected equal lengths)",
                path=path,
                line=line,
                field="loss_mask",
            )
        if not ids:
            raise DataError(
                "empty (expected at least one token)", path=path, line=line, field="input_ids"
            )
        return TokenizedRecord(id=rec_id, input_ids=ids, loss_mask=mask, path=str(path), line=line)
    messages, tools = _parse_turns(obj, ds, shape, path=path, line=line)
    conv = Conversation(
        id=rec_id, messages=messages, tools=tools, meta={"path": str(path), "line": line}
    )
    if ds.max_user_turns is not None:
        keep_user_turns(conv, ds.max_user_turns)
    if not ds.regenerate:
        trim_to_last_answer(conv)
    validate_conversation(conv, require_answer=not ds.regenerate, path=path, line=line)
    return conv


def iter_records(
    ds: DatasetConfig, path: Path, *, on_error: Literal["raise", "yield"] = "raise"
) -> Iterator[Record | DataError]:
    """Records of dataset `ds` read from `path`, in file order, after the first ``ds.skip``
    and at most ``ds.limit`` of them.

    With ``on_error="raise"`` the first bad record raises DataError (file, line, field, what was
    expected); with ``"yield"`` a bad record is yielded as its DataError (counted against the
    limit) and reading goes on. A missing or empty file, or one with no record at all, always
    raises. Duplicate ids are an error naming both lines.
    """
    path = Path(path)
    seen: dict[str, int] = {}
    count = 0
    skipped = 0
    for line, obj in iter_rows(path, split=ds.split):
        if skipped < ds.skip and not (isinstance(obj, DataError) and obj.kind == TRUNCATED):
            skipped += 1
            continue
        if ds.limit is not None and count >= ds.limit:
            break
        count += 1
        try:
            if isinstance(obj, DataError):
                raise obj
            rec = parse_record(obj, ds, path=path, line=line)
            if rec.id in seen:
                raise DataError(
                    f"duplicate id {rec.id!r} (first seen on line {seen[rec.id]})",
                    path=path,
                    line=line,
                    field=ds.fields.id,
                )
            seen[rec.id] = line
        except DataError as err:
            if on_error == "raise":
                raise
            yield err
            continue
        yield rec
    if count == 0:
        raise DataError("no records", path=path)


def read_records(ds: DatasetConfig, path: Path) -> list[Record]:
    """All records of `ds` (raising on the first bad one): for small datasets and tests."""
    return list(_only_records(iter_records(ds, path)))


def _only_records(items: Iterable[Record | DataError]) -> Iterator[Record]:
    for item in items:
        if isinstance(item, DataError):
            raise item
        yield item
