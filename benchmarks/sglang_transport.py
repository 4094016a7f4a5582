"""SGLang transport benchmark: aux states as tensors through eyas's spool vs as Python lists.

    python benchmarks/sglang_transport.py --quick     # CPU, well under a minute

How the states of one prefill forward reach eyas, at Kimi-K2.5's width (H = 7168: 3 x 7168
aux values per token, plus the final-norm state for storage "final"), with stand-in bf16
tensors on the CPU. A child process plays SGLang's scheduler (rank 0), the parent plays eyas:

- **tensor path** (eyas): the child runs eyas's capture hook (`CaptureHook`, as SGLang calls it
  from the logits processor) on the forward's tensors; its writer thread writes one
  safetensors file per request into a spool folder; the parent waits for the files and
  collects them into the samples the shard writer takes (`wait_for_requests`,
  `sample_from_spool`).
- **list path** (what ``return_hidden_states`` does in SGLang 0.5.23): the child turns each
  request's rows into nested Python float lists (``tensor.tolist()``, as SGLang's scheduler
  does), pickles the outputs through a pipe to the parent (SGLang pickles them across two
  process hops; one is counted here, which flatters this path), and the parent turns the
  lists back into bf16 tensors (what the previous eyas backend did).

Both carry the same payload (the aux states, 3·H bf16 values per token); the tensor path is
also timed with storage "final" (4·H per token). Timed from the child's start to the parent
holding every sample; best of `--reps`. The GPU-to-CPU copy, the same for both, is not part
of a CPU run. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from eyas.extract.sglang_backend import sample_from_spool
from eyas.extract.sglang_hook import CaptureHook
from eyas.extract.sglang_spool import remove_request, wait_for_requests

KIMI_H = 7168


class _Extend:
    """``ForwardMode.EXTEND`` as the hook sees it."""

    def is_extend(self) -> bool:
        return True

    def is_target_verify(self) -> bool:
        return False


def _forward(tokens: int, requests: int, hidden: int, seed: int = 0):
    """Stand-in logits-processor arguments of one forward: `requests` prompts of equal length."""
    g = torch.Generator().manual_seed(seed)
    length = tokens // requests
    n = length * requests
    rids = [f"eyas-bench-{seed}-{i}" for i in range(requests)]
    batch = SimpleNamespace(forward_mode=_Extend(), rids=rids,
                            extend_seq_lens_cpu=[length] * requests,
                            extend_prefix_lens_cpu=[0] * requests)
    ids = torch.randint(1, 1000, (n,), generator=g)
    aux = torch.randn(n, 3 * hidden, generator=g).to(torch.bfloat16)
    final = torch.randn(n, hidden, generator=g).to(torch.bfloat16)
    return ids, final, None, batch, aux


def _child(conn, spool: str, tokens: int, requests: int, hidden: int, reps: int) -> None:
    torch.set_num_threads(1)
    for rep in range(reps):
        for path in ("tensor", "tensor-final", "list"):
            args = _forward(tokens, requests, hidden, seed=rep)
            conn.send(("ready", path, [list(map(int, args[0][i * (tokens // requests):
                                                           (i + 1) * (tokens // requests)]))
                                       for i in range(requests)], args[3].rids))
            assert conn.recv() == "go"
            if path.startswith("tensor"):
                storage = "final" if path == "tensor-final" else None
                hook = CaptureHook({"spool_dir": spool, "storage": storage, "dtype": "bfloat16"})
                hook(None, args, None)
                hook.close()
            else:
                ids, _, _, batch, aux = args
                outputs, row = [], 0
                for rid, length in zip(batch.rids, batch.extend_seq_lens_cpu, strict=True):
                    rows = aux[row:row + length].tolist()  # SGLang: .tolist() per request
                    outputs.append({"meta_info": {"id": rid, "hidden_states": [rows]}})
                    row += length
                conn.send_bytes(pickle.dumps(outputs, protocol=pickle.HIGHEST_PROTOCOL))
            assert conn.recv() == "done"
    conn.send(("end",))


def _receive(conn, path: str, spool: Path, rid_tokens: dict, storage: str | None) -> int:
    """The parent's side of one path; returns the samples built."""
    if path.startswith("tensor"):
        got = wait_for_requests(spool, rid_tokens, timeout_s=120, poll_s=0.001)
        n = 0
        for rid, tensors in got.items():
            record = {"id": rid, "input_ids": rid_tokens[rid], "loss_mask": [1] * len(tensors["input_ids"])}
            sample_from_spool(record, tensors, storage=storage, hidden_size=KIMI_H, topk=0)
            remove_request(spool, rid)
            n += 1
        return n
    outputs = pickle.loads(conn.recv_bytes())
    for out in outputs:
        rows = out["meta_info"]["hidden_states"][0]
        torch.tensor(rows, dtype=torch.float32).to(torch.bfloat16)
    return len(outputs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="256 tokens per forward, 2 reps")
    p.add_argument("--tokens", type=int, default=None, help="tokens per forward")
    p.add_argument("--requests", type=int, default=4, help="requests per forward")
    p.add_argument("--reps", type=int, default=None)
    args = p.parse_args(argv)
    tokens = args.tokens or (256 if args.quick else 1024)
    reps = args.reps or (2 if args.quick else 3)
    torch.set_num_threads(1)
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="eyas-transport-") as tmp:
        spool = Path(tmp)
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_child, args=(child, str(spool), tokens, args.requests,
                                                KIMI_H, reps))
        proc.start()
        try:
            while True:
                msg = parent.recv()
                if msg[0] == "end":
                    break
                _, path, per_request_ids, rids = msg
                rid_tokens = dict(zip(rids, per_request_ids, strict=True))
                t0 = time.perf_counter()
                parent.send("go")
                storage = "final" if path == "tensor-final" else None
                n = _receive(parent, path, spool, rid_tokens, storage)
                elapsed = time.perf_counter() - t0
                assert n == args.requests
                best[path] = min(best.get(path, float("inf")), elapsed)
                parent.send("done")
        finally:
            proc.join(timeout=60)
    n_tokens = (tokens // args.requests) * args.requests
    aux_bytes = n_tokens * 3 * KIMI_H * 2
    final_bytes = n_tokens * 4 * KIMI_H * 2
    fig = {
        "hidden_size": KIMI_H, "tokens_per_forward": n_tokens, "requests": args.requests,
        "reps": reps,
        "list_tok_s": round(n_tokens / best["list"], 1),
        "list_MB_s": round(aux_bytes / best["list"] / 1e6, 1),
        "tensor_tok_s": round(n_tokens / best["tensor"], 1),
        "tensor_MB_s": round(aux_bytes / best["tensor"] / 1e6, 1),
        "tensor_final_tok_s": round(n_tokens / best["tensor-final"], 1),
        "tensor_final_MB_s": round(final_bytes / best["tensor-final"] / 1e6, 1),
    }
    fig["ratio_tensor_vs_list"] = round(best["list"] / best["tensor"], 1)
    print(f"Kimi width H={KIMI_H}, {n_tokens} tokens per forward in {args.requests} requests, "
          f"best of {reps}; payload = aux states in bf16 (3·H·2 = {3 * KIMI_H * 2:,} B/token)")
    print(f"  list path   (tolist + pickle + torch.tensor): {fig['list_tok_s']:>10,.1f} tok/s "
          f"{fig['list_MB_s']:>8,.1f} MB/s")
    print(f"  tensor path (hook -> safetensors -> collect): {fig['tensor_tok_s']:>10,.1f} tok/s "
          f"{fig['tensor_MB_s']:>8,.1f} MB/s")
    print(f"  tensor path, storage final (aux + final):     {fig['tensor_final_tok_s']:>10,.1f} "
          f"tok/s {fig['tensor_final_MB_s']:>8,.1f} MB/s")
    print(f"  ratio tensor / list: {fig['ratio_tensor_vs_list']}x")
    print(json.dumps(fig))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
