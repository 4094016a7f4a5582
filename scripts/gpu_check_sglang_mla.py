"""GPU check of the MLA drafter kind: eyas trains an ``Eagle3DeepseekV2ForCausalLM`` drafter for a
random tiny DeepSeek-V3 (Kimi-K2.5's wrapper layout), SGLang 0.5.23 serves it with
``--speculative-algorithm EAGLE3``, and its accept length is held against eyas's offline
evaluator on the same prompts.

    PYTHON=/sglang-venv/bin/python bash scripts/gpu_check.sh mla     # one GPU, sglang==0.5.23
    python scripts/gpu_check_sglang_mla.py --dry-run                 # CPU: all but SGLang

Not run in the sessions that wrote it (no GPU there). No downloads: the target is the DeepSeek-V3
shape of ``scripts/gpu_check_sglang.py`` (8 layers, hidden 256, DeepSeek-V3's MLA head geometry:
latent 512, rope 64, nope 128, values 128, which SGLang's MLA kernels take) with random weights,
wrapped as ``KimiK25ForConditionalGeneration`` (``--flat``: plain DeepseekV3ForCausalLM).

What it runs:

1. 72 random 24-token prompts; the target (HF, bf16, GPU) continues each greedily for 96 tokens:
   64 become training records (loss on the continuation), 8 are held out;
2. eyas's HF backend extracts them (storage "final") and eyas trains the MLA drafter
   (``train.drafter: mla``; ``--fc-norm`` / ``--norm-output`` for EAGLE-3.1's options) for
   ``--steps`` steps, then exports it;
3. eyas's offline evaluator drafts on the held-out prompts (greedy, k = 3): τ_offline;
4. SGLang serves the target with the exported drafter (EAGLE3, 3 steps, top-k 1, 4 draft tokens,
   CUDA graphs off) and generates the same held-out continuations: its ``spec_accept_length``
   (mean over requests) and whether its greedy tokens equal the target's own.

Passes when SGLang loads and serves the drafter, its accept length is above 1.2 (the drafter
drafts what it learned: a drafter SGLang loaded wrong accepts nothing) and within 20% of
τ_offline (two implementations of one computation; bf16 and batching differ), and at least 90%
of the served tokens equal the target's greedy ones. One JSON line; exit 1 on failure.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

PROMPT, NEW, TRAIN, HELD = 24, 96, 64, 8
SERVE = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3,
         "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}


def _sibling(name: str):
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def continuations(model_dir: Path, device: str, n: int, new: int, seed: int = 0) -> list[dict]:
    """`n` records: a random prompt and the target's greedy continuation (loss-masked)."""
    from eyas.evaluate.target import load_target

    model = load_target(model_dir, torch.device(device),
                        torch.bfloat16 if device != "cpu" else torch.float32)
    vocab = model.config.get_text_config().vocab_size
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, vocab, (n, PROMPT), generator=g)
    out = []
    with torch.no_grad():
        for i in range(0, n, 8):
            batch = prompts[i:i + 8].to(device)
            ids = model.generate(input_ids=batch, attention_mask=torch.ones_like(batch),
                                 max_new_tokens=new, min_new_tokens=new, do_sample=False)
            for row in ids.cpu().tolist():
                out.append({"id": f"r{len(out)}", "dataset": "gpu-check", "input_ids": row,
                            "loss_mask": [0] * PROMPT + [1] * (len(row) - PROMPT)})
    del model
    return out


