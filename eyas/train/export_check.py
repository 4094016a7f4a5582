"""Static checks of an exported drafter, held against the run that trained it.

Each check reads files only (no model runs) and says what it compared:

- ``files``: the export's files are the ones its manifest (written by the trainer's export)
  hashed: nothing edited after export;
- ``aux_layers``: ``config.json``'s ``eagle_aux_hidden_state_layer_ids``, read back in eyas's
  numbering for the target's family, equal the layers the drafter was trained on (the export
  manifest's ``aux_layers``, and the layers the training shards were captured at);
- ``vocab``: ``d2t`` and ``t2d`` round-trip over the draft vocabulary (increasing target ids
  inside the target's vocabulary, ``t2d`` the same set, ``draft_vocab_size`` of them) and
  equal the vocabulary training built (``<drafter>/../vocab/``);
- ``weights``: every tensor SGLang 0.5.23's loader fills for the declared options is there
  (``srt/models/llama_eagle3.py`` ``LlamaForCausalLMEagle3.load_weights``: ``fc``,
  ``midlayer.*`` -- its legacy name of ``layers.0`` --, ``norm``, ``lm_head``, ``d2t``, and
  with ``fc_norm`` one ``fc_norm.<i>.weight`` per aux state; ``kimi_k25_eagle3.py``
  ``Eagle3DeepseekV2ForCausalLM.load_weights``: the same under ``layers.0.``). SGLang skips a
  missing tensor silently and serves its initial value; ``fc_norm`` / ``norm_output`` equal
  the trained drafter's;
- ``rope``: ``rope_theta`` and ``rope_scaling`` equal the trained drafter's (SGLang builds the
  rotary embedding from config.json alone);
- ``positions``: ``max_position_embeddings`` at least the longest context served;
- ``chat_template``: the chat template training data was rendered with gives the same ids as
  the one the server renders (the tokenizer's own, or ``--chat-template`` among the serving
  arguments), on probe conversations.

`check_export` runs them all; ``eyas check-export`` (`main`) prints one line per check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from eyas.errors import DataError, EyasError
from eyas.io import read_json
from eyas.layers import from_sglang_ids
from eyas.layout import VOCAB, RunLayout
from eyas.manifest import MANIFEST_NAME, verify_manifest

PROBE_MESSAGES = (
    [{"role": "user", "content": "What does `os.path.join` do?"}],
    [{"role": "system", "content": "You are brief."},
     {"role": "user", "content": "Name two list methods."},
     {"role": "assistant", "content": "`append` and `pop`."},
     {"role": "user", "content": "And one more?"}],
)
"""Conversations both chat templates render (with the generation prompt) for ``chat_template``."""


@dataclass
class Check:
    """One static check's outcome."""

    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'} {self.name:<13} {self.detail}"


def _trained(export: Path) -> dict[str, Any]:
    manifest = export / MANIFEST_NAME
    if not manifest.is_file():
        raise DataError("no manifest: not an export written by eyas's trainer", path=manifest)
    return read_json(manifest)


def check_files(export: Path) -> Check:
    problems = verify_manifest(export)
    if problems:
        return Check("files", False, "edited or incomplete since export: " + "; ".join(problems))
    return Check("files", True, f"every file as {MANIFEST_NAME} hashed it at export")


def trained_layers(export: Path, shard_dirs: Sequence[Path] = ()) -> dict[str, list[int]]:
    """The aux layers (eyas numbering) the drafter at `export` was trained on, by source: the
    export manifest's ``aux_layers``, and each training shard's capture layers."""
    out: dict[str, list[int]] = {}
    counts = _trained(export).get("counts") or {}
    if counts.get("aux_layers") is not None:
        out[f"{export}/{MANIFEST_NAME}"] = list(counts["aux_layers"])
    for folder in shard_dirs:
        for shard in sorted(Path(folder).glob("shard-*/manifest.json")):
            layers = (read_json(shard).get("config") or {}).get("aux_layers")
            if layers is not None:
                out[str(shard)] = list(layers)
                break  # every shard of one extraction captures the same layers
    return out


