"""GPU check of the SGLang backend: a random tiny DeepSeek-V3 (MLA + MoE) through SGLang with
eyas's capture hook and through the HF backend, compared.

    bash scripts/gpu_check.sh sglang                 # one GPU, SGLang 0.5.23 + eyas in $PYTHON
    python scripts/gpu_check_sglang.py --dry-run     # CPU: everything but SGLang's engine

Needs a CUDA GPU and an environment with ``sglang==0.5.23`` and eyas installed (SGLang pins
its own torch: use its own venv, ``PYTHON=/path/to/venv/bin/python``). No downloads: the model
is built locally with random weights (`eyas.tiny.build_random_model("deepseek_v3", ...)`;
where that architecture is not offered, or with ``--own-shape``, this shape built from a
DeepseekV3Config: 8 layers, hidden 256, MLA with DeepSeek-V3's head geometry (kv_lora_rank
512, rope 64, nope 128, v 128), 8 routed experts (2 per token) plus a shared one). If SGLang's
MLA kernels refuse a shape, try ``--own-shape`` or ``--attention-backend triton``.

The folder then gets Kimi-K2.5's outer layout, as the users' target has it
(`eyas.tiny.kimi_replica.wrap_as_kimi_k25`): ``KimiK25ForConditionalGeneration`` with the
DeepSeek-V3 text model under ``text_config``, weights named ``language_model.*``. SGLang runs
it through the multimodal wrapper (``general_mm_embed_routine``: the logits processor gets
``input_ids=None``, the case eyas's hook must handle), without ``--language-model-only``
(SGLang 0.5.23 accepts it only for its ``LANGUAGE_MODEL_ONLY_ARCHITECTURES``), so SGLang builds
the wrapper whole, vision tower included (randomly initialised here: the folder has no vision
weights); eyas's HF backend loads the text model from the same folder. ``--flat`` keeps the plain
``DeepseekV3ForCausalLM`` folder.

What it runs: 14 records of mixed lengths (5 to 700 tokens, and one of 3,000 tokens, longer
than the 2,048-token prefill chunk set here, so that prompt arrives in two chunks), through

1. the HF backend (bf16 on the GPU, storage "topk", K=8);
2. the SGLang backend (storage "topk", K=8, chunked prefill 2,048, CUDA graphs off), aux layers
   [2, 4, 6]: a first layer other than 1, where SGLang's DeepSeek class takes the ids as given,
   so a wrong mapping would capture every layer one too early.

Compared per sample: top-1 teacher agreement, and the aux states' cosine similarity per token
and relative error (max |diff| over the row's max magnitude). Passes when top-1 agreement >= 0.9
over all tokens, the mean cosine >= 0.99 and the 5th-percentile cosine >= 0.95 (bf16 kernels
and MoE routing ties differ between the two engines). Prints one JSON line; exit 1 on failure.
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

from eyas.errors import ConfigError  # noqa: E402

AUX = [2, 4, 6]
TOPK = 8
LONG = 3000
CHUNK = 2048
LENGTHS = [LONG, 700, 640, 512, 300, 257, 130, 64, 63, 33, 17, 9, 6, 5]
DEEPSEEK_V3_TINY = dict(
    hidden_size=256, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=4,
    q_lora_rank=128, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
    v_head_dim=128, intermediate_size=512, moe_intermediate_size=128, n_routed_experts=8,
    num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1,
    routed_scaling_factor=2.5, max_position_embeddings=4096, tie_word_embeddings=False,
)


def build_target(out_dir: Path, vocab_size: int = 4096, *, own_shape: bool = False
                 ) -> tuple[Path, str]:
    """The tiny DeepSeek-V3 in `out_dir`; returns (folder, how it was built). `own_shape`
    skips `eyas.tiny` (whose shape may not suit SGLang's MLA kernels) for the one here."""
    from eyas.tiny import build_random_model

    try:
        if own_shape:
            raise ConfigError("own shape requested")
        return build_random_model("deepseek_v3", out_dir, seed=0), "eyas.tiny.build_random_model"
    except ConfigError:  # not offered by this eyas (or not wanted): the shape written here
        from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

        torch.manual_seed(0)
        config = DeepseekV3Config(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2,
                                  pad_token_id=0, **DEEPSEEK_V3_TINY)
        DeepseekV3ForCausalLM(config).save_pretrained(out_dir, safe_serialization=True)
        return out_dir, "DeepseekV3Config in scripts/gpu_check_sglang.py"


def wrap(model_dir: Path) -> Path:
    """Kimi-K2.5's outer layout around the text model in `model_dir` (in place)."""
    from eyas.tiny.kimi_replica import wrap_as_kimi_k25

    wrap_as_kimi_k25(model_dir)
    return model_dir


def make_records(vocab_size: int, lengths: list[int], seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": f"s{i}-len{n}", "input_ids": [rng.randrange(3, vocab_size) for _ in range(n)],
             "loss_mask": [1] * n} for i, n in enumerate(lengths)]


