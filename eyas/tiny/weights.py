"""The tiny target's trained weights, shipped with eyas, and the script that makes them.

A target worth drafting for must write varied, on-topic answers, and training one takes hours
of CPU, more than CI or a first demo run can spend. So the weights are trained once, by this
script, and shipped in ``eyas/assets/tiny_target/`` (about 8.5 MB):

    model.safetensors   the weights in float16 (the tied embedding stored once)
    tokenizer.json      the byte-level BPE they were trained with
    recipe.json         what they are: recipe fingerprint and settings, SHA-256 of the training
                        data, tokenizer and weights, the Python and torch that trained them,
                        training stats, and the diversity of their answers to the demo prompts

Retrain them (deterministic: the same Python, torch and settings give the same weights;
resumable from its checkpoint; hours on one CPU core)::

    python -m eyas.tiny.weights --checkpoint-dir /tmp/tiny-target-ckpt

Check the shipped files against the code (``--data`` also rebuilds the training data and the
tokenizer and compares their hashes; that needs the Python version that trained them)::

    python -m eyas.tiny.weights --check [--data]

Change `RECIPE_VERSION` or `TrainSettings` and the check fails until the weights are retrained.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from eyas.errors import EyasError
from eyas.io import read_json, replace_dir, sha256_file, write_json
from eyas.manifest import config_fingerprint

RECIPE_VERSION = 2
"""Bump when the training data, the model or its training changes (then retrain)."""
WEIGHTS = "model.safetensors"
TOKENIZER = "tokenizer.json"
RECORD = "recipe.json"
_TIED = "lm_head.weight"  # tied to the embedding: not stored

log = logging.getLogger("eyas.tiny")


def shipped_dir() -> Path:
    """``eyas/assets/tiny_target``: where the shipped weights live."""
    return Path(__file__).resolve().parent.parent / "assets" / "tiny_target"


def recipe() -> dict:
    """What the weights are made by, independent of the machine: version and settings."""
    from eyas.tiny.model import TrainSettings

    return {"version": RECIPE_VERSION, "settings": TrainSettings().to_json()}


def recipe_fingerprint() -> str:
    """A hash of `recipe()`; recorded with the weights and checked against the code."""
    return config_fingerprint(recipe())


def read_record(folder: Path | None = None) -> dict:
    """The ``recipe.json`` of shipped weights (EyasError when missing or unreadable)."""
    path = (folder or shipped_dir()) / RECORD
    if not path.is_file():
        raise EyasError(f"{path} not found: the tiny target's weights are not shipped here")
    return read_json(path)


# --------------------------------------------------------------------------- loading


def load_tokenizer_object(folder: Path | None = None):
    """The shipped `tokenizers.Tokenizer`."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str((folder or shipped_dir()) / TOKENIZER))


