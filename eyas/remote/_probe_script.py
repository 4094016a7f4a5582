"""Standalone probe of a run's work directory; runs with the HOST's Python (stdlib only).

Invoked as ``python3 -c <this source> WORKDIR CHECK_HASHES [EXPECT_JSON]``; prints one JSON
object. It must not import eyas: the host may have no eyas installed. Its manifest check mirrors
`eyas.manifest.verify_manifest`, its shard check `eyas.extract.store.verify_shard`, and the
settings it expects of a shard `eyas.extract.shards.shard_settings` (tests hold each pair to the
same verdicts).

EXPECT_JSON (optional) holds what the configured extraction would write: ``shard_size``,
``storage``, ``topk``, ``dtype``, ``aux_layers`` (None: the target's default) and ``target`` (the
target folder on this host). With it, a shard that verifies but was made from other records or
with other settings is counted as stale, not complete -- as the extraction itself would judge
it (it extracts such a shard again).

Keys: ``workdir``, ``exists``, ``free_bytes``, ``stray`` (``.tmp-*`` leftovers beside the phase
folders) and ``phases``: ``generated`` / ``prepared`` ({name: output}), ``merged``
({"merged": output} or {}), ``hidden`` ({split: split report}, see `hidden_split`) and
``drafter`` ({"drafter": drafter report} or {}, see `drafter`).
"""

import hashlib
import json
import os
import re
import sys

TMP_PREFIX = ".tmp-"
SHARD_PREFIX = "shard-"
SUMMARY_NAME = "extract_summary.json"
MAX_HEADER = 100 << 20  # a safetensors header larger than this is not one eyas wrote
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")  # eyas.hf_target


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify(folder, check_hashes):
    path = os.path.join(folder, "manifest.json")
    if not os.path.exists(path):
        return None, [folder + ": no manifest.json (output missing or interrupted)"]
    try:
        with open(path, encoding="utf-8") as fh:
            manifest = json.load(fh)
    except (OSError, ValueError) as exc:
        return None, [path + ": unreadable manifest (" + str(exc) + ")"]
    problems = []
    if not manifest.get("complete"):
        problems.append(path + ": not marked complete")
    for name, meta in sorted(manifest.get("outputs", {}).items()):
        p = os.path.join(folder, name)
        if not os.path.exists(p):
            problems.append(p + ": listed in the manifest but missing")
        elif os.path.getsize(p) != meta["bytes"]:
            problems.append(f"{p}: {os.path.getsize(p)} bytes, manifest says {meta['bytes']}")
        elif check_hashes and _sha256(p) != meta["sha256"]:
            problems.append(p + ": checksum differs from the manifest (corrupted?)")
    return manifest, problems


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def output(folder, check_hashes):
    manifest, problems = verify(folder, check_hashes)
    tmp = []
    size = 0
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            p = os.path.join(root, name)
            if name.startswith(TMP_PREFIX) or TMP_PREFIX in root:
                tmp.append(p)
            try:
                size += os.lstat(p).st_size
            except OSError:
                pass
    return {
        "path": folder,
        "complete": not problems,
        "problems": problems,
        "tmp_files": tmp,
        "bytes": size,
        "counts": (manifest or {}).get("counts", {}),
        "stats": _read_json(os.path.join(folder, "stats.json")),
    }


def _walk_bytes(folder):
    size = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                size += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return size


def _safetensors_shapes(path):
    """{tensor: shape} from a safetensors file's header (8-byte length + JSON), read cheaply."""
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        if not 0 < n <= MAX_HEADER:
            raise ValueError("header length " + str(n))
        header = json.loads(fh.read(n))
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


def verify_shard(folder, check_hashes):
    """(shard record or None, problems): the manifest as `verify`, then the shard record and
    the data file's tensor shapes against it (as `eyas.extract.store.verify_shard`)."""
    manifest, problems = shard_manifest(folder, check_hashes)
    return (None if manifest is None else manifest["shard"]), problems


