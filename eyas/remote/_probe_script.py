"""Standalone probe of a run's work directory; runs with the HOST's Python (stdlib only).

Invoked as ``python3 -c <this source> WORKDIR CHECK_HASHES``; prints one JSON object. It must
not import eyas: the host may have no eyas installed. Its manifest check mirrors
`eyas.manifest.verify_manifest` (a test holds the two to the same verdicts).
"""

import hashlib
import json
import os
import sys

TMP_PREFIX = ".tmp-"


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