def engine_args(model_dir: Path, drafter: Path, architecture: str | None, mem: float) -> dict:
    """What the users' Kimi server gets for the MLA drafter (flags as for the Llama kind)."""
    from eyas.sglang_args import runs_language_model_only

    args = {"model_path": str(model_dir), "speculative_draft_model_path": str(drafter),
            **SERVE, "mem_fraction_static": mem, "trust_remote_code": True,
            "skip_tokenizer_init": True, "disable_prefill_cuda_graph": True,
            "disable_decode_cuda_graph": True}
    if runs_language_model_only(architecture):  # never Kimi's wrapper in SGLang 0.5.23
        args["language_model_only"] = True
    return args


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, few steps, no SGLang engine")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--fc-norm", action="store_true")
    p.add_argument("--norm-output", action="store_true")
    p.add_argument("--flat", action="store_true", help="plain DeepseekV3ForCausalLM folder")
    p.add_argument("--drafter", type=Path, default=None,
                   help="serve this exported MLA drafter instead of training one")
    p.add_argument("--mem-fraction", type=float, default=0.6)
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args(argv)
    from eyas.evaluate.config import EvaluateConfig
    from eyas.evaluate.run import evaluate, select_prompts
    from eyas.extract.config import ExtractConfig
    from eyas.extract.run import extract
    from eyas.extract.target import target_shape
    from eyas.train.config import TrainConfig
    from eyas.train.data import OfflineSource
    from eyas.train.run import train_drafter
    from eyas.train.tiny_data import write_jsonl

    t0 = time.perf_counter()
    device = "cpu" if args.dry_run else "cuda"
    tmp = tempfile.TemporaryDirectory(prefix="eyas-gpu-mla-")
    work = args.workdir or Path(tmp.name)
    base = _sibling("gpu_check_sglang")
    model_dir, _ = base.build_target(work / "target", own_shape=True)
    if not args.flat:
        base.wrap(model_dir)
    shape = target_shape(model_dir)
    n_train, held_n, new = (4, 2, 12) if args.dry_run else (TRAIN, HELD, NEW)
    records = continuations(model_dir, device, n_train + held_n, new)
    train = write_jsonl(work / "merged" / "train.jsonl", records[:n_train])
    held = write_jsonl(work / "merged" / "eval.jsonl", records[n_train:])
    out: dict = {"check": "sglang-mla", "architecture": shape.architecture,
                 "fc_norm": args.fc_norm, "norm_output": args.norm_output}
    drafter = args.drafter
    if drafter is None:
        dirs = {}
        for name, jsonl in (("train", train), ("eval", held)):
            dirs[name] = work / "hidden" / name
            extract(jsonl, dirs[name], model_dir=model_dir, trust_remote_code=True,
                    cfg=ExtractConfig(storage="final", shard_size=64, device=device))
        src = OfflineSource(dirs["train"])
        steps = 2 if args.dry_run else args.steps
        cfg = TrainConfig(steps=steps, lr=2e-3, warmup_steps=max(1, steps // 20), micro_batch=8,
                          ttt_steps=2 if args.dry_run else 7,
                          eval_every=steps, log_every=max(1, steps // 5), device=device,
                          draft_vocab_size=shape.vocab_size, drafter="mla",
                          fc_norm=args.fc_norm, norm_output=args.norm_output)
        summary = train_drafter(src, OfflineSource(dirs["eval"]), model_dir, work / "drafter",
                                cfg, aux_layers=src.aux_layers, on_log=None)
        drafter = Path(summary["export"])
        out["simulated_tau"] = summary["best"]["simulated_acceptance_length"]
    ecfg = EvaluateConfig(device=device, max_new_tokens=new // 2, draft_tokens=3,
                          prompts_per_dataset=held_n, baselines=[])
    held_prompts = [{**r, "input_ids": r["input_ids"][:PROMPT], "loss_mask": [0] * PROMPT}
                    for r in records[n_train:]]
    selection = select_prompts(ecfg, eval_jsonl=held, train_jsonl=None, prompt_files=[],
                               tokenizer=None)
    report = evaluate(model_dir, drafter, selection, ecfg, work / "evaluate",
                      trust_remote_code=True, on_log=None)
    out["offline_tau"] = report["acceptance_length"]
    sargs = engine_args(model_dir, drafter, shape.architecture, args.mem_fraction)
    if args.dry_run:
        spec = _sibling("gpu_check_sglang")
        flags = [f"--{k.replace('_', '-')}" if v is True else f"--{k.replace('_', '-')}={v}"
                 for k, v in sargs.items()]
        out.update(dry_run=True, engine_args=sargs, sglang_parser=spec.parse_with_sglang(flags),
                   passed=True,
                   seconds=round(time.perf_counter() - t0, 1))
        print(json.dumps(out))
        return 0
    import sglang

    torch.cuda.empty_cache()
    engine = sglang.Engine(**sargs)
    try:
        params = {"temperature": 0.0, "max_new_tokens": new // 2}
        got = engine.generate(input_ids=[r["input_ids"] for r in held_prompts],
                              sampling_params=params)
    finally:
        engine.shutdown()
    accept = [g["meta_info"].get("spec_accept_length") for g in got]
    same = total = 0
    for g, r in zip(got, records[n_train:], strict=True):
        want = r["input_ids"][PROMPT:PROMPT + new // 2]
        same += sum(a == b for a, b in zip(g["output_ids"], want, strict=False))
        total += len(want)
    served = statistics.mean(a for a in accept if a is not None) if any(accept) else None
    agree = same / max(total, 1)
    ok = (served is not None and served > 1.2 and agree >= 0.9
          and abs(served - out["offline_tau"]) <= 0.2 * out["offline_tau"])
    out.update(served_accept_length=served, greedy_agreement=round(agree, 4),
               engine_args=sargs, device=torch.cuda.get_device_name(0), passed=ok,
               seconds=round(time.perf_counter() - t0, 1))
    print(json.dumps(out))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
