"""The merge's record work: validate and route a tokenized file (pass 1), render records (pass 2).

Pass 1 runs in worker processes (one per input file), so this module imports nothing heavy:
no pydantic, no numpy unless a record needs truncating. The token arrays are never turned
into Python lists: msgspec validates each line's JSON and hands the arrays over as raw
bytes, which are checked and counted with C-speed bytes methods (`decode_record`).

Pass 1 routes only a small index entry per record (where the line is, how to render it);
pass 2 reads the lines back by offset, bucket by bucket. A record that needs no change is
written as the input's own bytes with ``,"dataset":...}`` spliced in before its closing
brace; only a truncated record, or one with fields other than ``id``, ``input_ids`` and
``loss_mask``, is rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import orjson

from eyas.errors import DataError
from eyas.layout import SPLITS  # the split flag routed with each record indexes it
from eyas.prepare.outliers import DatasetProfile
from eyas.prepare.shuffle import BucketWriter, shuffle_key

KEEP, REWRITE = 0, 1
"""How pass 2 renders a record: splice the dataset in, or rebuild the line."""

INDEX = struct.Struct("<QIB")
"""A routed index entry: byte offset of the line, bytes to read, render kind."""


class _Strict(msgspec.Struct, forbid_unknown_fields=True):
    """A record with only the fields the output keeps (renderable by splicing)."""

    input_ids: msgspec.Raw
    loss_mask: msgspec.Raw
    id: str | int | None = None


class _Lenient(msgspec.Struct):
    """The fields a merge reads; others are validated as JSON and ignored."""

    input_ids: msgspec.Raw
    loss_mask: msgspec.Raw
    id: str | int | None = None


_STRICT = msgspec.json.Decoder(_Strict)
_LENIENT = msgspec.json.Decoder(_Lenient)
_DIGITS_WS = b"0123456789 \t\r\n"
_WS = b" \t\r\n"
_MASK_NOISE = b",[] \t\r\n"
_AT_FIELD = re.compile(r"`\$\.([A-Za-z0-9_]+)")
_MISSING = re.compile(r"missing required field `([A-Za-z0-9_]+)`")


def _json_type(raw: bytes) -> str:
    return {b"{": "an object", b'"': "a string", b"t": "a boolean", b"f": "a boolean",
            b"n": "null"}.get(raw[:1], "a number")


def _validation_error(exc: msgspec.ValidationError, path: Path, lineno: int) -> DataError:
    msg = str(exc)
    missing = _MISSING.search(msg)
    at = _AT_FIELD.search(msg)
    if missing:
        return DataError("missing (expected a list)", path=path, line=lineno,
                         field=missing.group(1))
    if at:
        expected = "a string or integer" if at.group(1) == "id" else "a list"
        return DataError(f"{msg.split(' - at ')[0]} (expected {expected})", path=path,
                         line=lineno, field=at.group(1))
    return DataError(f"{msg} (expected one JSON object per line)", path=path, line=lineno)


def decode_record(raw: bytes, path: Path, lineno: int) -> tuple[Any, bool, bytes, bytes, int, bytes]:
    """Validate one line; return ``(id, clean, input_ids, loss_mask, length, mask digits)``.

    `clean` is False when the line has fields besides ``id``/``input_ids``/``loss_mask``.
    The arrays come back as their raw JSON bytes and `mask digits` as one ``0``/``1``
    byte per position. msgspec has validated the JSON syntax, so an array whose
    characters are digits, commas and whitespace holds non-negative integers, and a mask
    whose digits are all single ``0``/``1`` characters is a 0/1 list. Raises DataError
    naming the file, line and field.
    """
    clean = True
    try:
        try:
            rec = _STRICT.decode(raw)
        except msgspec.ValidationError as exc:
            if "unknown field" not in str(exc):
                raise
            clean = False
            rec = _LENIENT.decode(raw)
    except msgspec.ValidationError as exc:
        raise _validation_error(exc, path, lineno) from None
    except msgspec.DecodeError as exc:
        raise DataError(f"malformed JSON: {exc}", path=path, line=lineno) from None
    ids = bytes(rec.input_ids)
    mask = bytes(rec.loss_mask)
    if ids[:1] != b"[":
        raise DataError(f"got {_json_type(ids)} (expected a list of token ids)",
                        path=path, line=lineno, field="input_ids")
    commas = ids.translate(None, _DIGITS_WS)  # "[,,,]" for a flat list of integers
    if commas[:1] != b"[" or commas[-1:] != b"]" or commas.count(b",") != len(commas) - 2:
        raise DataError("holds something other than non-negative integers (expected token ids)",
                        path=path, line=lineno, field="input_ids")
    n = len(commas) - 1 if len(commas) > 2 else (1 if ids.strip(b"[]" + _WS) else 0)
    if n == 0:
        raise DataError("is empty (expected at least one token id)",
                        path=path, line=lineno, field="input_ids")
    if mask[:1] != b"[":
        raise DataError(f"got {_json_type(mask)} (expected a list of 0/1)",
                        path=path, line=lineno, field="loss_mask")
    digits = mask.translate(None, _MASK_NOISE)
    m = len(digits)
    # compact "[d,d,...,d]" is recognised without counting; anything else is counted
    compact = len(mask) == 2 * m + 1 and mask[1::2] == digits
    if digits.translate(None, b"01") or not compact and (
        mask.count(b"[") != 1 or (mask.count(b",") + 1 if m else 0) != m
    ):
        raise DataError("holds values other than 0 and 1 (expected a list of 0/1)",
                        path=path, line=lineno, field="loss_mask")
    if m != n:
        raise DataError(f"has {m} entries but input_ids has {n} (expected equal lengths)",
                        path=path, line=lineno, field="loss_mask")
    return rec.id, clean, ids, mask, n, digits


def _cut(array: bytes, n: int) -> bytes:
    """The first `n` elements of a flat JSON array of numbers, as JSON bytes (whole if shorter)."""
    import numpy as np  # only truncated records need it; keeps worker start-up light

    commas = np.flatnonzero(np.frombuffer(array, dtype=np.uint8) == ord(","))
    if len(commas) < n:
        return array
    return array[: commas[n - 1]] + b"]"


def default_id(dataset: str, lineno: int) -> str:
    """The id of a record that has none (as phase 2 names them)."""
    return f"{dataset}-{lineno}"


# --------------------------------------------------------------------------- pass 1


@dataclass
class ScanTask:
    """One input file to scan; `route` False only profiles it (an excluded dataset)."""

    index: int
    """Position in the registry; tags the record's bucket files and breaks key ties."""
    name: str
    path: str
    route: bool
    bucket_dir: str = ""
    buckets: int = 1
    buffer_bytes: int = 1 << 16
    seed: int = 0
    eval_fraction: float = 0.0
    max_seq_len: int = 0