def compare(want: dict[str, dict], got: dict[str, dict]) -> dict:
    """Top-1 agreement and aux closeness of `got` against `want` (samples by id, storage
    "topk"): ``top1``, ``cos_mean``, ``cos_p05``, ``rel_err_max``, ``rel_err_mean``, ``tokens``,
    ``samples``, ``missing`` (ids in `want` but not in `got`)."""
    agree, cos_all, rel_all, tokens = 0, [], [], 0
    for sid, ref in want.items():
        if sid not in got:
            continue
        a, b = got[sid]["aux_hidden"].float(), ref["aux_hidden"].float()
        h = a.shape[-1] // 3
        for layer in range(3):
            x, y = a[:, layer * h:(layer + 1) * h], b[:, layer * h:(layer + 1) * h]
            cos_all.append(torch.nn.functional.cosine_similarity(x, y, dim=-1))
            scale = y.abs().amax(-1).clamp_min(1e-6)
            rel_all.append((x - y).abs().amax(-1) / scale)
        agree += int((got[sid]["topk_ids"][:, 0] == ref["topk_ids"][:, 0]).sum())
        tokens += ref["topk_ids"].shape[0]
    cos = torch.cat(cos_all) if cos_all else torch.zeros(1)
    rel = torch.cat(rel_all) if rel_all else torch.zeros(1)
    return {"samples": len(want), "missing": sorted(set(want) - set(got)), "tokens": tokens,
            "top1": round(agree / max(tokens, 1), 4), "cos_mean": round(float(cos.mean()), 5),
            "cos_p05": round(float(cos.quantile(0.05)), 5),
            "rel_err_mean": round(float(rel.mean()), 5), "rel_err_max": round(float(rel.max()), 5)}


def parse_with_sglang(cli_args: list[str]) -> str:
    """Run the engine arguments through SGLang's own parser where SGLang imports:
    "accepted", or "not installed" (raises on a refused argument)."""
    try:
        from sglang.srt.server_args import ServerArgs
    except ImportError:
        return "not installed"
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    parser.parse_args(cli_args)
    return "accepted"


def passed(figures: dict) -> bool:
    return (not figures["missing"] and figures["top1"] >= 0.9 and figures["cos_mean"] >= 0.99
            and figures["cos_p05"] >= 0.95)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry-run", action="store_true",
                   help="CPU: build the model, run the HF backend, build SGLang's flags; no engine")
    p.add_argument("--workdir", type=Path, default=None, help="keep the model here")
    p.add_argument("--attention-backend", default=None,
                   help="SGLang --attention-backend for the MLA layers (default: SGLang's choice)")
    p.add_argument("--mem-fraction", type=float, default=0.5)
    p.add_argument("--own-shape", action="store_true",
                   help="build the DeepSeek-V3 shape written in this script (real MLA head "
                        "geometry) instead of eyas.tiny's")
    p.add_argument("--flat", action="store_true",
                   help="keep the flat DeepseekV3ForCausalLM folder (default: Kimi-K2.5's "
                        "KimiK25ForConditionalGeneration wrapper layout)")
    args = p.parse_args(argv)
    from eyas.extract.hf_backend import HFBackend
    from eyas.extract.sglang_backend import SGLangBackend
    from eyas.extract.target import target_shape

    t0 = time.perf_counter()
    tmp = tempfile.TemporaryDirectory(prefix="eyas-gpu-sglang-")
    work = args.workdir or Path(tmp.name)
    model_dir, built_by = build_target(work / "tiny-deepseek-v3", own_shape=args.own_shape)
    shape = target_shape(model_dir)
    if shape.num_layers < AUX[-1] + 2:  # SGLang captures up to L - 2: [2, 4, 6] needs 8 layers
        model_dir, built_by = build_target(work / "own-deepseek-v3", own_shape=True)
    if not args.flat:
        wrap(model_dir)
    shape = target_shape(model_dir)
    lengths = [LONG // 2 + 100, 300, 64, 5] if args.dry_run else LENGTHS  # > 1,024 on CPU
    records = make_records(shape.vocab_size, lengths)
    device = "cpu" if args.dry_run else "cuda"
    hf = HFBackend(model_dir, aux_layers=AUX, storage="topk", topk=TOPK, device=device)
    want = {s["id"]: s for b in hf.extract(records, 8192) for s in b.samples}
    del hf
    overrides = {"attention_backend": args.attention_backend} if args.attention_backend else {}
    sg = SGLangBackend(model_dir, aux_layers=AUX, storage="topk", topk=TOPK,
                       mem_fraction_static=args.mem_fraction, spool_root=work / "spool",
                       chunked_prefill_size=CHUNK, context_length=4096,
                       engine_args=overrides, collect_timeout_s=120)
    out = {"check": "sglang", "model": built_by, "architecture": shape.architecture,
           "layout": "flat" if args.flat else "kimi-k2.5 wrapper",
           "aux_layers": AUX, "sglang_layer_ids": sg.plan.sglang_layer_ids,
           "lengths": lengths, "chunked_prefill_size": CHUNK}
    if args.dry_run:
        figures = compare(want, want)
        out["sglang_parser"] = parse_with_sglang(sg.plan.cli_args())
        out.update(dry_run=True, engine_args=sg.plan.cli_args(), self_check=figures,
                   passed=passed(figures), seconds=round(time.perf_counter() - t0, 1))
        print(json.dumps(out))
        return 0 if out["passed"] else 1
    torch.cuda.empty_cache()
    t1 = time.perf_counter()
    with sg:
        got = {s["id"]: s for b in sg.extract(records, 8192) for s in b.samples}
    figures = compare(want, got)
    out.update(figures, device=torch.cuda.get_device_name(0), passed=passed(figures),
               sglang_seconds=round(time.perf_counter() - t1, 1),
               seconds=round(time.perf_counter() - t0, 1))
    print(json.dumps(out))
    return 0 if out["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
