"""eyas against SpecForge, side by side: same data, same hidden states, one evaluator (CPU).

    python benchmarks/vs_specforge.py --quick        # smoke run: 2 seeds x 30 steps
    python benchmarks/vs_specforge.py                # the recipe's steps, 3 seeds
    python benchmarks/vs_specforge.py --steps 60 --threads 1 --only eyas \
        --eyas-set min_lr_ratio=0.1                  # one eyas choice; SpecForge from cache

Both trainers train the same drafter shape (the recipe's target, its draft vocabulary) on the
same merged data and the same hidden states (extracted once by ``eyas.extract``, storage
"final"; SpecForge reads a copy in its offline ``.ckpt`` format), with the same steps,
micro-batch, peak learning rate, warmup + cosine schedule, gradient clipping, TTT unroll,
truncation and seeds. Then the same evaluators score both trained drafters: SpecForge's
weights are loaded into eyas's ``Drafter`` (both use SGLang's parameter names), and
(1) real drafting (``eyas.evaluate``: the drafter proposes a chain of k tokens, the target
verifies them, greedy, as SGLang does) on held-out prompts of the merged eval split gives τ as
SGLang's accept length, with 95 % intervals bootstrapped over prompts and the paired
difference (``--real-prompts``, ``--real-new-tokens``; ``--real-prompt-file eyas:humaneval``
scores a prompt file's first ``--real-file-prompts`` prompts too, as a set of their own, as
phase 6 renders them); (2) eyas's simulated acceptance on the held-out split beside it;
(3) with ``--sampled 0.7,1.0``, both again for sampled decoding at each temperature: the
simulated acceptance as the expected acceptance of each position under SGLang's two rules
(``target_only``, its default and its only rule for a reduced draft vocabulary: p(argmax q);
``rejection``: Σ min(p, q), what the LK losses train) and real drafting under
``--sampled-rule``, each prompt's draws seeded alike for every drafter.
Printed per trainer: training tokens/s, acc_i and the simulated τ = 1 + Σ_k Π_{i≤k} acc_i
(the target's bonus token counted), with the standard error of τ (bootstrap over eval
samples, combined with the spread over seeds), and the real-drafting τ. Each trainer's result
for a seed is kept in ``<workdir>/vs-specforge/results/`` under a hash of that trainer's settings,
the data and the code that trains it (``eyas/train/`` for eyas, the driver for SpecForge), and
each score under a hash of the weights, the eval data and the evaluator's code: seeds and
trainers can be run in several invocations (``--only``), at once if need be (the shared setup
is prepared under a lock, one run at a time), and summarised together, and a study
of eyas's settings (``--eyas-set FIELD=VALUE``, any TrainConfig field, the drafter's kind,
norms and draft vocabulary size included: eyas then trains and is scored with its own
vocabulary, and the share of supervised tokens each vocabulary holds is printed) trains
SpecForge once; ``--specforge-set FIELD=VALUE`` moves SpecForge's
schedule (its learning rate, say) apart from the shared one. The last line is JSON:
``{"eyas_tau", "specforge_tau", "tau_se", "eyas_tok_s", "specforge_tok_s", "eyas_real_tau",
"specforge_real_tau", "real_tau_diff", ...}`` (``*_tau``: simulated; ``*_real_tau``: real
drafting).

SpecForge 0.2.0 runs in its own venv (``bash benchmarks/specforge_env.sh``), as a
subprocess with its own interpreter (``benchmarks/_specforge_driver.py``); it is never
imported here. Without it this prints how to install it and exits with status 2 (unless
``--only eyas``, which needs no SpecForge).

``--train-samples N`` (with ``--only eyas``) trains eyas on the first N samples of the train
split, a data-size study: merge shuffled the split, so they are a random subset, and the
first N of a smaller N are among them. The draft vocabulary, the held-out split and every
score stay the whole split's, so only the samples the drafter learns from change.

Data: the recipe (default ``recipes/tiny-demo.yaml``) run in ``--workdir``: phases 1-2
(``eyas prepare``) run once if their outputs are missing; the merge is redone here into
``<workdir>/vs-specforge/merged`` with a larger held-out split (``--eval-fraction``), so
that τ's standard error is small; then ``eyas.extract`` (storage "final") writes both splits.

Differences between the trainers, and what is done about each (see docs/benchmarks.md):
- loss-mask alignment: SpecForge scores the prediction of token t+2+i with the mask bit of
  token t+i (and zeroes the last bit); eyas uses the predicted token's own bit. Controlled by
  default: SpecForge's copy of the data carries the mask shifted by two, so both supervise the
  same positions (``--specforge-mask native`` keeps SpecForge's own alignment).
- loss normalisation: SpecForge divides by batch x padded length, eyas by supervised positions.
  Reported (``--specforge-loss-norm valid`` makes SpecForge's loss divide like eyas's).
- teacher precision: SpecForge's teacher logits are bf16, eyas's fp32. Reported
  (``--specforge-teacher float32``).
- AdamW betas: SpecForge (0.9, 0.999), eyas (0.9, 0.95). Reported (``--eyas-betas 0.9,0.999``).
- precision: ``--precision bf16`` (default) trains eyas under bf16 autocast and SpecForge with
  its bf16 model (float32 master weights), as each runs on a GPU; ``fp32`` both in float32.
- initialisation (eyas's ``init_head``), data order (eyas's ``group_batches``) and
  ``torch.compile`` (SpecForge compiles its norm, rotary and loss functions; eyas compiles
  nothing) are each trainer's own.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import inspect
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from eyas.config import PipelineConfig, load_config  # noqa: E402
from eyas.io import atomic_write, locked, read_json, write_json  # noqa: E402
from eyas.layout import RunLayout  # noqa: E402
from eyas.train.config import TrainConfig  # noqa: E402
from eyas.train.data import Batches, OfflineSource, Source  # noqa: E402
from eyas.train.model import Drafter, DrafterConfig  # noqa: E402
from eyas.train.trainer import Trainer, make_teacher  # noqa: E402
from eyas.train.ttt import TargetHead, ttt_loss  # noqa: E402
from eyas.train.vocab import DraftVocab, count_tokens, coverage, load_or_build  # noqa: E402

SPECFORGE_VERSION = "0.2.0"
DRIVER = Path(__file__).resolve().parent / "_specforge_driver.py"
DEFAULT_VENV = Path(os.environ.get("SPECFORGE_VENV", Path.home() / ".venvs" / "specforge"))
INSTALL_HINT = f"""SpecForge {SPECFORGE_VERSION} is not installed where this benchmark looks
({{python}}). It runs in its own virtual environment, outside this repository:

    bash benchmarks/specforge_env.sh {DEFAULT_VENV}

(about 3 minutes; needs PyPI: the CPU build of torch 2.13.0, specforge=={SPECFORGE_VERSION}
without its GPU dependencies, and the pure-Python packages its offline trainer imports). Then
run this again, or point it elsewhere with --specforge-python VENV/bin/python or the
SPECFORGE_VENV environment variable."""

RESULT_FORMAT = 2  # bump when what a cached per-seed result means changes
QUICK = {"seeds": [0, 1], "steps": 30, "skip_steps": 3}
FULL = {"seeds": [0, 1, 2], "steps": None, "skip_steps": 10}  # steps None: the recipe's


class FirstSamples:
    """The first `n` samples of `source`, with the interface `Batches` and the draft
    vocabulary read (``--train-samples``)."""

    def __init__(self, source: Source, n: int) -> None:
        if not 0 < n <= len(source):
            raise SystemExit(f"--train-samples {n}: the train split holds {len(source)} "
                             "samples; give 1 to that many")
        self.source, self.n = source, n
        self.ids, self.storage = source.ids[:n], source.storage

    def __len__(self) -> int:
        return self.n

    def identity(self) -> str:
        return f"{self.source.identity()}-first{self.n}"

    def lengths(self) -> list[int]:
        return self.source.lengths()[: self.n]

    def load(self, k: int, *, dequantize: bool = True):
        if not 0 <= k < self.n:
            raise IndexError(f"sample {k} of the first {self.n}")
        return self.source.load(k, dequantize=dequantize)


# ----------------------------------------------------------------------------- SpecForge venv
def specforge_version(python: Path) -> str | None:
    """SpecForge's version as installed for `python`; None when absent or not importable."""
    if not python.is_file():
        return None
    probe = "import importlib.metadata as m; print(m.version('specforge'))"
    r = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120)
    return r.stdout.strip() if r.returncode == 0 else None