@dataclass
class ScanResult:
    """What a scan found; picklable, so it crosses back from a worker process."""

    name: str
    profile: DatasetProfile | None = None
    sha256: str | None = None
    error: dict | None = None
    """A DataError as a dict (exceptions with keyword arguments do not cross processes)."""
    truncated: int = 0
    dropped_unsupervised: int = 0
    dropped_after_truncation: int = 0
    rewritten: int = 0
    """Records pass 2 rebuilds (truncated, without an id, or carrying extra fields)."""
    out: dict = field(default_factory=dict)
    """Per split: records, tokens, supervised_tokens."""


def scan_file(task: ScanTask) -> ScanResult:
    """Stream one file: validate, hash and profile it; with ``task.route`` also route it.

    Never raises `DataError`: a bad record ends the scan and comes back in
    ``ScanResult.error`` (the caller decides whether it is fatal). Routing writes one
    `INDEX` entry per kept record into the bucket files; samples with no supervised
    token (after truncation) are counted and not routed.
    """
    path = Path(task.path)
    result = ScanResult(name=task.name)
    try:
        if not path.exists():
            raise DataError("file not found (expected the tokenized dataset)", path=path)
        samples = tokens = supervised = max_len = 0
        out = {s: {"records": 0, "tokens": 0, "supervised_tokens": 0} for s in SPLITS}
        hasher = hashlib.sha256()
        limit = task.max_seq_len
        writer = (BucketWriter(Path(task.bucket_dir), task.index, task.buckets, task.buffer_bytes)
                  if task.route else contextlib.nullcontext())
        offset = 0
        with open(path, "rb", buffering=1 << 20) as fh, writer:
            for lineno, raw in enumerate(fh, start=1):
                hasher.update(raw)
                start, offset = offset, offset + len(raw)
                if raw.isspace():
                    continue
                sid, clean, _ids, _mask, n, digits = decode_record(raw, path, lineno)
                sup = digits.count(b"1")
                samples += 1
                tokens += n
                supervised += sup
                max_len = max(max_len, n)
                if not task.route:
                    continue
                if n > limit:
                    result.truncated += 1
                    sup = digits[:limit].count(b"1")
                    if sup == 0:
                        result.dropped_unsupervised += 1
                        result.dropped_after_truncation += 1
                        continue
                    n = limit
                    clean = False
                elif sup == 0:
                    result.dropped_unsupervised += 1
                    continue
                if clean and sid is not None:
                    # bytes up to the closing brace, which pass 2 checks and replaces
                    close = len(raw) - 2 if raw.endswith(b"}\n") else len(raw.rstrip()) - 1
                    kind, length = KEEP, close + 1
                else:
                    result.rewritten += 1
                    kind, length = REWRITE, len(raw)
                key, draw = shuffle_key(task.seed, task.name,
                                        sid if sid is not None else default_id(task.name, lineno))
                split = 1 if draw < task.eval_fraction else 0
                writer.add(key, lineno, split, INDEX.pack(start, length, kind))
                counts = out[SPLITS[split]]
                counts["records"] += 1
                counts["tokens"] += n
                counts["supervised_tokens"] += sup
        if samples == 0:
            raise DataError("holds no records (expected one JSON object per line)", path=path)
        result.profile = DatasetProfile(samples, tokens, supervised, max_len)
        result.sha256 = hasher.hexdigest()
        result.out = out
    except DataError as exc:
        result.error = exc.as_reject()
    return result


