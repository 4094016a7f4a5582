"""SGLang's server arguments as eyas pins them, and the check of ``extract.engine_args``.

The control plane has no SGLang (it pins its own torch), so the names of SGLang 0.5.23's
``ServerArgs`` fields are data here: ``eyas/assets/sglang-0.5.23-server-args.txt``, one name a
line, written by ``scripts/pin_sglang_server_args.py`` from SGLang's own source (the namespace
classes of ``srt/arg_groups/fields/*.py`` that ``ServerArgs`` assembles; ``Engine(**kwargs)``
builds a ``ServerArgs`` from its keywords, ``--flag-name`` is the field name with dashes).
``tests/unit/test_sglang_args.py`` holds the table against SGLang's own ``ServerArgs`` where a
python with SGLang is at hand; the serving benchmark's flags (`eyas.evaluate.sglang_server`)
are checked against the same table.

Which architectures SGLang runs with ``language_model_only`` is SGLang's own decision
(``ServerArgs.LANGUAGE_MODEL_ONLY_ARCHITECTURES``; ``handle_language_model_only`` refuses the
flag for any other model on every engine start): `language_model_only_architectures` reads that
list from the SGLang installed here (the GPU host's engine environment), else the copy pinned
beside the names (``eyas/assets/sglang-0.5.23-language-model-only.txt``, same script, same
tests).

``extract.engine_args`` goes to the extraction engine as given, with one rule: the keys eyas
sets itself for the capture (`SET_BY_EYAS`, and every ``speculative_*``: no draft model is
loaded) are refused, naming where each comes from; eyas's engine defaults
(``mem_fraction_static``, ``chunked_prefill_size``) are replaced by the same keys in
``engine_args``. Unknown keys are refused with the close matches.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eyas.errors import ConfigError
from eyas.sglang_version import SGLANG_VERSION

NAMES_FILE = Path(__file__).parent / "assets" / f"sglang-{SGLANG_VERSION}-server-args.txt"

SERVER_ARGS: frozenset[str] = frozenset(
    line.strip() for line in NAMES_FILE.read_text(encoding="utf-8").splitlines() if line.strip())
"""Every public ``ServerArgs`` field of the pinned SGLang (``Engine(**kwargs)`` keys)."""

LANGUAGE_MODEL_ONLY_FILE = (Path(__file__).parent / "assets"
                            / f"sglang-{SGLANG_VERSION}-language-model-only.txt")

PINNED_LANGUAGE_MODEL_ONLY: tuple[str, ...] = tuple(
    line.strip() for line in LANGUAGE_MODEL_ONLY_FILE.read_text(encoding="utf-8").splitlines()
    if line.strip())
"""The pinned SGLang's ``ServerArgs.LANGUAGE_MODEL_ONLY_ARCHITECTURES``, in its order."""


@functools.cache
def language_model_only_architectures() -> tuple[str, ...]:
    """The architectures SGLang accepts ``language_model_only`` for: read from the SGLang
    installed in this environment when there is one (where the engine starts), else
    `PINNED_LANGUAGE_MODEL_ONLY` (the control plane, which has no SGLang). Kimi-K2.5's
    ``KimiK25ForConditionalGeneration`` is not among them in 0.5.23: SGLang runs it as the
    multimodal wrapper, vision tower loaded."""
    if importlib.util.find_spec("sglang") is None:
        return PINNED_LANGUAGE_MODEL_ONLY
    try:
        from sglang.srt.server_args import ServerArgs
    except ImportError:  # a broken SGLang install fails at the engine's start, with its hint
        return PINNED_LANGUAGE_MODEL_ONLY
    return tuple(getattr(ServerArgs, "LANGUAGE_MODEL_ONLY_ARCHITECTURES", ()))


def runs_language_model_only(architecture: str | None) -> bool:
    """Whether eyas starts SGLang with ``language_model_only`` for a target of HF class
    `architecture`: exactly when SGLang accepts the flag for it
    (`language_model_only_architectures`). Token ids only go in either way."""
    return architecture is not None and architecture in language_model_only_architectures()

SET_BY_EYAS: dict[str, str] = {
    "model_path": "the target folder (target.model)",
    "tp_size": "extract.tp_size",
    "trust_remote_code": "target.trust_remote_code",
    "skip_tokenizer_init": "eyas sends token ids, never text",
    "enable_return_aux_hidden_states": "the capture itself",
    "return_aux_hidden_state_layer_ids": "extract.aux_layers, translated for the model family",
    "forward_hooks": "eyas's capture hook (extract.storage, extract.topk, extract.dtype)",
    "disable_radix_cache": "always on: a cached prefix would skip its rows",
    "disable_prefill_cuda_graph": "always on: hooks do not run inside a replayed graph",
    "disable_decode_cuda_graph": "always on: extraction never decodes",
}
"""Engine arguments eyas sets for the capture, and where each comes from."""


def engine_args_problems(args: Mapping[str, Any]) -> list[str]:
    """One message per key of `args` that cannot go to the extraction engine: not a server
    argument of the pinned SGLang (with close matches), or one eyas sets itself."""
    problems = []
    for key in args:
        if key in SET_BY_EYAS:
            problems.append(f"{key!r} is set by eyas ({SET_BY_EYAS[key]}); remove it")
        elif key.startswith("speculative_"):
            problems.append(f"{key!r}: extraction loads no draft model (eyas names the capture "
                            f"convention with speculative_algorithm itself); remove it")
        elif key not in SERVER_ARGS:
            close = difflib.get_close_matches(key.replace("-", "_"), sorted(SERVER_ARGS), n=3,
                                              cutoff=0.6)
            hint = f" (close: {', '.join(close)})" if close else ""
            problems.append(f"{key!r} is not a server argument of SGLang {SGLANG_VERSION}"
                            f"{hint}; the names are ServerArgs' fields, those of "
                            f"`python -m sglang.launch_server --help` with _ for -")
    return problems


def check_engine_args(args: Mapping[str, Any], *, where: str = "extract.engine_args") -> dict[str, Any]:
    """`args` as a plain dict, or ConfigError at `where` listing every problem
    (`engine_args_problems`)."""
    problems = engine_args_problems(args)
    if problems:
        raise ConfigError("; ".join(problems), where=where)
    return dict(args)