def code_hash(*parts: Path | Callable) -> str:
    """SHA-256 (16 hex digits) of the Python files under the paths and the source of the
    functions in `parts`: part of a result's key, so that a cached result never outlives the
    code that produced it (a function of this file rather than the file: editing the
    harness's options keeps its scores)."""
    h = hashlib.sha256()
    for part in parts:
        if callable(part):
            h.update(part.__name__.encode() + b"\0" + inspect.getsource(part).encode())
            continue
        files = sorted(part.rglob("*.py")) if part.is_dir() else [part]
        for f in files:
            h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


# TrainConfig fields SpecForge's run YAML is written from (besides ``steps``, always shared).
SPECFORGE_FIELDS = ("micro_batch", "grad_accum", "lr", "warmup_steps", "grad_clip", "ttt_steps",
                    "max_len")


def parse_overrides(items: list[str], *, flag: str = "--eyas-set",
                    allowed: tuple[str, ...] | None = None) -> dict:
    """``KEY=VALUE`` pairs (VALUE read as YAML: ``1e-3``, ``[0.9, 0.999]``, ``bf16``) as a
    dict; raises SystemExit naming `flag` and the fields it takes (`allowed`, else every
    TrainConfig field) when KEY is not one of them."""
    import yaml

    fields = allowed or tuple(TrainConfig.model_fields)
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in fields:
            raise SystemExit(f"{flag} {item!r}: expected FIELD=VALUE with FIELD one of "
                             f"{', '.join(sorted(fields))}")
        out[key] = yaml.safe_load(value)
    return out


# ----------------------------------------------------------------------------- data
SETUP_LOCK = ".vs-specforge-setup.lock"


@contextlib.contextmanager
def setup_lock(workdir: Path) -> Iterator[None]:
    """Hold ``<workdir>/.vs-specforge-setup.lock`` (an exclusive ``flock``, waiting for it)
    while a run prepares what every run shares: the data, the vocabulary, SpecForge's target
    copy, config, vocabulary mapping and features. Runs of other seeds or trainers
    (``--only``) may start together; each waits here for the one preparing, then finds its
    work done. The kernel releases the lock however a run ends."""
    with locked(workdir / SETUP_LOCK, on_wait=lambda: print(
            f"waiting for another vs_specforge run preparing {workdir} ...", flush=True)):
        yield


def prepare_data(recipe: Path, workdir: Path, eval_fraction: float,
                 eyas_storage: str = "final") -> dict:
    """Merged splits and their hidden-state shards (storage "final") for the benchmark; with
    another `eyas_storage` ("topk", "compact") the train split is also extracted so, for eyas
    alone to train on (``eyas_train``; SpecForge reads "final" only, and every drafter is
    scored on the "final" held-out split)."""
    from eyas.extract.run import extract
    from eyas.manifest import is_up_to_date
    from eyas.prepare.merge import merge_datasets
    from eyas.prepare.phases import resolve_target

    cfg = load_config(recipe)
    layout = RunLayout(workdir)
    inputs = {d.name: layout.tokenized(d.name) for d in cfg.datasets}
    if not all((p.parent / "manifest.json").is_file() for p in inputs.values()):
        print(f"phases 1-2 of {recipe} are not done in {workdir}: running `eyas prepare` "
              "(minutes: the target answers the prompts)", flush=True)
        subprocess.run([sys.executable, "-m", "eyas.cli", "prepare", "--config", str(recipe),
                        "--workdir", str(workdir)], check=True)
    bench = workdir / "vs-specforge"
    merge_cfg = cfg.merge.model_copy(update={"eval_fraction": eval_fraction})
    merged = bench / "merged"
    if not is_up_to_date(merged, inputs, merge_cfg.model_dump(mode="json")):
        merge_datasets(inputs, merged, merge_cfg)
    target = resolve_target(cfg)
    ecfg = cfg.extract.model_copy(update={"storage": "final", "device": "cpu"})
    for split in ("train", "eval"):
        extract(merged / f"{split}.jsonl", bench / "hidden" / split, model_dir=target, cfg=ecfg)
    eyas_train = bench / "hidden" / "train"
    if eyas_storage != "final":
        eyas_train = bench / "hidden" / f"train-{eyas_storage}"
        extract(merged / "train.jsonl", eyas_train, model_dir=target,
                cfg=ecfg.model_copy(update={"storage": eyas_storage}))
    return {"cfg": cfg, "target": target, "bench": bench, "eyas_train": eyas_train,
            "train": bench / "hidden" / "train", "eval": bench / "hidden" / "eval"}