# --------------------------------------------------------------------------- pass 2


def render(buf: bytes, kind: int, *, dataset: str, lineno: int, max_seq_len: int,
           path: Path) -> list[bytes | memoryview]:
    """The output line of one routed record, as pieces to write in order.

    `buf` is what pass 1's index entry says to read. Raises DataError when the bytes are
    not what pass 1 saw (the input changed during the merge).
    """
    name = orjson.dumps(dataset)
    if kind == KEEP:
        if buf[-1:] != b"}":
            raise DataError("changed while the merge was running (re-run the merge)",
                            path=path, line=lineno)
        return [memoryview(buf)[:-1], b',"dataset":', name, b"}\n"]
    try:  # validated in pass 1; only the bytes could have changed since
        rec = _LENIENT.decode(buf)
    except msgspec.MsgspecError:
        raise DataError("changed while the merge was running (re-run the merge)",
                        path=path, line=lineno) from None
    ids, mask = bytes(rec.input_ids), bytes(rec.loss_mask)
    if len(ids) > 2 * max_seq_len:  # shorter ones cannot hold more than max_seq_len ids
        ids, mask = _cut(ids, max_seq_len), _cut(mask, max_seq_len)
    sid = rec.id if rec.id is not None else default_id(dataset, lineno)
    return [b'{"id":', orjson.dumps(sid), b',"input_ids":', ids, b',"loss_mask":', mask,
            b',"dataset":', name, b"}\n"]
