"""Standalone probe of a run's work directory; runs with the HOST's Python (stdlib only).

Invoked as ``python3 -c <this source> WORKDIR CHECK_HASHES``; prints one JSON object. It must
not import eyas: the host may have no eyas installed. Its manifest check mirrors
`eyas.manifest.verify_manifest`, and its shard check `eyas.extract.store.verify_shard` (tests
hold each pair to the same verdicts).

Keys: ``workdir``, ``exists``, ``free_bytes``, ``stray`` (``.tmp-*`` leftovers beside the phase
folders) and ``phases``: ``generated`` / ``prepared`` ({name: output}), ``merged``
({"merged": output} or {}), ``hidden`` ({split: split report}, see `hidden_split`) and
``drafter`` ({"drafter": drafter report} or {}, see `drafter`).
"""

import hashlib
import json
import os
import sys

TMP_PREFIX = ".tmp-"
SHARD_PREFIX = "shard-"
SUMMARY_NAME = "extract_summary.json"
MAX_HEADER = 100 << 20  # a safetensors header larger than this is not one eyas wrote


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
    return (None if problems else record), problems


def hidden_split(folder, check_hashes):
    """Shards of one split: counts of complete and partial shard folders, their samples,
    tokens and bytes, the problems of the partial ones and the run's summary, if written.

    Partial: a ``shard-*`` folder that does not verify, or a ``.tmp-*`` folder (an
    interrupted writer). Samples and tokens count complete shards only.
    """
    rep = {"path": folder, "shards_complete": 0, "shards_partial": 0, "samples": 0,
           "tokens": 0, "quarantined": 0, "storage": [], "problems": [],
           "bytes": _walk_bytes(folder), "summary": None}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not os.path.isdir(path):
            continue
        if name.startswith(TMP_PREFIX):
            rep["shards_partial"] += 1
            rep["problems"].append(path + ": interrupted shard (temporary folder)")
        elif name.startswith(SHARD_PREFIX):
            record, problems = verify_shard(path, check_hashes)
            if record is None:
                rep["shards_partial"] += 1
                rep["problems"].extend(problems)
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


def main(workdir, check_hashes):
    report = {"workdir": workdir, "exists": os.path.isdir(workdir), "phases": {}}
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
    report["phases"]["hidden"] = {
        n: hidden_split(os.path.join(base, n), check_hashes)
        for n in names if os.path.isdir(os.path.join(base, n)) and not n.startswith(".")
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
    print(json.dumps(main(sys.argv[1], sys.argv[2] == "1"), sort_keys=True))