def data_fingerprint(merged: Path) -> dict[str, str]:
    """The merged splits' SHA-256 (first 16 hex digits each): the study's caches live in a
    run folder that a fresh machine rebuilds, so two runs compare only where these agree
    (same answers, same tokens, same split)."""
    from eyas.verified import file_sha256

    return {split: file_sha256(merged / f"{split}.jsonl")[:16] for split in ("train", "eval")}


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under `folder` (a split's shards, manifest and all)."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def export_features(shard_root: Path, dest: Path, *, align_mask: bool) -> int:
    """The samples of `shard_root` as SpecForge ``.ckpt`` files (skipped when up to date).

    With `align_mask` the loss mask is shifted left by two (bit t becomes token t+2's bit), so
    that SpecForge, which scores the prediction of token t+2+i with bit t+i, supervises the
    positions eyas supervises. Names are zero-padded: SpecForge lists files in string order.
    """
    from eyas.extract.specforge import iter_as_specforge
    from eyas.io import atomic_write

    source = OfflineSource(shard_root)
    stamp = {"source": source.identity(), "align_mask": align_mask, "samples": len(source)}
    done = dest / "export.json"
    if done.is_file() and read_json(done) == stamp:
        return len(source)
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    n = 0
    for shard in source.shards:
        for sample in iter_as_specforge(shard):
            own = {k: v.clone(memory_format=torch.contiguous_format) for k, v in sample.items()}
            if align_mask:
                mask = torch.zeros_like(own["loss_mask"])
                mask[:-2] = own["loss_mask"][2:]
                own["loss_mask"] = mask
            with atomic_write(dest / f"data_{n:06d}.ckpt", "wb") as fh:
                torch.save(own, fh)
            n += 1
    write_json(done, stamp)
    return n


def specforge_target(target: Path, dest: Path) -> tuple[Path, str]:
    """A view of the target folder SpecForge can read: links to its files plus the
    ``model.safetensors.index.json`` SpecForge requires. Returns (folder, lm_head key):
    a target with tied embeddings has no ``lm_head.weight``, so its head is the embedding."""
    from safetensors import safe_open

    dest.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for f in sorted(target.iterdir()):
        link = dest / f.name
        if not link.exists():
            link.symlink_to(f.resolve())
        if f.suffix == ".safetensors":
            with safe_open(str(f), framework="pt") as fh:
                weight_map.update({k: f.name for k in fh.keys()})
    index = dest / "model.safetensors.index.json"
    if not index.exists():
        write_json(index, {"metadata": {}, "weight_map": weight_map})
    head = "lm_head.weight" if "lm_head.weight" in weight_map else "model.embed_tokens.weight"
    return dest, head


# ----------------------------------------------------------------------------- training
def train_eyas(tcfg: TrainConfig, dcfg: DrafterConfig, vocab: DraftVocab, embed: torch.Tensor,
               head: torch.Tensor, source: OfflineSource, work: Path,
               final_norm: torch.Tensor | None = None, *,
               label: str = "eyas") -> tuple[Drafter, list]:
    """Train eyas's drafter with eyas's Trainer (built as ``eyas.train.run.train_drafter``
    builds it); returns it and per-step (seconds, tokens). Prints a progress line (steps,
    tokens/s, time left) eight times per run."""
    torch.manual_seed(tcfg.seed)
    drafter = Drafter(dcfg, embed)
    if tcfg.init_head == "target":
        drafter.init_head_from_target(head, vocab.draft_to_target, final_norm)
    batches = Batches(source, micro_batch=tcfg.micro_batch, seed=tcfg.seed, max_len=tcfg.max_len,
                      group_batches=tcfg.group_batches)
    trainer = Trainer(tcfg, drafter, vocab, batches, None, work, lm_head_VH=head, on_log=None)
    steps = []
    every = max(1, tcfg.steps // 8)
    for i in range(tcfg.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        rec = trainer.step()
        steps.append({"seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0,
                      "tokens": rec["tokens"]})
        if (i + 1) % every == 0 and i + 1 < tcfg.steps:
            print(progress_line(label, steps, tcfg.steps), flush=True)
    return drafter, steps


def progress_line(label: str, steps: list[dict], total: int) -> str:
    """``<label>: step i/total, N tok/s, ~M min left`` from the per-step timings so far."""
    left = sum(s["seconds"] for s in steps) / len(steps) * (total - len(steps)) / 60
    return (f"{label}: step {len(steps)}/{total}, {rate(steps, 0):,.0f} tok/s, "
            f"~{left:.0f} min left")


def specforge_run_config(*, seed: int, tcfg: TrainConfig, run_dir: Path, target: Path,
                         lm_head_key: str, draft_config: Path, vocab_mapping: Path,
                         train_features: Path, eval_features: Path, n_train: int,
                         dtype: str = "float32") -> dict:
    """SpecForge's run YAML for the same shape, data, schedule and seed as `tcfg`."""
    epochs = math.ceil(tcfg.steps * tcfg.micro_batch / n_train) + 1
    return {
        "run_id": f"vs-eyas-seed{seed}",
        "output_dir": str(run_dir),
        "model": {"target_model_path": str(target), "draft_model_config": str(draft_config),
                  "vocab_mapping_path": str(vocab_mapping), "torch_dtype": dtype,
                  "lm_head_key": lm_head_key, "embedding_key": "model.embed_tokens.weight"},
        "data": {"hidden_states_path": str(train_features),
                 "eval_hidden_states_path": str(eval_features),
                 "max_length": tcfg.max_len, "dataloader_num_workers": 0},
        "training": {"max_steps": tcfg.steps, "total_steps": tcfg.steps, "num_epochs": epochs,
                     "batch_size": tcfg.micro_batch, "accumulation_steps": tcfg.grad_accum,
                     "learning_rate": tcfg.lr, "warmup_ratio": tcfg.warmup() / tcfg.steps,
                     "max_grad_norm": tcfg.grad_clip, "ttt_length": tcfg.ttt_steps,
                     "attention_backend": "sdpa", "fsdp_sharding": "NO_SHARD", "seed": seed,
                     "log_interval": max(1, tcfg.steps // 4), "eval_interval": tcfg.steps},
        "tracking": {"report_to": "none"},
    }


def train_specforge(python: Path, run_cfg: dict, work: Path, *, threads: int, loss_norm: str,
                    teacher: str, compile_: bool) -> dict:
    """Run SpecForge's trainer in its venv; returns the driver's stats (timings, its eval)."""
    import yaml

    run_dir = Path(run_cfg["output_dir"])
    shutil.rmtree(run_dir, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    config = work / f"{run_cfg['run_id']}.yaml"
    config.write_text(yaml.safe_dump(run_cfg, sort_keys=False))
    stats = work / f"{run_cfg['run_id']}.stats.json"
    stats.unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "SPECFORGE_DEVICE": "cpu"}
    env.pop("PYTHONPATH", None)
    if not compile_:
        env["TORCH_COMPILE_DISABLE"] = "1"
    log = work / f"{run_cfg['run_id']}.log"
    with open(log, "w") as fh:
        r = subprocess.run([str(python), str(DRIVER), "--config", str(config), "--stats",
                            str(stats), "--threads", str(threads), "--loss-norm", loss_norm,
                            "--teacher-dtype", teacher], stdout=fh, stderr=subprocess.STDOUT,
                           env=env, cwd=str(work))
    if r.returncode != 0 or not stats.is_file():
        tail = log.read_text(errors="replace").splitlines()[-30:]
        raise RuntimeError(f"SpecForge run failed (exit {r.returncode}); log {log}:\n"
                           + "\n".join(tail))
    return read_json(stats)


def load_specforge_drafter(run_dir: Path, dcfg: DrafterConfig, embed: torch.Tensor,
                           vocab: DraftVocab) -> Drafter:
    """SpecForge's final weights in eyas's Drafter (parameter names are SGLang's in both)."""
    from eyas.errors import DataError

    state = find_specforge_weights(run_dir)
    drafter = Drafter(dcfg, embed)
    ours = drafter.state_dict()
    picked = {k: v.float() for k, v in state.items() if k in ours}
    missing = sorted(set(ours) - set(picked))
    if missing:
        raise DataError(f"SpecForge's checkpoint lacks {missing} (has {sorted(state)})",
                        path=run_dir)
    if "d2t" in state and not torch.equal(state["d2t"].long(), vocab.d2t):
        raise DataError("SpecForge's d2t differs from the draft vocabulary given to it",
                        path=run_dir, field="d2t")
    drafter.load_state_dict(picked)
    return drafter


def find_specforge_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The float32 draft weights of SpecForge's last checkpoint (``<run>-latest``).

    Read with ``weights_only=True`` (tensors and plain containers only). SpecForge's own
    exporter (``specforge export --to sglang``) writes the same tensors rounded to bf16."""
    from eyas.errors import DataError

    latest = sorted(run_dir.glob("*-latest"))
    if not latest or not (latest[0] / "training_state.pt").is_file():
        raise DataError("no '<run_id>-latest/training_state.pt' (did SpecForge finish?)",
                        path=run_dir)
    state = torch.load(latest[0] / "training_state.pt", map_location="cpu", weights_only=True)
    if "draft_state_dict" not in state:
        raise DataError("no draft_state_dict", path=latest[0] / "training_state.pt")
    return state["draft_state_dict"]


# ----------------------------------------------------------------------------- evaluation
@torch.no_grad()
def per_sample_counts(drafter: Drafter, vocab: DraftVocab, head: torch.Tensor,
                      source: OfflineSource, *, max_len: int | None, steps: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """eyas's simulated acceptance, one eval sample at a time: (correct, total) [N, steps]."""
    drafter.eval()
    batches = Batches(source, micro_batch=1, seed=0, max_len=max_len, shuffle=False)
    target_head = TargetHead(head, vocab)
    correct, total = [], []
    for batch in batches.one_pass():
        teacher = make_teacher(batch, vocab, target_head, torch.device("cpu"))
        r = ttt_loss(drafter, batch.input_ids, batch.loss_mask, batch.aux_hidden, teacher,
                     vocab, steps)
        correct.append(r.correct)
        total.append(r.total)
    return torch.stack(correct), torch.stack(total)


def heldout_prompts(merged: Path, limit: int) -> list[tuple[int, ...]]:
    """Up to `limit` prompts of the merged eval split (a record's tokens before its first
    supervised one), none equal to a training record's prompt: the real drafting's prompts."""
    from eyas.evaluate.prompts import merged_prompts, select, training_prompt_keys

    sel = select([("eval", merged_prompts(merged / "eval.jsonl"))], per_dataset=None,
                 max_tokens=2048, training=training_prompt_keys(merged / "train.jsonl"))
    return [p.ids for p in sel.prompts[:limit]]


def file_prompt_ids(value: str, target_dir: Path, limit: int) -> tuple[str, list[tuple[int, ...]]]:
    """(name, the first `limit` prompts) of a prompt file as phase 6 reads it
    (``evaluate.prompt_files``: ``eyas:humaneval``, or a JSONL of ``{"id", "messages"}``),
    rendered with the target folder's tokenizer and chat template."""
    from eyas.evaluate.prompts import file_prompts, prompt_file_stem, select
    from eyas.evaluate.run import resolve_prompt_file
    from eyas.prepare.tokenize import load_tokenizer

    path = resolve_prompt_file(value)
    sel = select([(str(path), file_prompts(path, load_tokenizer(target_dir)))],
                 per_dataset=limit, max_tokens=2048, training=set())
    if not sel.prompts:
        raise SystemExit(f"--real-prompt-file {value}: no usable prompt in {path} "
                         f"({sel.counts()})")
    return prompt_file_stem(path), [p.ids for p in sel.prompts]


def real_drafting_counts(drafter: Drafter, vocab: DraftVocab, target, prompts: list,
                         *, k: int, max_new_tokens: int, stop_ids=()) -> list[list[int]]:
    """Real drafting, as a server does it: the trained drafter proposes a chain of k tokens,
    the target verifies them (greedy, `eyas.evaluate.speculate.generate`) on each prompt.
    Returns per prompt the tokens kept per verification (accepted drafts + 1: SGLang's
    accept length). `target` is an `eyas.evaluate.target.Target` reading the drafter's aux
    layers."""
    from eyas.evaluate.drafters import EagleDrafter
    from eyas.evaluate.speculate import generate

    method = EagleDrafter(drafter.eval(), vocab)
    with torch.inference_mode():
        return [generate(target, method, ids, max_new_tokens=max_new_tokens, draft_tokens=k,
                         stop_ids=stop_ids).accept_lengths for ids in prompts]


def real_summary(per_seed: dict[str, list[list[list[int]]]], resamples: int) -> dict:
    """τ of real drafting per trainer (Σ kept / Σ verifications over prompts and seeds), with
    95 % intervals bootstrapped over prompts (each prompt's verifications of every seed kept
    together; the same draw for both trainers, so their difference is paired)."""
    from eyas.evaluate.metrics import acceptance_length, bootstrap_ci95, comparison
    from eyas.evaluate.speculate import Generation

    names = list(per_seed)
    pooled = {name: [Generation(tokens=[], accept_lengths=[x for seed in per_seed[name]
                                                            for x in seed[i]])
                     for i in range(len(per_seed[name][0]))] for name in names}
    boot = bootstrap_ci95(pooled, names[0], resamples=resamples)
    out = {name: {"tau": acceptance_length(pooled[name]), "ci95": boot["ci95"][name],
                  "tau_per_seed": [acceptance_length([Generation(tokens=[], accept_lengths=a)
                                                      for a in seed])
                                   for seed in per_seed[name]]} for name in names}
    if len(names) == 2:
        a, b = names
        ta, tb = out[a]["tau"], out[b]["tau"]
        ci = boot["difference_ci95"][b]
        out["difference"] = {"of": f"{a} - {b}", "tau": None if None in (ta, tb) else ta - tb,
                             "ci95": ci, "verdict": comparison(ci)}
    return out


RULES = ("target_only", "rejection")
"""SGLang 0.5.23's two acceptance rules at temperature > 0 (``eyas.evaluate.speculate``)."""


def target_logp(target_NV: torch.Tensor, vocab: DraftVocab, temperature: float) -> torch.Tensor:
    """The target's log-probabilities at `temperature` of the draft vocabulary's tokens,
    float32 [N, Vd]: its softmax over the whole vocabulary (as ``Sampling.probs`` samples it),
    read at the draft columns and not renormalised (the mass outside is never drafted)."""
    t_NV = target_NV.float() / temperature
    return t_NV[:, vocab.draft_to_target.to(t_NV.device)] - t_NV.logsumexp(-1, keepdim=True)


def sampled_acceptance(draft_NVd: torch.Tensor, logp_NVd: torch.Tensor,
                       temperature: float) -> torch.Tensor:
    """Probability that the target accepts one draft at each of N positions, float64 [N, 2]:
    column 0 under SGLang's default rule ``target_only`` (the drafter proposes its argmax d,
    accepted with probability p(d)), column 1 under ``rejection`` (the draft sampled from q,
    accepted with probability min(1, p/q): α = Σ_x min(p(x), q(x)), the quantity the LK losses
    train). `logp_NVd`: `target_logp` at the same temperature; q: the drafter's softmax at
    `temperature` over the draft vocabulary."""
    p_NVd = logp_NVd.float().exp()
    q_NVd = torch.softmax(draft_NVd.detach().float() / temperature, dim=-1)
    greedy = p_NVd.gather(1, q_NVd.argmax(-1, keepdim=True)).squeeze(1)
    return torch.stack([greedy.double(), torch.minimum(p_NVd, q_NVd).sum(-1, dtype=torch.float64)],
                       dim=1)


@torch.no_grad()
def per_sample_sampled(drafter: Drafter, vocab: DraftVocab, head: torch.Tensor,
                       source: OfflineSource, *, max_len: int | None, steps: int,
                       temperatures: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """eyas's simulated acceptance of sampled decoding, one eval sample at a time: (Σ α, total)
    of float64 [N, len(temperatures), len(RULES), steps] and int64 [N, steps].

    The same positions as `per_sample_counts` (step i at origin t scores the token t + 2 + i
    when it is loss-masked; its teacher is the target's distribution at row t + 1 + i), each
    adding its expected acceptance (`sampled_acceptance`) instead of 0 or 1: no sampling noise.
    `head` is the target's whole lm_head [V, H] (the teacher's distribution over every token).
    As the temperature falls to 0, ``target_only`` becomes `per_sample_counts`' argmax match."""
    from eyas.train.ttt import shift, unroll

    drafter.eval()
    batches = Batches(source, micro_batch=1, seed=0, max_len=max_len, shuffle=False)
    alphas, totals = [], []
    for batch in batches.one_pass():
        target_TV = batch.teacher["final_hidden"][0].float() @ head.T
        logp = [target_logp(target_TV, vocab, temp) for temp in temperatures]
        draft = unroll(drafter, batch.input_ids, batch.aux_hidden, steps)
        a = torch.zeros(len(temperatures), len(RULES), steps, dtype=torch.float64)
        total = torch.zeros(steps, dtype=torch.int64)
        for i, logits_BTVd in enumerate(draft):
            rows = (shift(batch.loss_mask, 2 + i) > 0)[0].nonzero().squeeze(1)
            total[i] = rows.numel()
            for j, temp in enumerate(temperatures):
                a[j, :, i] = sampled_acceptance(logits_BTVd[0, rows], logp[j][rows + 1 + i],
                                                temp).sum(0)
        alphas.append(a)
        totals.append(total)
    return torch.stack(alphas), torch.stack(totals)


def real_sampled_counts(drafter: Drafter, vocab: DraftVocab, target, prompts: list, *, k: int,
                        max_new_tokens: int, temperature: float, rule: str) -> list[list[int]]:
    """`real_drafting_counts` at `temperature` under acceptance `rule` (``RULES``): the kept
    tokens per verification on each prompt. Prompt i draws from a generator seeded with i, the
    same for every drafter (common random numbers: differences between drafters are not
    drowned by the draws)."""
    from eyas.evaluate.drafters import EagleDrafter
    from eyas.evaluate.speculate import Sampling, generate

    method = EagleDrafter(drafter.eval(), vocab)
    sampling = Sampling(temperature, rule=rule)
    with torch.inference_mode():
        return [generate(target, method, ids, max_new_tokens=max_new_tokens, draft_tokens=k,
                         sampling=sampling, generator=torch.Generator().manual_seed(i)
                         ).accept_lengths for i, ids in enumerate(prompts)]


def tau_of(correct_Sk: torch.Tensor, total_Sk: torch.Tensor) -> torch.Tensor:
    """τ = 1 + Σ_k Π_{i≤k} acc_i (bonus token counted) from counts summed over samples [.., k]."""
    acc = correct_Sk.double() / total_Sk.double().clamp(min=1)
    return 1 + acc.cumprod(-1).sum(-1)


def bootstrap_tau(counts: list[tuple[torch.Tensor, torch.Tensor]], resamples: int,
                  seed: int = 0) -> torch.Tensor:
    """τ averaged over seeds, for `resamples` bootstrap draws of the eval samples: [resamples].

    `counts` holds one (correct, total) [N, k] per seed, all over the same N samples; each
    draw resamples the samples once and applies the same draw to every seed."""
    n = counts[0][0].shape[0]
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n, (resamples, n), generator=g)
    taus = [tau_of(c[idx].sum(1), t[idx].sum(1)) for c, t in counts]
    return torch.stack(taus).mean(0)


def rate(steps: list[dict], skip: int, clock: str = "seconds") -> float:
    """Training tokens per second of `clock` over the steps after the first `skip`."""
    kept = steps[skip:] or steps
    return sum(x["tokens"] for x in kept) / max(1e-9, sum(x[clock] for x in kept))


def summarise(name: str, counts: list, steps_per_seed: list, skip: int) -> dict:
    """τ (mean over seeds), acc_i (pooled counts) and throughput of one trainer."""
    per_seed = [float(tau_of(c.sum(0), t.sum(0))) for c, t in counts]
    correct = sum(c.sum(0) for c, _ in counts)
    total = sum(t.sum(0) for _, t in counts)
    acc = (correct.double() / total.double().clamp(min=1)).tolist()
    pooled = [x for steps in steps_per_seed for x in steps[skip:]]
    return {"name": name, "tau": sum(per_seed) / len(per_seed), "tau_per_seed": per_seed,
            "acc": acc, "tok_s": rate(pooled, 0), "tok_cpu_s": rate(pooled, 0, "cpu_seconds"),
            "tok_s_per_seed": [rate(st, skip) for st in steps_per_seed]}


# ----------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The harness's flags; `--workdir` and `--recipe` come back absolute."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 seeds x 30 steps (a smoke run)")
    p.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "tiny-demo.yaml")
    p.add_argument("--workdir", type=Path, default=ROOT / "runs" / "vs-specforge",
                   help="run folder of the recipe (phases 1-2 run here when missing)")
    p.add_argument("--eval-fraction", type=float, default=0.3,
                   help="held-out share of the merged samples (the recipe's is small)")
    p.add_argument("--seeds", type=str, help="comma-separated seeds (default 0,1,2; quick 0,1)")
    p.add_argument("--steps", type=int, help="optimizer steps (default: the recipe's)")
    p.add_argument("--threads", type=int, default=2, help="torch threads, both trainers")
    p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples")
    p.add_argument("--real-prompts", type=int, default=24,
                   help="held-out prompts the real-drafting evaluator decodes (0: none)")
    p.add_argument("--real-prompt-file", action="append", default=[], metavar="FILE",
                   help="also score real drafting on this prompt file's prompts, as a set of "
                        "its own (repeatable): eyas:humaneval, or a JSONL of {id, messages} "
                        "as evaluate.prompt_files takes")
    p.add_argument("--real-file-prompts", type=int, default=16,
                   help="prompts taken from each --real-prompt-file (its first N)")
    p.add_argument("--real-new-tokens", type=int, default=48,
                   help="tokens generated per prompt by the real-drafting evaluator")
    p.add_argument("--sampled", type=str, metavar="T[,T..]",
                   help="also score sampled decoding at these temperatures, e.g. 0.7,1.0: "
                        "simulated under both of SGLang's acceptance rules, and real drafting "
                        "under --sampled-rule")
    p.add_argument("--sampled-rule", choices=RULES, default="target_only",
                   help="real drafting's acceptance rule at --sampled temperatures (default "
                        "target_only, SGLang's default and its only rule for a reduced draft "
                        "vocabulary)")
    p.add_argument("--specforge-python", type=Path, default=DEFAULT_VENV / "bin" / "python")
    p.add_argument("--specforge-mask", choices=("aligned", "native"), default="aligned")
    p.add_argument("--specforge-loss-norm", choices=("batch", "valid"), default="batch")
    p.add_argument("--specforge-teacher", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--precision", choices=("bf16", "fp32"), default="bf16",
                   help="both trainers: bf16 (eyas: bf16 autocast; SpecForge: bf16 model, "
                        "float32 master weights in its optimizer, as on a GPU) or fp32")
    p.add_argument("--eyas-storage", choices=("final", "topk", "compact"), default="final",
                   help="hidden-state storage eyas trains on (the train split is extracted "
                        "again in it, K = the recipe's extract.topk); SpecForge and every "
                        "score use final")
    p.add_argument("--only", choices=("eyas", "specforge"),
                   help="train and score this trainer only (its per-seed results are cached "
                        "for a later run of both); prints its own summary")
    p.add_argument("--specforge-no-compile", action="store_true",
                   help="run SpecForge with TORCH_COMPILE_DISABLE=1")
    p.add_argument("--eyas-betas", type=str, help="e.g. 0.9,0.999 (default: eyas's own)")
    p.add_argument("--train-samples", type=int, metavar="N",
                   help="with --only eyas: train on the first N samples of the train split "
                        "(a data-size study; vocabulary and scores stay the whole split's)")
    p.add_argument("--eyas-set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a TrainConfig field for eyas only (repeatable), e.g. "
                        "--eyas-set precision=bf16 --eyas-set min_lr_ratio=0.1")
    p.add_argument("--specforge-set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a schedule field for SpecForge only (repeatable; one of "
                        f"{', '.join(SPECFORGE_FIELDS)}), e.g. --specforge-set lr=1e-3")
    args = p.parse_args(argv)
    if args.train_samples is not None and args.only != "eyas":
        p.error("--train-samples trains eyas only: add --only eyas")
    # SpecForge's trainer runs in its own working folder: every path handed to it (its
    # config, features, output) must not depend on where this harness was started.
    args.workdir, args.recipe = args.workdir.resolve(), args.recipe.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    eyas_over = parse_overrides(args.eyas_set)
    sf_over = parse_overrides(args.specforge_set, flag="--specforge-set",
                              allowed=SPECFORGE_FIELDS)

    version = specforge_version(args.specforge_python)
    if version is None and args.only != "eyas":
        print(INSTALL_HINT.format(python=args.specforge_python), file=sys.stderr)
        return 2
    if version is not None and version != SPECFORGE_VERSION:
        print(f"warning: SpecForge {version} found, this harness was written for "
              f"{SPECFORGE_VERSION}", file=sys.stderr)
    sizes = QUICK if args.quick else FULL
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else sizes["seeds"]
    temperatures = [float(t) for t in args.sampled.split(",")] if args.sampled else []
    if any(t <= 0 for t in temperatures):
        raise SystemExit(f"--sampled {args.sampled}: temperatures must be > 0 (greedy is "
                         "always scored)")
    torch.set_num_threads(args.threads)

    # what every run shares is prepared under the setup lock; training and scoring are not
    setup = contextlib.ExitStack()
    setup.enter_context(setup_lock(args.workdir))
    data = prepare_data(args.recipe, args.workdir, args.eval_fraction, args.eyas_storage)
    cfg: PipelineConfig = data["cfg"]
    bench: Path = data["bench"]
    steps = args.steps or sizes["steps"] or cfg.train.steps
    specforge_dtype = {"bf16": "bfloat16", "fp32": "float32"}[args.precision]
    update = {"steps": steps, "device": "cpu", "precision": args.precision,
              "warmup_steps": min(cfg.train.warmup(steps), max(1, steps // 10))}
    if args.eyas_betas:
        update["betas"] = tuple(float(b) for b in args.eyas_betas.split(","))
    base = cfg.train.model_copy(update=update)
    eyas_cfg = TrainConfig.model_validate(base.model_dump() | eyas_over)
    if eyas_cfg.drafter == "mla" and eyas_cfg.mla.init_attention == "target":
        raise SystemExit("train.mla.init_attention: target is not in this harness (eyas.train.run "
                         "reads the target's last attention layer for it); set it to random")
    sf_cfg = TrainConfig.model_validate(base.model_dump() | sf_over)
    train_src, eval_src = OfflineSource(data["train"]), OfflineSource(data["eval"])
    # what eyas trains on: the same samples, in `--eyas-storage` (the vocabulary, SpecForge's
    # features and every score come from the "final" shards, as before)
    eyas_src = train_src if args.eyas_storage == "final" else OfflineSource(data["eyas_train"])
    if args.train_samples is not None:
        eyas_src = FirstSamples(eyas_src, args.train_samples)

    from eyas.extract.target import (
        load_target_embeddings,
        load_target_final_norm,
        load_target_lm_head,
    )
    from eyas.train.export import sglang_config

    target_config = read_json(data["target"] / "config.json")
    target_config = target_config.get("text_config", target_config)
    vocab_size = int(target_config["vocab_size"])
    vocab, _ = load_or_build(bench / "vocab", train_src.identity(),
                             min(base.draft_vocab_size, vocab_size), vocab_size,
                             train_src.masked_tokens())
    # eyas's own draft vocabulary (`--eyas-set draft_vocab_size=N`); SpecForge keeps the recipe's
    eyas_vocab = vocab if eyas_cfg.draft_vocab_size == base.draft_vocab_size else load_or_build(
        bench / "vocab", train_src.identity(), min(eyas_cfg.draft_vocab_size, vocab_size),
        vocab_size, train_src.masked_tokens())[0]
    vocabs = {"eyas": eyas_vocab, "specforge": vocab}
    dcfg = DrafterConfig.from_target(target_config, vocab.size)
    if base.intermediate_size:
        dcfg = dcfg.model_copy(update={"intermediate_size": base.intermediate_size})
    # eyas's drafter as its config makes it (kind, EAGLE-3.1 norms, MLA sizes): what
    # `eyas.train.run` builds; SpecForge trains the recipe's Llama-style layer as before
    eyas_dcfg = DrafterConfig.from_target(target_config, eyas_vocab.size,
                                          attention=eyas_cfg.drafter,
                                          overrides=eyas_cfg.drafter_overrides())
    if eyas_cfg.intermediate_size:
        eyas_dcfg = eyas_dcfg.model_copy(
            update={"intermediate_size": eyas_cfg.intermediate_size})
    shapes = {"eyas": eyas_dcfg, "specforge": dcfg}
    embed = load_target_embeddings(data["target"]).float()
    head = load_target_lm_head(data["target"]).float()

    sf = bench / "specforge"
    sf_target, lm_head_key = specforge_target(data["target"], sf / "target")
    draft_config = sf / "draft_config.json"
    write_json(draft_config, sglang_config(dcfg, train_src.aux_layers, dtype="float32",
                                           target_config=target_config))
    vocab_mapping = sf / "vocab_mapping.pt"
    with atomic_write(vocab_mapping, "wb") as fh:
        torch.save({"t2d": vocab.t2d, "d2t": vocab.d2t}, fh)
    align = args.specforge_mask == "aligned"
    tag = "aligned" if align else "native"
    n_train = export_features(data["train"], sf / f"features-{tag}" / "train", align_mask=align)
    export_features(data["eval"], sf / f"features-{tag}" / "eval", align_mask=align)
    setup.close()

    names = [args.only] if args.only else ["eyas", "specforge"]
    counts = {split: count_tokens(src.masked_tokens(), vocab_size)
              for split, src in (("train", train_src), ("held-out", eval_src))}
    print("draft vocabulary coverage of the supervised tokens: " + "; ".join(
        f"{name} {vocabs[name].size:,} (" + ", ".join(
            f"{split} {coverage(vocabs[name], c):.1%}" for split, c in counts.items())
        + ")" for name in names), flush=True)
    fingerprint = data_fingerprint(bench / "merged")
    print(f"data: {len(train_src)} train / {len(eval_src)} eval samples "
          f"({args.recipe.name}, eval fraction {args.eval_fraction}; merged splits' sha256 "
          f"train {fingerprint['train']}, eval {fingerprint['eval']}); drafter H "
          f"{dcfg.hidden_size}, MLP {dcfg.intermediate_size}, draft vocabulary {vocab.size}; "
          f"{steps} steps x micro-batch {base.micro_batch}, lr {base.lr}, warmup "
          f"{base.warmup_steps}, max_len {base.max_len}; seeds {seeds}; {args.threads} "
          f"thread(s); SpecForge {version or 'not installed'}, mask {tag}, loss norm {args.specforge_loss_norm}, "
          f"teacher {args.specforge_teacher}, dtype {specforge_dtype}; eyas betas "
          f"{eyas_cfg.betas}"
          + (f", eyas trains on the first {len(eyas_src)} train samples "
             f"({steps * base.micro_batch / len(eyas_src):.2f} epochs)"
             if args.train_samples is not None else "")
          + (f", eyas {' '.join(args.eyas_set)}" if args.eyas_set else "")
          + (f", eyas trains on storage {args.eyas_storage} ({eyas_src.storage}, "
             f"{folder_bytes(data['eyas_train']) / folder_bytes(data['train']):.2f}x the "
             "bytes of final)"
             if args.eyas_storage != "final" else "")
          + (f", SpecForge {' '.join(args.specforge_set)}" if args.specforge_set else ""),
          flush=True)
    from eyas.evaluate.target import Target, load_target

    real_prompts = heldout_prompts(bench / "merged", args.real_prompts)
    # each prompt set real drafting scores: the held-out split's, then each prompt file's
    prompt_sets = {"held-out": real_prompts} if real_prompts else {}
    for value in args.real_prompt_file:
        label, ids = file_prompt_ids(value, data["target"], args.real_file_prompts)
        prompt_sets[label] = ids
    real_target = Target(load_target(data["target"], torch.device("cpu"), torch.float32),
                         train_src.aux_layers)
    print(f"real drafting: {len(real_prompts)} held-out prompts of the merged eval split"
          + "".join(f", {len(ids)} of {label}" for label, ids in prompt_sets.items()
                    if label != "held-out")
          + f", up to {args.real_new_tokens} new tokens, {base.ttt_steps} draft tokens, greedy "
          "(eyas.evaluate: the target verifies the drafts, as SGLang does)", flush=True)

    results = {name: ([], []) for name in names}
    k = base.ttt_steps
    data_key = {"train_data": train_src.identity(), "threads": args.threads,
                "harness": RESULT_FORMAT}
    shared = ("steps", *SPECFORGE_FIELDS)
    settings = {
        "eyas": data_key | {"train_data": eyas_src.identity(),
                            "train": eyas_cfg.model_dump(mode="json", exclude={"seed"}),
                            "code": code_hash(ROOT / "eyas" / "train")},
        "specforge": data_key | {"train": {f: getattr(sf_cfg, f) for f in shared},
                                 "specforge": [version, tag, args.specforge_loss_norm,
                                               args.specforge_teacher,
                                               not args.specforge_no_compile,
                                               specforge_dtype],
                                 "code": code_hash(DRIVER)},
    }
    keys = {name: hashlib.sha256(json.dumps(v, sort_keys=True).encode()).hexdigest()[:12]
            for name, v in settings.items()}

    evaluator = code_hash(per_sample_counts, *(ROOT / "eyas" / "train" / f for f in
                                               ("ttt.py", "model.py", "data.py", "trainer.py")))

    def trained(name: str, seed: int) -> tuple[dict, list]:
        """(final weights, per-step timings) of one trainer and seed: cached, else trained."""
        path = bench / "results" / f"{name}-{keys[name]}-seed{seed}.pt"
        if path.is_file():
            saved = torch.load(path, weights_only=True)
            rows = saved["weights"]["lm_head.weight"].shape[0]
            if rows != vocabs[name].size:  # a cache from before a draft vocabulary change
                raise SystemExit(f"{path} holds a drafter of a {rows:,}-token draft vocabulary, "
                                 f"this run's {name} uses {vocabs[name].size:,}: delete it")
            print(f"seed {seed} {name}: trained by an earlier run with the same settings "
                  f"({path.name})", flush=True)
            return saved["weights"], saved["steps"]
        if name == "eyas":
            drafter, st = train_eyas(eyas_cfg.model_copy(update={"seed": seed}), eyas_dcfg,
                                     eyas_vocab,
                                     embed, head, eyas_src, bench / "eyas" / f"seed{seed}",
                                     load_target_final_norm(data["target"]),
                                     label=f"seed {seed} eyas training")
        else:
            run_cfg = specforge_run_config(
                seed=seed, tcfg=sf_cfg.model_copy(update={"seed": seed}),
                run_dir=sf / "runs" / f"seed{seed}", target=sf_target, lm_head_key=lm_head_key,
                draft_config=draft_config, vocab_mapping=vocab_mapping,
                train_features=sf / f"features-{tag}" / "train",
                eval_features=sf / f"features-{tag}" / "eval", n_train=n_train,
                dtype=specforge_dtype)
            print(f"seed {seed} SpecForge training (its log: "
                  f"{sf / 'work' / (run_cfg['run_id'] + '.log')})", flush=True)
            stats = train_specforge(args.specforge_python, run_cfg, sf / "work",
                                    threads=args.threads, loss_norm=args.specforge_loss_norm,
                                    teacher=args.specforge_teacher,
                                    compile_=not args.specforge_no_compile)
            drafter = load_specforge_drafter(Path(run_cfg["output_dir"]), dcfg, embed, vocab)
            st = stats["steps"]
            own = (stats.get("eval") or [{}])[-1].get("eval/per_position_acc")
            if own:
                print(f"seed {seed} SpecForge's own eval of the same drafter (bf16 teacher, its "
                      "own batching): acc " + " ".join(f"{a:.3f}" for a in own), flush=True)
        weights = {n: t.detach().clone() for n, t in drafter.state_dict().items()}
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"weights": weights, "steps": st, "settings": json.dumps(settings[name])},
                   path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)
        return weights, st

    def cached(prefix: str, key: str, weights: dict, dcfg: DrafterConfig, suffix: str,
               compute: Callable[[Drafter], object]):
        """A drafter's score, kept in ``results/<prefix>-<hash>.<suffix>`` (.pt: tensors,
        .json: lists) under a hash of `key` (the scoring code, its data and settings) and the
        weights: `compute` runs once, on a Drafter loaded with them, and is written atomically."""
        h = hashlib.sha256(key.encode())
        for n in sorted(weights):
            h.update(n.encode() + weights[n].float().numpy().tobytes())
        path = bench / "results" / f"{prefix}-{h.hexdigest()[:16]}{suffix}"
        if path.is_file():
            return tuple(torch.load(path, weights_only=True)) if suffix == ".pt" \
                else read_json(path)
        drafter = Drafter(dcfg, embed)
        drafter.load_state_dict(weights)
        out = compute(drafter)
        if suffix == ".pt":
            torch.save(list(out), path.with_suffix(".tmp"))
            path.with_suffix(".tmp").replace(path)
        else:
            write_json(path, out)
        return out

    def scored(weights: dict, dcfg: DrafterConfig, vocab: DraftVocab
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample (correct, total) of a drafter: cached by its weights and the evaluator."""
        return cached("eval", f"{evaluator} {eval_src.identity()} {base.max_len} {k}", weights,
                      dcfg, ".pt", lambda d: per_sample_counts(d, vocab, head, eval_src,
                                                               max_len=base.max_len, steps=k))

    real_code = code_hash(real_drafting_counts, *(ROOT / "eyas" / "evaluate" / f for f in
                                                  ("speculate.py", "drafters.py", "target.py")))

    def drafted(weights: dict, dcfg: DrafterConfig, vocab: DraftVocab,
                prompts: list) -> list[list[int]]:
        """Real drafting's accept lengths per prompt: cached by the weights, the prompts and
        the code."""
        return cached("real", f"{real_code} {prompts} {args.real_new_tokens} {k}", weights,
                      dcfg, ".json", lambda d: real_drafting_counts(
                          d, vocab, real_target, prompts, k=k,
                          max_new_tokens=args.real_new_tokens))

    sampled_code = code_hash(per_sample_sampled, sampled_acceptance, target_logp,
                             *(ROOT / "eyas" / "train" / f for f in ("ttt.py", "model.py",
                                                                      "data.py")))

    def sampled_scored(weights: dict, dcfg: DrafterConfig, vocab: DraftVocab
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """Simulated sampled acceptance per sample (`per_sample_sampled`): cached."""
        return cached("sampled", f"{sampled_code} {eval_src.identity()} {base.max_len} {k} "
                      f"{temperatures}", weights, dcfg, ".pt", lambda d: per_sample_sampled(
                          d, vocab, head, eval_src, max_len=base.max_len, steps=k,
                          temperatures=temperatures))

    real_sampled_code = code_hash(real_sampled_counts, *(ROOT / "eyas" / "evaluate" / f for f in
                                                         ("speculate.py", "drafters.py",
                                                          "target.py")))

    def drafted_sampled(weights: dict, dcfg: DrafterConfig, vocab: DraftVocab,
                        prompts: list, temperature: float) -> list[list[int]]:
        """Real drafting's accept lengths per prompt at `temperature`: cached."""
        return cached("real-sampled", f"{real_sampled_code} {prompts} "
                      f"{args.real_new_tokens} {k} {temperature} {args.sampled_rule}", weights,
                      dcfg, ".json", lambda d: real_sampled_counts(
                          d, vocab, real_target, prompts, k=k,
                          max_new_tokens=args.real_new_tokens, temperature=temperature,
                          rule=args.sampled_rule))

    # real drafting's accept lengths: [prompt set][trainer] -> per seed, per prompt
    real: dict[str, dict[str, list]] = {label: {name: [] for name in names}
                                        for label in prompt_sets}
    sampled: dict[str, list] = {name: [] for name in names}
    real_at: dict[float, dict[str, dict[str, list]]] = {
        t: {label: {name: [] for name in names} for label in prompt_sets} for t in temperatures}

    def mean_length(lengths: list[list[int]]) -> float:
        n_ver = sum(len(x) for x in lengths)
        return sum(map(sum, lengths)) / n_ver if n_ver else float("nan")

    def others(taus: dict[str, float]) -> str:
        """`; label τ` for the prompt sets besides the held-out one."""
        return "".join(f"; {label} {tau:.3f}" for label, tau in taus.items()
                       if label != "held-out")

    for seed in seeds:
        for name in results:
            weights, st = trained(name, seed)
            counts = scored(weights, shapes[name], vocabs[name])
            results[name][0].append(counts)
            results[name][1].append(st)
            c, t = counts
            acc = (c.sum(0).double() / t.sum(0).double().clamp(min=1)).tolist()
            taus = {}
            for label, prompts in prompt_sets.items():
                lengths = drafted(weights, shapes[name], vocabs[name], prompts)
                real[label][name].append(lengths)
                taus[label] = mean_length(lengths)
            print(f"seed {seed} {name:>9}: tau {float(tau_of(c.sum(0), t.sum(0))):.3f} "
                  f"(real drafting {taus.get('held-out', float('nan')):.3f}{others(taus)})  acc "
                  + " ".join(f"{a:.3f}" for a in acc)
                  + f"  {rate(st, sizes['skip_steps']):,.0f} tok/s, "
                  f"{rate(st, sizes['skip_steps'], 'cpu_seconds'):,.0f} tok/CPU-s", flush=True)
            if not temperatures:
                continue
            a, tot = sampled_scored(weights, shapes[name], vocabs[name])
            sampled[name].append((a, tot))
            for j, temp in enumerate(temperatures):
                taus = {}
                for label, prompts in prompt_sets.items():
                    lengths = drafted_sampled(weights, shapes[name], vocabs[name], prompts, temp)
                    real_at[temp][label][name].append(lengths)
                    taus[label] = mean_length(lengths)
                print(f"seed {seed} {name:>9} at T {temp}: simulated tau " + ", ".join(
                    f"{rule} {float(tau_of(a[:, j, r].sum(0), tot.sum(0))):.3f}"
                    for r, rule in enumerate(RULES))
                    + f" (real drafting, {args.sampled_rule}: "
                    f"{taus.get('held-out', float('nan')):.3f}{others(taus)})", flush=True)

    skip = sizes["skip_steps"]
    summary = {name: summarise(name, results[name][0], results[name][1], skip)
               for name in results}
    boots = {name: bootstrap_tau(results[name][0], args.bootstrap) for name in results}
    for name, s in summary.items():
        se_eval = float(boots[name].std())
        per = torch.tensor(s["tau_per_seed"], dtype=torch.float64)
        se_seed = float(per.std() / math.sqrt(len(per))) if len(per) > 1 else 0.0
        s.update(se_eval=se_eval, se_seed=se_seed, se=math.hypot(se_eval, se_seed))
    real_by_set = {label: real_summary(real[label], args.bootstrap) for label in prompt_sets}
    real_s = real_by_set.get("held-out")
    n_eval_tokens = int(results[names[0]][0][0][1][:, 0].sum())
    print(f"\nscored by eyas's simulated acceptance on {len(eval_src)} held-out samples "
          f"({n_eval_tokens:,} step-0 positions), {len(seeds)} seed(s); tok/s after "
          f"{skip} warm-up steps")
    print(f"{'trainer':>10} | {'tok/s':>8} | {'tok/CPU-s':>9} | {'tau':>6} | {'se':>6} | "
          f"acc_0..acc_{k - 1}")
    for s in summary.values():
        print(f"{s['name']:>10} | {s['tok_s']:8,.0f} | {s['tok_cpu_s']:9,.0f} | {s['tau']:6.3f} | "
              f"{s['se']:6.3f} | " + " ".join(f"{a:.3f}" for a in s["acc"]))
    def set_name(label: str) -> str:
        return (f"{len(prompt_sets[label])} held-out prompts" if label == "held-out"
                else f"{len(prompt_sets[label])} prompts of {label}")

    def print_difference(r_s: dict, where: str) -> None:
        if "difference" in r_s:
            d = r_s["difference"]
            ci = d["ci95"] or [float("nan")] * 2
            print(f"eyas - SpecForge, real drafting{where}: τ {d['tau']:+.3f} [{ci[0]:+.3f}–"
                  f"{ci[1]:+.3f}]: eyas {d['verdict']}")

    for label, r_s in real_by_set.items():
        print(f"\nscored by real drafting (the target verifies; τ = SGLang's accept length) on "
              f"{set_name(label)}, {len(seeds)} seed(s); 95 % intervals bootstrapped over "
              "prompts")
        for name in names:
            r = r_s[name]
            ci = r["ci95"] or [float("nan")] * 2
            print(f"{name:>10} | real τ {r['tau']:.3f} [{ci[0]:.3f}–{ci[1]:.3f}] | simulated τ "
                  f"{summary[name]['tau']:.3f}")
        print_difference(r_s, "" if label == "held-out" else f" on {label}")
    for name in names:
        if real_s:
            summary[name]["real_drafting"] = real_s[name]
        extra = {label: r_s[name] for label, r_s in real_by_set.items() if label != "held-out"}
        if extra:
            summary[name]["real_drafting_by_set"] = extra
    for j, temp in enumerate(temperatures):
        print(f"\nsampled at temperature {temp}: simulated τ per rule (± se: eval samples "
              f"bootstrapped, seeds' spread), acc of target_only; real drafting under "
              f"{args.sampled_rule} on " + ", ".join(map(set_name, prompt_sets)) + " [95 %]")
        real_t_by_set = {label: real_summary(real_at[temp][label], args.bootstrap)
                         for label in prompt_sets}
        real_t = real_t_by_set.get("held-out")
        for name in names:
            row = {}
            for r, rule in enumerate(RULES):
                counts_r = [(a[:, j, r], tot) for a, tot in sampled[name]]
                per = torch.tensor([float(tau_of(c.sum(0), t.sum(0))) for c, t in counts_r],
                                   dtype=torch.float64)
                se_seed = float(per.std() / math.sqrt(len(per))) if len(per) > 1 else 0.0
                se = math.hypot(float(bootstrap_tau(counts_r, args.bootstrap).std()), se_seed)
                acc = (sum(c.sum(0) for c, _ in counts_r)
                       / sum(t.sum(0) for _, t in counts_r).double().clamp(min=1)).tolist()
                row[rule] = {"tau": float(per.mean()), "se": se, "tau_per_seed": per.tolist(),
                             "acc": acc}
            if real_t:
                row["real_drafting"] = real_t[name] | {"rule": args.sampled_rule}
            extra = {label: r_t[name] | {"rule": args.sampled_rule}
                     for label, r_t in real_t_by_set.items() if label != "held-out"}
            if extra:
                row["real_drafting_by_set"] = extra
            summary[name].setdefault("sampled", {})[str(temp)] = row
            reals = []
            for label, r_t in real_t_by_set.items():
                ci = r_t[name]["ci95"] or [float("nan")] * 2
                reals.append(f" | real τ{'' if label == 'held-out' else ' ' + label} "
                             f"{r_t[name]['tau']:.3f} [{ci[0]:.3f}–{ci[1]:.3f}]")
            print(f"{name:>10} | " + " | ".join(f"{rule} {row[rule]['tau']:.3f} ± "
                                               f"{row[rule]['se']:.3f}" for rule in RULES)
                  + " | acc " + " ".join(f"{x:.3f}" for x in row["target_only"]["acc"])
                  + "".join(reals))
        for label, r_t in real_t_by_set.items():
            print_difference(r_t, f" at T {temp}" + ("" if label == "held-out"
                                                     else f" on {label}"))
    if args.only:
        s = summary[args.only]
        print(json.dumps({f"{args.only}_tau": round(s["tau"], 4),
                          f"{args.only}_tau_se": round(s["se"], 4),
                          f"{args.only}_tok_s": round(s["tok_s"], 1),
                          f"{args.only}_tok_cpu_s": round(s["tok_cpu_s"], 1),
                          "detail": s, "seeds": seeds, "steps": steps,
                          "eyas_set": args.eyas_set, "specforge_set": args.specforge_set,
                          "threads": args.threads, "data": fingerprint,
                          "train_samples": len(eyas_src if args.only == "eyas" else train_src)}))
        return 0
    diff = summary["eyas"]["tau"] - summary["specforge"]["tau"]
    se_diff_eval = float((boots["eyas"] - boots["specforge"]).std())
    se_diff = math.sqrt(se_diff_eval**2 + summary["eyas"]["se_seed"] ** 2
                        + summary["specforge"]["se_seed"] ** 2)
    print(f"eyas - SpecForge: tau {diff:+.3f} +- {se_diff:.3f} (eval samples paired); throughput ratio "
          f"{summary['eyas']['tok_s'] / summary['specforge']['tok_s']:.2f}x (tok/s), "
          f"{summary['eyas']['tok_cpu_s'] / summary['specforge']['tok_cpu_s']:.2f}x (tok/CPU-s)")
    out = {
        "eyas_tau": round(summary["eyas"]["tau"], 4),
        "specforge_tau": round(summary["specforge"]["tau"], 4),
        "tau_se": round(max(summary["eyas"]["se"], summary["specforge"]["se"]), 4),
        "eyas_tok_s": round(summary["eyas"]["tok_s"], 1),
        "specforge_tok_s": round(summary["specforge"]["tok_s"], 1),
        "eyas_tau_se": round(summary["eyas"]["se"], 4),
        "specforge_tau_se": round(summary["specforge"]["se"], 4),
        "tau_diff": round(diff, 4), "tau_diff_se": round(se_diff, 4),
        "eyas_real_tau": real_s and real_s["eyas"]["tau"],
        "specforge_real_tau": real_s and real_s["specforge"]["tau"],
        "real_tau_diff": real_s and real_s["difference"],
        "real_tau_diff_by_set": {label: r_s["difference"] for label, r_s in real_by_set.items()
                                 if label != "held-out"},
        "detail": summary, "seeds": seeds, "steps": steps,
        "eval_samples": len(eval_src), "train_samples": len(train_src), "data": fingerprint,
        "settings": {"specforge_mask": tag, "specforge_loss_norm": args.specforge_loss_norm,
                     "specforge_teacher": args.specforge_teacher,
                     "specforge_compile": not args.specforge_no_compile,
                     "specforge_dtype": specforge_dtype, "precision": args.precision,
                     "eyas_betas": list(eyas_cfg.betas), "eyas_set": args.eyas_set,
                     "specforge_set": args.specforge_set, "threads": args.threads, "eval_fraction": args.eval_fraction},
        "tok_cpu_s": {name: round(s["tok_cpu_s"], 1) for name, s in summary.items()},
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