def shard_manifest(folder, check_hashes):
    """(the whole manifest of a shard that verifies, or None; problems): see `verify_shard`."""
    manifest, problems = verify(folder, check_hashes)
    if problems:
        return None, problems
    record = manifest.get("shard")
    if not isinstance(record, dict):
        return None, [os.path.join(folder, "manifest.json") + ": not a hidden-state shard manifest"]
    data = os.path.join(folder, "data.safetensors")
    try:
        shapes = _safetensors_shapes(data)
    except (OSError, ValueError) as exc:
        return None, [data + ": unreadable safetensors file (" + str(exc) + ")"]
    for name, meta in sorted(record.get("tensors", {}).items()):
        if name not in shapes:
            problems.append(f"{data}: tensor {name!r} listed in the manifest but missing")
        elif list(shapes[name]) != list(meta["shape"]):
            problems.append(f"{data}: tensor {name!r} has shape {shapes[name]}, "
                            f"manifest says {meta['shape']}")
    return (None if problems else manifest), problems


# -- what the configured extraction would write (mirrors eyas.extract.shards/target/layers) --
def _text_config(config):
    for key in ("text_config", "language_config", "llm_config"):
        if isinstance(config.get(key), dict) and "num_hidden_layers" in config[key]:
            return config[key]
    return config


