"""Pass 1 of the merge: stream one tokenized file, validate, profile, truncate and route it.

Runs in worker processes (one per input file), so it imports nothing heavy: no pydantic,
no numpy unless a record needs truncating. The token arrays are never turned into Python
lists: msgspec validates each line's JSON and hands the arrays over as raw bytes, which
are checked and counted with C-speed bytes methods (see `_decode`). That is what makes a
merge several times faster than ``json.loads`` on every line.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import orjson

from eyas.errors import DataError
from eyas.outliers import DatasetProfile
from eyas.shuffle import BucketWriter, shuffle_key

SPLITS = ("train", "eval")
"""Split names by the flag routed with each record."""


class _Tokenized(msgspec.Struct):
    """The fields a merge reads; the arrays stay raw JSON bytes (validated, not converted)."""

    input_ids: msgspec.Raw
    loss_mask: msgspec.Raw
    id: str | int | None = None


_DECODER = msgspec.json.Decoder(_Tokenized)
_ID_CHARS = b"0123456789, \t\r\n"
_WS = b" \t\r\n"
_MASK_NOISE = b",[] \t\r\n"
_AT_FIELD = re.compile(r"`\$\.([A-Za-z0-9_]+)")
_MISSING = re.compile(r"missing required field `([A-Za-z0-9_]+)`")


def _json_type(raw: bytes) -> str:
    first = raw[:1]
    return {b"{": "an object", b'"': "a string", b"t": "a boolean", b"f": "a boolean",
            b"n": "null"}.get(first, "a number")


def _decode(raw: bytes, path: Path, lineno: int) -> tuple[Any, bytes, bytes, int, bytes]:
    """Validate one line; return ``(id, input_ids bytes, loss_mask bytes, length, mask digits)``.

    The arrays are checked on their raw bytes: msgspec has already validated the JSON
    syntax, so an array whose characters are only digits, commas and whitespace holds
    non-negative integers, and a mask whose digits are single 0/1 characters is 0/1.
    """
    try:
        rec = _DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        missing = _MISSING.search(msg)
        at = _AT_FIELD.search(msg)
        if missing:
            raise DataError("missing (expected a list)", path=path, line=lineno,
                            field=missing.group(1)) from None
        if at:
            expected = "a string or integer" if at.group(1) == "id" else "a list"
            raise DataError(f"{msg.split(' - at ')[0]} (expected {expected})", path=path,
                            line=lineno, field=at.group(1)) from None
        raise DataError(f"{msg} (expected one JSON object per line)", path=path,
                        line=lineno) from None
    except msgspec.DecodeError as exc:
        raise DataError(f"malformed JSON: {exc}", path=path, line=lineno) from None
    ids = bytes(rec.input_ids)
    mask = bytes(rec.loss_mask)
    if ids[:1] != b"[":
        raise DataError(f"got {_json_type(ids)} (expected a list of token ids)",
                        path=path, line=lineno, field="input_ids")
    if ids.translate(None, _ID_CHARS) != b"[]":
        raise DataError("holds something other than non-negative integers (expected token ids)",
                        path=path, line=lineno, field="input_ids")
    n = ids.count(b",") + 1 if ids.strip(b"[]" + _WS) else 0
    if n == 0:
        raise DataError("is empty (expected at least one token id)",
                        path=path, line=lineno, field="input_ids")
    if mask[:1] != b"[":
        raise DataError(f"got {_json_type(mask)} (expected a list of 0/1)",
                        path=path, line=lineno, field="loss_mask")
    digits = mask.translate(None, _MASK_NOISE)
    m = mask.count(b",") + 1 if digits else 0
    if digits.translate(None, b"01") or m != len(digits) or mask.count(b"[") != 1:
        raise DataError("holds values other than 0 and 1 (expected a list of 0/1)",
                        path=path, line=lineno, field="loss_mask")
    if m != n:
        raise DataError(f"has {m} entries but input_ids has {n} (expected equal lengths)",
                        path=path, line=lineno, field="loss_mask")
    return rec.id, ids, mask, n, digits


def _cut(array: bytes, n: int) -> bytes:
    """The first `n` elements of a flat JSON array of numbers, as JSON bytes."""
    import numpy as np  # only truncated records need it; keeps worker start-up light

    commas = np.flatnonzero(np.frombuffer(array, dtype=np.uint8) == ord(","))
    return array[: commas[n - 1]] + b"]"


# --------------------------------------------------------------------------- one file


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
    buffer_bytes: int = 1 << 18
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
    out: dict = field(default_factory=dict)
    """Per split: records, tokens, supervised_tokens."""


def scan_file(task: ScanTask) -> ScanResult:
    """Stream one file: validate and profile it; with ``task.route`` also route its records.

    Never raises `DataError`: a bad record ends the scan and comes back in
    ``ScanResult.error`` (the caller decides whether it is fatal). Routed records are
    ``{"id", "input_ids", "loss_mask", "dataset"}`` lines whose arrays are the input's own
    bytes (cut at ``max_seq_len`` when longer).
    """
    path = Path(task.path)
    result = ScanResult(name=task.name)
    try:
        if not path.exists():
            raise DataError("file not found (expected the tokenized dataset)", path=path)
        samples = tokens = supervised = max_len = 0
        out = {s: {"records": 0, "tokens": 0, "supervised_tokens": 0} for s in SPLITS}
        hasher = hashlib.sha256()
        name_json = orjson.dumps(task.name)
        limit = task.max_seq_len
        writer = (BucketWriter(Path(task.bucket_dir), task.index, task.buckets, task.buffer_bytes)
                  if task.route else contextlib.nullcontext())
        with open(path, "rb") as fh, writer:
            for lineno, raw in enumerate(fh, start=1):
                hasher.update(raw)
                if raw.isspace():
                    continue
                sid, ids, mask, n, digits = _decode(raw, path, lineno)
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
                    ids, mask, n = _cut(ids, limit), _cut(mask, limit), limit
                elif sup == 0:
                    result.dropped_unsupervised += 1
                    continue
                if sid is None:
                    sid = f"{task.name}-{lineno}"
                key, draw = shuffle_key(task.seed, task.name, sid)
                split = 1 if draw < task.eval_fraction else 0
                writer.add(key, lineno, split, b"".join((
                    b'{"id":', orjson.dumps(sid), b',"input_ids":', ids, b',"loss_mask":', mask,
                    b',"dataset":', name_json, b"}\n",
                )))
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