def check_aux_layers(export: Path, config: dict[str, Any], architecture: str | None,
                     shard_dirs: Sequence[Path] = ()) -> Check:
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        return Check("aux_layers", False, "config.json names no eagle_config."
                     "eagle_aux_hidden_state_layer_ids")
    served = from_sglang_ids(ids, architecture, where=str(export / "config.json"))
    trained = trained_layers(export, shard_dirs)
    if not trained:
        return Check("aux_layers", False, "nothing records the layers it was trained on")
    wrong = {src: layers for src, layers in trained.items() if layers != served}
    if wrong:
        return Check("aux_layers", False, f"config.json ids {ids} serve layers {served} (eyas "
                     f"numbering), trained on " + ", ".join(f"{v} ({k})" for k, v in wrong.items()))
    return Check("aux_layers", True, f"config.json ids {ids} = trained layers {served} "
                 f"({len(trained)} record(s))")


def check_vocab(export: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor],
                vocab_dir: Path | None) -> Check:
    if "d2t" not in tensors:
        return Check("vocab", False, "model.safetensors has no d2t: SGLang drafts target ids "
                     "0..N-1")
    V, N = int(config["vocab_size"]), int(config["draft_vocab_size"])
    d2t = tensors["d2t"].to(torch.int64)
    ids = d2t + torch.arange(d2t.numel(), dtype=torch.int64)
    problems = []
    if d2t.numel() != N:
        problems.append(f"d2t has {d2t.numel()} entries, draft_vocab_size is {N}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= V):
        problems.append(f"d2t names target ids outside [0, {V})")
    if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
        problems.append("d2t's target ids are not increasing (a shifted or corrupt map)")
    if "t2d" in tensors:
        t2d = tensors["t2d"].to(torch.bool)
        if t2d.numel() != V:
            problems.append(f"t2d has {t2d.numel()} entries, vocab_size is {V}")
        elif not problems and not torch.equal(t2d.nonzero().flatten(), ids):
            problems.append("t2d and d2t name different target tokens (the round trip fails)")
    if not problems and vocab_dir is not None:
        files = sorted(Path(vocab_dir).glob("vocab-*.safetensors"))
        if len(files) == 1:
            built = load_file(str(files[0]))["draft_to_target"].to(torch.int64)
            if not torch.equal(built, ids):
                differ = int((built != ids).sum()) if built.shape == ids.shape else N
                problems.append(f"d2t differs from the vocabulary training built ({files[0]}) "
                                f"at {differ} of {N} draft ids")
    if problems:
        return Check("vocab", False, "; ".join(problems))
    return Check("vocab", True, f"d2t/t2d round trip over {N} draft tokens of {V}"
                 + (", equal to training's vocabulary" if vocab_dir is not None else ""))


def required_weights(config: dict[str, Any]) -> list[str]:
    """The tensor names SGLang 0.5.23's EAGLE-3 loaders fill for this ``config.json`` (the
    module docstring names the loaders), plus ``d2t``."""
    from eyas.train.export import checkpoint_name
    from eyas.train.model import Drafter

    cfg = drafter_config(config)
    with torch.device("meta"):  # names only: no memory for a full-size drafter
        drafter = Drafter(cfg, torch.empty(cfg.vocab_size, cfg.hidden_size))
    names = {checkpoint_name(cfg, k) for k in drafter.state_dict()}
    if config.get("fc_norm"):  # SGLang: one RMSNorm per aux state (ModuleList fc_norm)
        ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or [0] * 3
        names |= {f"fc_norm.{i}.weight" for i in range(len(ids))}
    return sorted(names | {"d2t"})


def drafter_config(config: dict[str, Any]):
    """The `DrafterConfig` an exported ``config.json`` describes (as `load_exported` reads it)."""
    from eyas.train.export import MLA_ARCHITECTURE
    from eyas.train.model import MLA_SIZES, DrafterConfig

    common = {k: config[k] for k in (
        "hidden_size", "target_hidden_size", "intermediate_size", "num_attention_heads",
        "num_key_value_heads", "vocab_size", "draft_vocab_size", "rms_norm_eps", "rope_theta",
        "max_position_embeddings")}
    flags = {"fc_norm": bool(config.get("fc_norm")),
             "norm_output": bool(config.get("norm_output"))}
    if MLA_ARCHITECTURE in (config.get("architectures") or []):
        return DrafterConfig(**common, attention="mla", **{k: config[k] for k in MLA_SIZES},
                             rope_scaling=config.get("rope_scaling"),
                             rope_interleave=config.get("rope_interleave", True), **flags)
    return DrafterConfig(**common, head_dim=config.get("head_dim"), **flags)


def check_weights(config: dict[str, Any], tensors: dict[str, torch.Tensor],
                  trained: dict[str, Any]) -> Check:
    problems = []
    for key in ("fc_norm", "norm_output"):
        if bool(config.get(key)) != bool(trained.get(key)):
            problems.append(f"config.json {key}: {bool(config.get(key))}, trained with "
                            f"{bool(trained.get(key))}")
    missing = [n for n in required_weights(config) if n not in tensors]
    if missing:
        problems.append(f"missing {missing} (SGLang would serve them at their initial values, "
                        "silently)")
    if problems:
        return Check("weights", False, "; ".join(problems))
    return Check("weights", True, f"all {len(required_weights(config))} tensors SGLang loads "
                 f"for fc_norm={bool(config.get('fc_norm'))}, "
                 f"norm_output={bool(config.get('norm_output'))}")


def check_rope(config: dict[str, Any], trained: dict[str, Any]) -> Check:
    problems = []
    if float(config.get("rope_theta", 0)) != float(trained.get("rope_theta", 0)):
        problems.append(f"rope_theta {config.get('rope_theta')}, trained with "
                        f"{trained.get('rope_theta')}")
    if (config.get("rope_scaling") or None) != (trained.get("rope_scaling") or None):
        problems.append(f"rope_scaling {config.get('rope_scaling')}, trained with "
                        f"{trained.get('rope_scaling')}")
    if problems:
        return Check("rope", False, "; ".join(problems))
    return Check("rope", True, f"rope_theta {config.get('rope_theta')}, rope_scaling "
                 f"{config.get('rope_scaling')} as trained")


def check_positions(config: dict[str, Any], served_context: int | None) -> Check:
    have = config.get("max_position_embeddings")
    if served_context is None:
        return Check("positions", True, f"max_position_embeddings {have} (no served context "
                     "length to hold it against)")
    if have is None or int(have) < served_context:
        return Check("positions", False, f"max_position_embeddings {have} < the longest served "
                     f"context {served_context}")
    return Check("positions", True, f"max_position_embeddings {have} >= served context "
                 f"{served_context}")


def check_chat_template(tokenizer_dir: Path, *, trained_template: str | None,
                        served_template: str | None, trust_remote_code: bool = False) -> Check:
    """`trained_template` / `served_template`: template text replacing the tokenizer's own
    (None: the tokenizer's own)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), trust_remote_code=trust_remote_code)
    if trained_template is None and served_template is None:
        return Check("chat_template", True, "training and the server both render the "
                     "tokenizer's own template")

    def ids(template: str | None, messages) -> list[int]:
        out = tok.apply_chat_template(messages, chat_template=template, tokenize=True,
                                      add_generation_prompt=True)
        return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)

    for n, messages in enumerate(PROBE_MESSAGES):
        a, b = ids(trained_template, messages), ids(served_template, messages)
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                      min(len(a), len(b)))
            return Check("chat_template", False, f"probe conversation {n}: training's template "
                         f"and the server's render different ids from token {at} "
                         f"({len(a)} vs {len(b)} tokens)")
    return Check("chat_template", True, f"same ids for {len(PROBE_MESSAGES)} probe "
                 "conversations")


def check_export(export: Path, *, architecture: str | None = None,
                 shard_dirs: Sequence[Path] = (), vocab_dir: Path | None = None,
                 served_context: int | None = None, tokenizer_dir: Path | None = None,
                 trained_template: str | None = None, served_template: str | None = None,
                 trust_remote_code: bool = False) -> list[Check]:
    """Every static check of `export` (module docstring). `architecture`: the target's
    ``architectures[0]`` (default: the one the export manifest records); `shard_dirs` the
    training shards; `vocab_dir` training's vocabulary folder; `tokenizer_dir` None skips the
    chat-template check."""
    export = Path(export)
    try:
        manifest = _trained(export)
        config = read_json(export / "config.json")
        tensors = load_file(str(export / "model.safetensors"))
    except (DataError, OSError, ValueError) as exc:
        return [Check("files", False, f"cannot read the export at {export}: {exc}")]
    trained = manifest.get("config") or {}
    if architecture is None:
        architecture = (manifest.get("counts") or {}).get("target_architecture")
    checks = [check_files(export)]
    for name, fn in (("aux_layers", lambda: check_aux_layers(export, config, architecture,
                                                            shard_dirs)),
                     ("vocab", lambda: check_vocab(export, config, tensors, vocab_dir)),
                     ("weights", lambda: check_weights(config, tensors, trained)),
                     ("rope", lambda: check_rope(config, trained)),
                     ("positions", lambda: check_positions(config, served_context))):
        try:
            checks.append(fn())
        except (EyasError, KeyError, ValueError, TypeError) as exc:
            checks.append(Check(name, False, f"{type(exc).__name__}: {exc}"))
    if tokenizer_dir is not None:
        try:
            checks.append(check_chat_template(tokenizer_dir, trained_template=trained_template,
                                              served_template=served_template,
                                              trust_remote_code=trust_remote_code))
        except (OSError, ValueError) as exc:
            checks.append(Check("chat_template", False, f"{type(exc).__name__}: {exc}"))
    return checks


def failures(checks: Sequence[Check]) -> list[Check]:
    return [c for c in checks if not c.ok]


def served_options(cfg) -> tuple[int | None, str | None, str | None]:
    """``(longest served context, training's chat template text, the server's)`` of the
    pipeline config `cfg`: the context is ``--context-length`` among the serving arguments,
    else the target's ``max_position_embeddings`` (SGLang's default); training renders
    ``target.chat_template`` (None: the tokenizer's own), the server ``--chat-template``."""
    from eyas.hf_target import text_config
    from eyas.prepare.phases import target_dir
    from eyas.prepare.tokenize import read_chat_template

    args = list(cfg.evaluate.serving.extra_server_args) if cfg.evaluate.serving else []

    def flag(name: str) -> str | None:
        for i, a in enumerate(args):
            if a == name and i + 1 < len(args):
                return args[i + 1]
            if a.startswith(name + "="):
                return a.split("=", 1)[1]
        return None

    context = flag("--context-length")
    if context is None:
        target = text_config(read_json(target_dir(cfg) / "config.json"))
        context = target.get("max_position_embeddings")
    trained = (read_chat_template(cfg.resolve_path(cfg.target.chat_template))
               if cfg.target.chat_template else None)
    served = flag("--chat-template")
    if served is not None:
        path = Path(served)
        if not path.is_file():
            raise DataError(f"--chat-template {served!r} is not a template file here (a "
                            "template SGLang names itself cannot be compared)",
                            field="evaluate.serving.extra_server_args")
        served = read_chat_template(path)
    return (int(context) if context is not None else None), trained, served


def check_run(cfg, workdir: Path, drafter: Path | None = None) -> list[Check]:
    """`check_export` of a run's export (default ``<workdir>/drafter/export``) against its
    training shards (``hidden/train``), its vocabulary (``drafter/vocab``) and the recipe's
    serving options (`served_options`)."""
    from eyas.prepare.phases import target_dir

    layout = RunLayout(Path(workdir))
    export = Path(drafter) if drafter is not None else layout.export
    context, trained, served = served_options(cfg)
    tokenizer = (cfg.resolve_path(cfg.target.tokenizer) if cfg.target.tokenizer
                 else target_dir(cfg))
    return check_export(export, shard_dirs=[layout.hidden_dir("train")],
                        vocab_dir=export.parent / VOCAB if (export.parent / VOCAB).is_dir()
                        else None, served_context=context, tokenizer_dir=tokenizer,
                        trained_template=trained, served_template=served,
                        trust_remote_code=cfg.target.trust_remote_code)