def default_aux_layers(num_layers):
    """`eyas.layers.default_aux_layers` (the tests hold the two equal)."""
    ids = [1, num_layers // 2 - 1, num_layers - 4]
    if ids[0] < ids[1] < ids[2] < num_layers:
        return ids
    ids = [0, (num_layers - 1) // 2, num_layers - 2]
    return ids if ids[0] < ids[1] < ids[2] else [0, 1, 2]


def target_fingerprint(model_dir):
    """`eyas.extract.target.target_fingerprint`: config.json bytes, weight names and sizes."""
    with open(os.path.join(model_dir, "config.json"), "rb") as fh:
        h = hashlib.sha256(fh.read())
    weights = sorted(n for n in os.listdir(model_dir)
                     if os.path.isfile(os.path.join(model_dir, n))
                     and os.path.splitext(n)[1] in WEIGHT_SUFFIXES)
    h.update(json.dumps([[n, os.stat(os.path.join(model_dir, n)).st_size]
                         for n in weights]).encode())
    return h.hexdigest()[:16]


_WS = re.compile(r"\s*")
_DECODER = json.JSONDecoder()
_ARRAYS = ("input_ids", "loss_mask")


def _canonical(values):
    return json.dumps(values, separators=(",", ":"))


def record_digest_line(line):
    """The bytes one merged record adds to its shard's content hash, as
    `eyas.extract.shards.record_digest_line` computes them: its id, then its token ids and
    loss mask as compact JSON arrays.

    Walks the record's top-level keys, decoding the small values and taking each array's
    text as it is when it is already compact (eyas writes it so: a 30 KB record is not parsed
    whole: 15x faster than a full parse); anything else falls back to a full parse."""
    try:
        pos = _WS.match(line, 0).end()
        if line[pos] != "{":
            raise ValueError("not an object")
        pos += 1
        found = {}
        while len(found) < 3:
            pos = _WS.match(line, pos).end()
            key, pos = _DECODER.raw_decode(line, pos)
            pos = _WS.match(line, pos).end()
            if line[pos] != ":":
                raise ValueError("expected ':'")
            pos = _WS.match(line, pos + 1).end()
            if key in _ARRAYS:
                if line[pos] != "[":
                    raise ValueError("not an array")
                end = line.index("]", pos) + 1
                text = line[pos:end].encode()
                # Compact non-negative integers (eyas writes them so): already canonical.
                if text.translate(None, b"0123456789,") != b"[]":
                    raise ValueError("not a compact array of integers")
                found[key], pos = text, end
            else:
                value, pos = _DECODER.raw_decode(line, pos)
                if key == "id":
                    found["id"] = str(value)
            pos = _WS.match(line, pos).end()
            if line[pos] != ",":
                break
            pos += 1
        if len(found) == 3:
            return b"\t".join([found["id"].encode(), found["input_ids"], found["loss_mask"]]
                              ) + b"\n"
    except (ValueError, IndexError):
        pass
    obj = json.loads(line)
    return "\t".join([str(obj["id"]), _canonical(obj["input_ids"]),
                      _canonical(obj["loss_mask"])]).encode() + b"\n"


def content_hashes(merged_file, shard_size):
    """{shard index: content hash} of `merged_file` cut into `shard_size` records, as
    `eyas.extract.shards.plan_shards` cuts it (each record's id, token ids and loss mask, in
    file order: `eyas.extract.shards.record_digest_line`)."""
    hashes, h, count = {}, hashlib.sha256(), 0
    with open(merged_file, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            h.update(record_digest_line(line))
            count += 1
            if count % shard_size == 0:
                hashes[count // shard_size - 1] = h.hexdigest()[:16]
                h = hashlib.sha256()
    if count % shard_size:
        hashes[count // shard_size] = h.hexdigest()[:16]
    return hashes


def expected_settings(workdir, expect):
    """({key: value} every shard must have, {split: {index: content hash}}, notes): what of
    `expect` can be known here. A key that cannot be known (target not readable on this host,
    no merged split) is left out, and a note says so."""
    common, notes = {}, []
    for key in ("storage", "topk", "dtype"):
        if key in expect:
            common[key] = expect[key]
    target = expect.get("target")
    try:
        common["target_fingerprint"] = target_fingerprint(target)
        with open(os.path.join(target, "config.json"), encoding="utf-8") as fh:
            layers = _text_config(json.load(fh))["num_hidden_layers"]
        common["aux_layers"] = (list(expect["aux_layers"]) if expect.get("aux_layers") is not None
                                else default_aux_layers(int(layers)))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        if expect.get("aux_layers") is not None:
            common["aux_layers"] = list(expect["aux_layers"])
        notes.append(f"target {target} not readable here ({exc}): shards' target not checked")
    hashes = {}
    for split in ("train", "eval"):
        merged = os.path.join(workdir, "merged", split + ".jsonl")
        if expect.get("shard_size") and os.path.isfile(merged):
            try:
                hashes[split] = content_hashes(merged, int(expect["shard_size"]))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                notes.append(f"{merged}: unreadable ({exc}): shards' records not checked")
    return common, hashes, notes


def _differences(config, expected):
    """The settings in which a shard's recorded `config` differs from `expected`."""
    return [f"{k} {config.get(k)!r}, expected {v!r}" for k, v in sorted(expected.items())
            if config.get(k) != v]


def hidden_split(folder, check_hashes, expected=None):
    """Shards of one split: counts of complete, partial and stale shard folders, their samples,
    tokens and bytes, the problems of the partial and stale ones and the run's summary, if
    written.

    Partial: a ``shard-*`` folder that does not verify, or a ``.tmp-*`` folder (an
    interrupted writer). Stale: a shard that verifies but whose recorded settings differ from
    `expected` ({key: value}, with ``content_hash`` a {shard index: hash} map). Samples and
    tokens count complete shards only.
    """
    expected = expected or {}
    rep = {"path": folder, "shards_complete": 0, "shards_partial": 0, "shards_stale": 0,
           "samples": 0, "tokens": 0, "quarantined": 0, "storage": [], "problems": [],
           "bytes": _walk_bytes(folder), "summary": None}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not os.path.isdir(path):
            continue
        if name.startswith(TMP_PREFIX):
            rep["shards_partial"] += 1
            rep["problems"].append(path + ": interrupted shard (temporary folder; the next "
                                   "extraction deletes it once its writer is gone)")
        elif name.startswith(SHARD_PREFIX):
            manifest, problems = shard_manifest(path, check_hashes)
            if manifest is None:
                rep["shards_partial"] += 1
                rep["problems"].extend(problems)
                continue
            record = manifest["shard"]
            want = {k: v for k, v in expected.items() if k != "content_hash"}
            if "content_hash" in expected:
                try:
                    want["content_hash"] = expected["content_hash"].get(int(name[len(SHARD_PREFIX):]))
                except ValueError:
                    want["content_hash"] = None
            differ = _differences(manifest.get("config") or {}, want)
            if differ:
                rep["shards_stale"] += 1
                rep["problems"].append(path + ": made with other settings or records ("
                                       + "; ".join(differ) + "): extraction will redo it")
                continue
            rep["shards_complete"] += 1
            rep["samples"] += int(record.get("num_samples", 0))
            rep["tokens"] += int(record.get("num_tokens", 0))
            rep["quarantined"] += int(record.get("num_quarantined", 0))
            if record.get("storage") not in rep["storage"]:
                rep["storage"].append(record.get("storage"))
    summary = _read_json(os.path.join(folder, SUMMARY_NAME))
    if isinstance(summary, dict):
        rep["summary"] = {k: summary.get(k) for k in (
            "num_shards", "samples", "tokens", "quarantined", "storage", "hidden_size",
            "estimated_bytes", "actual_bytes")}
    return rep


def drafter(folder, check_hashes):
    """Training outputs: the export verified by its manifest, the checkpoint's step (from its
    small ``meta.json``), whether ``best/`` and ``history.json`` exist, and leftovers."""
    export = os.path.join(folder, "export")
    ck = os.path.join(folder, "checkpoint")
    meta = _read_json(os.path.join(ck, "meta.json"))
    best = _read_json(os.path.join(folder, "best", "metrics.json"))
    rep = {
        "path": folder,
        "bytes": _walk_bytes(folder),
        "export": output(export, check_hashes) if os.path.isdir(export) else None,
        "checkpoint": os.path.isfile(os.path.join(ck, "state.pt")),
        "checkpoint_step": meta.get("step") if isinstance(meta, dict) else None,
        "best": os.path.isdir(os.path.join(folder, "best")),
        "best_metrics": best if isinstance(best, dict) else None,
        "history": os.path.isfile(os.path.join(folder, "history.json")),
        "tmp": [os.path.join(folder, n) for n in sorted(os.listdir(folder))
                if n.startswith(TMP_PREFIX)],
    }
    return rep


def main(workdir, check_hashes, expect=None):
    report = {"workdir": workdir, "exists": os.path.isdir(workdir), "phases": {}, "notes": []}
    for phase in ("generated", "prepared"):
        base = os.path.join(workdir, phase)
        names = sorted(os.listdir(base)) if os.path.isdir(base) else []
        report["phases"][phase] = {
            n: output(os.path.join(base, n), check_hashes)
            for n in names if os.path.isdir(os.path.join(base, n)) and not n.startswith(".")
        }
        report.setdefault("stray", []).extend(
            os.path.join(base, n) for n in names if n.startswith(TMP_PREFIX)
        )
    merged = os.path.join(workdir, "merged")
    report["phases"]["merged"] = (
        {"merged": output(merged, check_hashes)} if os.path.isdir(merged) else {}
    )
    base = os.path.join(workdir, "hidden")
    names = sorted(os.listdir(base)) if os.path.isdir(base) else []
    splits = [n for n in names if os.path.isdir(os.path.join(base, n)) and not n.startswith(".")]
    common, hashes = {}, {}
    if expect is not None and splits:
        common, hashes, report["notes"] = expected_settings(workdir, expect)
    report["phases"]["hidden"] = {
        n: hidden_split(os.path.join(base, n), check_hashes,
                        {**common, **({"content_hash": hashes[n]} if n in hashes else {})})
        for n in splits
    }
    report["stray"].extend(os.path.join(base, n) for n in names if n.startswith(TMP_PREFIX))
    base = os.path.join(workdir, "drafter")
    report["phases"]["drafter"] = (
        {"drafter": drafter(base, check_hashes)} if os.path.isdir(base) else {}
    )
    if os.path.isdir(workdir):
        report["stray"].extend(
            os.path.join(workdir, n) for n in sorted(os.listdir(workdir)) if n.startswith(TMP_PREFIX)
        )
    probe = workdir
    while not os.path.exists(probe):
        probe = os.path.dirname(probe) or "/"
    st = os.statvfs(probe)
    report["free_bytes"] = st.f_bavail * st.f_frsize
    return report


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2] == "1",
                          json.loads(sys.argv[3]) if len(sys.argv) > 3 else None), sort_keys=True))
