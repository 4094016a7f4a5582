"""SGLang backend (GPU hosts): the engine arguments for prefill-only aux hidden-state capture.

SGLang pins its own torch and transformers, so it lives in its own environment on the GPU
host (``pip install 'eyas[sglang]'`` there), never in the control plane's. This module
imports SGLang only inside functions.

What the users run today is an SGLang offline engine that prefills each sample once and
returns hidden states: ``enable_return_hidden_states`` for the final state, and the target
model class's EAGLE-3 capture (``set_eagle3_layers_to_capture(ids)``, ids in eyas = SGLang
numbering) for the three auxiliary layers. No decoding happens (``max_new_tokens`` 0/1), so
the radix cache and CUDA graphs only cost memory; they are turned off.

STATUS: the argument builder is done and tested (against SGLang's own ``ServerArgs`` when
SGLang is importable; skipped otherwise). ``run_sglang_extraction`` -- driving the engine and
collecting the aux states -- is NOT implemented yet and raises; use the HF backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eyas.errors import EyasError
from eyas.layers import to_sglang_ids


@dataclass(frozen=True)
class SGLangPlan:
    """Engine keyword arguments (``sglang.Engine(**server_args)`` / ``ServerArgs(**...)``) plus
    the aux layer ids to install on the loaded model."""

    server_args: dict[str, Any]
    eagle3_layer_ids: list[int]
    sampling_params: dict[str, Any] = field(default_factory=lambda: {"max_new_tokens": 1,
                                                                      "temperature": 0.0})

    def cli_args(self) -> list[str]:
        """The same settings as ``python -m sglang.launch_server`` flags."""
        out: list[str] = []
        for key, value in self.server_args.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                out.append(flag)
            elif value is False or value is None:
                continue
            else:
                out.extend([flag, str(value)])
        return out


def build_sglang_plan(
    model_dir: Path,
    *,
    aux_layers: list[int],
    tp_size: int = 1,
    context_length: int | None = None,
    mem_fraction_static: float = 0.85,
    dtype: str = "bfloat16",
    trust_remote_code: bool = False,
    max_running_requests: int | None = None,
) -> SGLangPlan:
    """The SGLang engine settings for extracting `aux_layers` (eyas numbering) from a target."""
    args: dict[str, Any] = {
        "model_path": str(model_dir),
        "tp_size": tp_size,
        "dtype": dtype,
        "mem_fraction_static": mem_fraction_static,
        "trust_remote_code": trust_remote_code,
        "skip_tokenizer_init": True,  # we send token ids, never text
        "enable_return_hidden_states": True,
        "disable_radix_cache": True,  # every sample is prefilled once; nothing to reuse
        "disable_cuda_graph": True,  # graphs serve decoding, which extraction never does
    }
    if context_length is not None:
        args["context_length"] = context_length
    if max_running_requests is not None:
        args["max_running_requests"] = max_running_requests
    return SGLangPlan(server_args=args, eagle3_layer_ids=to_sglang_ids(aux_layers))


def sglang_available() -> bool:
    """True when SGLang imports in this environment."""
    try:
        import sglang  # noqa: F401
    except ImportError:
        return False
    return True


def run_sglang_extraction(plan: SGLangPlan, records: list[dict]) -> list[dict]:  # pragma: no cover
    """NOT IMPLEMENTED: drive the SGLang engine and collect aux states (GPU only)."""
    raise EyasError(
        "the SGLang extraction engine path is not implemented yet; use the HF backend "
        "(eyas.extract.hf_backend) -- build_sglang_plan gives the engine arguments"
    )