def load_model(folder: Path | None = None, tokenizer=None):
    """The shipped weights as a float32 ``LlamaForCausalLM`` in eval mode.

    `tokenizer` is a transformers tokenizer of the shipped ``tokenizer.json`` (built from it
    when None). Raises EyasError when the stored tensors do not fit the recorded architecture.
    """
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    from eyas.tiny.model import TrainSettings, tiny_llama_config
    from eyas.tiny.tokenizer import fast_tokenizer

    folder = folder or shipped_dir()
    settings = TrainSettings(**read_record(folder)["settings"])
    if tokenizer is None:
        tokenizer = fast_tokenizer(load_tokenizer_object(folder))
    model = LlamaForCausalLM(tiny_llama_config(tokenizer, settings))
    tensors = {k: v.to(torch.float32) for k, v in load_file(folder / WEIGHTS).items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if set(missing) != {_TIED} or unexpected:
        raise EyasError(
            f"{folder / WEIGHTS}: tensors do not fit the recorded architecture "
            f"(missing {sorted(set(missing) - {_TIED})}, unexpected {sorted(unexpected)})"
        )
    model.tie_weights()
    model.eval()
    return model


# --------------------------------------------------------------------------- checks


def check_shipped(folder: Path | None = None) -> list[str]:
    """Problems of the shipped weights against the code's recipe; empty when they match.

    Checks the record exists, names this code's recipe fingerprint, and that the weights and
    tokenizer files are the ones it describes (SHA-256: catches a truncated file or a Git LFS
    pointer), in float16, with the tensor names and shapes of the recorded architecture.
    """
    from safetensors import safe_open

    folder = folder or shipped_dir()
    try:
        record = read_record(folder)
    except EyasError as exc:
        return [str(exc)]
    problems = []
    if record.get("recipe") != recipe_fingerprint():
        problems.append(
            f"{folder / RECORD}: weights trained for recipe {record.get('recipe')} "
            f"({record.get('recipe_detail')}), the code's recipe is {recipe_fingerprint()} "
            f"({recipe()}): retrain with `python -m eyas.tiny.weights`"
        )
    for name, key in ((WEIGHTS, "weights_sha256"), (TOKENIZER, "tokenizer_sha256")):
        path = folder / name
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif sha256_file(path) != record.get(key):
            problems.append(f"{path}: SHA-256 differs from {key} in {RECORD} (corrupt or replaced)")
    if problems:
        return problems
    with safe_open(str(folder / WEIGHTS), framework="pt") as f:
        dtypes = {str(f.get_slice(k).get_dtype()) for k in f.keys()}
        if dtypes != {"F16"}:
            problems.append(f"{folder / WEIGHTS}: expected float16 tensors, found {sorted(dtypes)}")
    try:
        load_model(folder)
    except (EyasError, RuntimeError) as exc:
        problems.append(str(exc))
    return problems


def check_training_data(folder: Path | None = None) -> list[str] | None:
    """Rebuild the tokenizer and the training rows; problems if their hashes differ.

    Returns None when the running Python is not the one that trained the weights (the
    standard library is the training text, so another version gives other data). Slow: the
    tokenizer is trained and every conversation encoded (a minute or so).
    """
    from transformers import AutoTokenizer

    from eyas.tiny.model import TrainSettings, data_fingerprint, packed_rows
    from eyas.tiny.tokenizer import build_tokenizer

    folder = folder or shipped_dir()
    record = read_record(folder)
    if record["python"] != sys.version.split()[0]:
        return None
    problems = []
    with tempfile.TemporaryDirectory(prefix="eyas-tiny-tok-") as tmp:
        tok_dir = build_tokenizer(Path(tmp))
        if sha256_file(tok_dir / TOKENIZER) != record["tokenizer_sha256"]:
            problems.append(
                f"the tokenizer built now differs from the shipped {folder / TOKENIZER}"
            )
        tokenizer = AutoTokenizer.from_pretrained(tok_dir)
        settings = TrainSettings(**record["settings"])
        data = data_fingerprint(*packed_rows(tokenizer, settings))
    if data != record["stats"]["data_sha256"]:
        problems.append(
            f"the training data built now ({data}) differs from what the shipped weights were "
            f"trained on ({record['stats']['data_sha256']}): bump RECIPE_VERSION and retrain"
        )
    return problems


# --------------------------------------------------------------------------- training


def export_weights(model, out_dir: Path) -> Path:
    """Save `model`'s weights as float16 safetensors (without the tied head) in `out_dir`."""
    import torch
    from safetensors.torch import save_file

    tensors = {
        k: v.detach().to(torch.float16).contiguous()
        for k, v in model.state_dict().items()
        if k != _TIED
    }
    path = Path(out_dir) / WEIGHTS
    save_file(tensors, str(path), metadata={"recipe": recipe_fingerprint()})
    return path


def assemble(folder: Path, *, shipped: Path | None = None) -> Path:
    """Write the Hugging Face model folder of the shipped weights (`shipped`) into `folder`.

    Config, float32 safetensors, generation config (greedy, eos = end of turn) and tokenizer
    files; no build record. Returns `folder`.
    """
    from eyas.hf import transformers_names
    from eyas.tiny.tokenizer import save_tokenizer

    AutoTokenizer, GenerationConfig = transformers_names("AutoTokenizer", "GenerationConfig")

    save_tokenizer(load_tokenizer_object(shipped), folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = load_model(shipped, tokenizer)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def train_weights(
    out_dir: Path | None = None,
    *,
    checkpoint_dir: Path | None = None,
    log_fn: Callable[[str], None] | None = None,
) -> Path:
    """Train the tiny target from scratch and write its shipped files into `out_dir`.

    `out_dir` defaults to `shipped_dir()`; its files are replaced together at the end (a
    failed run leaves them as they were). With `checkpoint_dir` the training resumes from,
    and saves to, that folder. Returns `out_dir`.
    """
    import torch
    from transformers import AutoTokenizer

    from eyas.tiny.answers import answer_stats
    from eyas.tiny.model import TrainSettings, train_tiny_llama
    from eyas.tiny.tokenizer import build_tokenizer

    out_dir = Path(out_dir or shipped_dir())
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    log_fn = log_fn or log.info
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out_dir.name}-", dir=out_dir.parent))
    try:
        with tempfile.TemporaryDirectory(prefix="eyas-tiny-") as work_str:
            work = Path(work_str)
            tok_dir = build_tokenizer(work / "tokenizer")
            shutil.copyfile(tok_dir / TOKENIZER, tmp / TOKENIZER)
            tokenizer = AutoTokenizer.from_pretrained(tok_dir)
            settings = TrainSettings()
            log_fn(f"training the tiny target: {settings}")
            model, stats = train_tiny_llama(
                tokenizer, settings, log=log_fn, checkpoint_dir=checkpoint_dir
            )
            export_weights(model, tmp)
            record = {
                "recipe": recipe_fingerprint(),
                "recipe_detail": recipe(),
                "settings": settings.to_json(),
                "weights_sha256": sha256_file(tmp / WEIGHTS),
                "tokenizer_sha256": sha256_file(tmp / TOKENIZER),
                "python": sys.version.split()[0],
                "torch": torch.__version__,
                "transformers": __import__("transformers").__version__,
                "stats": stats,
            }
            write_json(tmp / RECORD, record)
            log_fn("measuring the answers to the demo prompts")
            record["answers"] = answer_stats(assemble(work / "model", shipped=tmp))
            write_json(tmp / RECORD, record)
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def main(argv: list[str] | None = None) -> int:
    """``python -m eyas.tiny.weights``: retrain the shipped weights, or check them."""
    parser = argparse.ArgumentParser(
        prog="python -m eyas.tiny.weights", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", type=Path, help="write here instead of eyas/assets/tiny_target")
    parser.add_argument("--checkpoint-dir", type=Path, help="resume from / checkpoint to here")
    parser.add_argument("--check", action="store_true", help="check the shipped files, no training")
    parser.add_argument("--data", action="store_true", help="with --check: also the training data")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.check:
        problems = check_shipped(args.out)
        if args.data and not problems:
            data_problems = check_training_data(args.out)
            if data_problems is None:
                print("training data not checked: trained on another Python version")
            problems += data_problems or []
        for problem in problems:
            print(problem)
        print("ok" if not problems else f"{len(problems)} problem(s)")
        return 1 if problems else 0
    print(train_weights(args.out, checkpoint_dir=args.checkpoint_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
