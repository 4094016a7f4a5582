"""Extraction overlap benchmark: SGLangBackend with batch k collected while batch k+1 runs,
against the sequential path, with a stand-in engine of a fixed time per call.

    python benchmarks/extract_overlap.py --quick      # CPU, well under a minute

SGLang needs a GPU, so the engine here is a stand-in: each ``generate`` call takes
``--call-s`` seconds of wall time (a prefill on the GPUs: the thread sleeps, the GIL is free)
and within that time writes the spool files eyas's capture hook writes (one safetensors file a
request: ``aux_hidden`` [t, 3H] and ``final_hidden`` [t, H] in bf16, storage "final"). What
the backend does after each call is the real code: wait for the files, read them back, check
every tensor for NaN/inf, build the samples, delete the files. Sequential: the engine waits
for all of that; overlapped (the default, ``SGLangBackend.overlap``): the next call runs
meanwhile. Both passes extract the same records; the samples are compared equal.

Prints one line per pass and, last, one JSON object with ``sequential_s``, ``overlapped_s``,
``speedup`` (sequential / overlapped), the collection time per batch (what the sequential
engine waits for: sequential time per batch less the call) and the bound
``(call + collect) / max(call, collect)``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from eyas.extract.sglang_backend import SGLangBackend  # noqa: E402
from eyas.extract.sglang_spool import chunk_path, write_chunk  # noqa: E402


class FixedTimeEngine:
    """``sglang.Engine`` stand-in: every call takes `call_s` seconds of wall time and leaves
    the capture hook's file of each request in `spool`. The files are made once beforehand
    (`made`: random bf16 states per record) and hard-linked in: on a GPU host the hook writes
    them from SGLang's own processes during the forward, so their cost is the engine's, not
    this process's."""

    def __init__(self, spool: Path, made: dict[tuple, Path], call_s: float) -> None:
        self.spool, self.made, self.call_s = spool, made, call_s

    def generate(self, *, input_ids, sampling_params, rid):
        t0 = time.monotonic()
        for ids, r in zip(input_ids, rid, strict=True):
            os.link(self.made[tuple(ids)], chunk_path(self.spool, r, 0))
        time.sleep(max(0.0, self.call_s - (time.monotonic() - t0)))
        return [{"meta_info": {"finish_reason": {"type": "length"}}} for _ in rid]

    def shutdown(self) -> None:
        pass


def make_files(folder: Path, recs: list[dict], hidden: int) -> dict[tuple, Path]:
    """One spool file per record, as the hook writes it for storage "final"."""
    folder.mkdir(parents=True)
    made = {}
    for i, r in enumerate(recs):
        g = torch.Generator().manual_seed(i)
        t = len(r["input_ids"])
        path = write_chunk(folder, f"rec{i}", 0, {
            "input_ids": torch.tensor(r["input_ids"], dtype=torch.int32),
            "aux_hidden": torch.randn(t, 3 * hidden, generator=g).to(torch.bfloat16),
            "final_hidden": torch.randn(t, hidden, generator=g).to(torch.bfloat16)})
        made[tuple(r["input_ids"])] = path
    return made


def records(n: int, mean_len: int, vocab: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = max(8, int(rng.gauss(mean_len, mean_len / 4)))
        out.append({"id": f"r{i}", "input_ids": [rng.randrange(vocab) for _ in range(t)],
                    "loss_mask": [1] * t})
    return out


def run(model: Path, work: Path, recs: list[dict], *, made: dict[tuple, Path], call_s: float,
        batch_tokens: int, overlap: bool) -> tuple[float, list[dict], int]:
    backend = SGLangBackend(model, aux_layers=[1, 3, 5], storage="final",
                            spool_root=work / f"spool-{overlap}", overlap=overlap)
    backend.spool.mkdir(parents=True)
    backend._engine = FixedTimeEngine(backend.spool, made, call_s)  # what _start() builds
    t0 = time.perf_counter()
    samples, batches = [], 0
    for batch in backend.extract(recs, batch_tokens):
        samples += batch.samples
        batches += 1
    wall = time.perf_counter() - t0
    backend.close()
    return wall, samples, batches


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer, smaller batches")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--call-s", type=float, default=0.3, help="seconds per engine call")
    p.add_argument("--batch-tokens", type=int, default=8192)
    p.add_argument("--records", type=int, default=96)
    args = p.parse_args(argv)
    if args.quick:
        args.records, args.hidden, args.batch_tokens = 48, 1024, 4096
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="eyas-overlap-") as tmp:
        work = Path(tmp)
        model = work / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": args.hidden, "num_hidden_layers": 8, "vocab_size": 32000}))
        recs = records(args.records, 512, 32000)
        made = make_files(work / "made", recs, args.hidden)
        seq_s, seq, nb = run(model, work, recs, made=made, call_s=args.call_s,
                             batch_tokens=args.batch_tokens, overlap=False)
        ovl_s, ovl, _ = run(model, work, recs, made=made, call_s=args.call_s,
                            batch_tokens=args.batch_tokens, overlap=True)
    same = len(seq) == len(ovl) and all(
        a["id"] == b["id"] and torch.equal(a["aux_hidden"], b["aux_hidden"])
        and torch.equal(a["final_hidden"], b["final_hidden"]) for a, b in zip(seq, ovl, strict=False))
    tokens = sum(len(r["input_ids"]) for r in recs)
    per_collect = max(0.0, seq_s / nb - args.call_s)  # what the sequential engine waits for
    bound = (args.call_s + per_collect) / max(args.call_s, per_collect)
    print(f"{nb} batches of <= {args.batch_tokens} tokens ({tokens} tokens, H {args.hidden}); "
          f"engine call {args.call_s:.2f} s, collection {per_collect:.3f} s/batch")
    print(f"sequential: {seq_s:.2f} s ({tokens / seq_s:,.0f} tok/s)")
    print(f"overlapped: {ovl_s:.2f} s ({tokens / ovl_s:,.0f} tok/s); same samples: {same}")
    print(f"speedup {seq_s / ovl_s:.2f}x (bound {bound:.2f}x)")
    print(json.dumps({"batches": nb, "tokens": tokens, "hidden": args.hidden,
                      "call_s": args.call_s, "collect_s_per_batch": round(per_collect, 4),
                      "sequential_s": round(seq_s, 3), "overlapped_s": round(ovl_s, 3),
                      "speedup": round(seq_s / ovl_s, 3), "bound": round(bound, 3),
                      "same_samples": same}))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
