"""The one layer numbering eyas uses for EAGLE-3 auxiliary hidden states.

eyas numbers an auxiliary layer by the **0-based index of the decoder layer whose OUTPUT is
captured** -- the numbering of SGLang's and SpecForge's configs
(``eagle_config.eagle_aux_hidden_state_layer_ids``). The EAGLE-3 default for a target with
``L`` decoder layers is ``[1, L//2 - 1, L - 4]``: ``[1, 29, 57]`` for 61 layers (Kimi-K2.5,
DeepSeek-V3), ``[1, 15, 28]`` for 32 layers (Llama-3.1-8B).

Other numberings of the same three states, and how to convert:

========================  ==============  =================================================
numbering                 61-layer value  conversion
========================  ==============  =================================================
eyas / SGLang / SpecForge [1, 29, 57]     ``to_sglang_ids`` (identity)
"input of layer i"        [2, 30, 58]     ``to_input_of_layer_ids`` (+1); SGLang adds 1
                                          internally; our users wrote this form
HF ``hidden_states`` idx  [2, 30, 58]     ``hf_hidden_states_index`` (+1): index 0 of
                                          ``output_hidden_states`` is the embeddings
========================  ==============  =================================================

Small depths (fewer than 7 layers, the tiny test models): the EAGLE-3 formula gives repeated
or negative ids there, so ``default_aux_layers`` spreads three distinct layers instead:
``[0, (L-1)//2, L-2]`` (``[0, 1, 2]`` when that repeats). Fewer than 3 layers is an error.
"""

from __future__ import annotations

from collections.abc import Sequence

from eyas.errors import ConfigError

NUM_AUX_LAYERS = 3


def default_aux_layers(num_layers: int) -> list[int]:
    """The default three auxiliary layers (eyas numbering) for a target of `num_layers` layers.

    ``[1, L//2 - 1, L - 4]`` when those are distinct and ascending (L >= 7), else the
    small-depth spread documented in the module docstring. Raises ConfigError for L < 3.
    """
    if num_layers < NUM_AUX_LAYERS:
        raise ConfigError(
            f"a target with {num_layers} decoder layer(s) has too few layers for EAGLE-3 "
            f"(expected at least {NUM_AUX_LAYERS})",
            where="target.num_hidden_layers",
        )
    ids = [1, num_layers // 2 - 1, num_layers - 4]
    if _ascending(ids) and ids[0] >= 0 and ids[-1] < num_layers:
        return ids
    ids = [0, (num_layers - 1) // 2, num_layers - 2]
    return ids if _ascending(ids) else [0, 1, 2]


def _ascending(ids: Sequence[int]) -> bool:
    return all(a < b for a, b in zip(ids, ids[1:], strict=False))


def to_sglang_ids(ids: Sequence[int]) -> list[int]:
    """Ids for SGLang/SpecForge ``eagle_aux_hidden_state_layer_ids`` (the same numbering)."""
    return [int(i) for i in ids]


def to_input_of_layer_ids(ids: Sequence[int]) -> list[int]:
    """"Input of layer" ids (the users' ``[2, 30, 58]``) from eyas ids (``[1, 29, 57]``)."""
    return [int(i) + 1 for i in ids]


def from_input_of_layer_ids(ids: Sequence[int]) -> list[int]:
    """eyas ids from "input of layer" ids: ``[2, 30, 58]`` -> ``[1, 29, 57]``."""
    return [int(i) - 1 for i in ids]


def hf_hidden_states_index(layer_id: int) -> int:
    """Index into HF ``output_hidden_states`` of the output of decoder layer `layer_id`.

    HF puts the embeddings at index 0, so the output of layer i is at i + 1.
    """
    return int(layer_id) + 1


def validate_layers(ids: Sequence[int], num_layers: int, *, where: str = "extract.aux_layers") -> list[int]:
    """Check `ids` (eyas numbering) against a target of `num_layers` layers; return them as ints.

    Expected: exactly three distinct, ascending integers in ``[0, num_layers - 1]``. Raises
    ConfigError naming the offending layer id and the target's depth.
    """
    ids = list(ids)
    if len(ids) != NUM_AUX_LAYERS:
        raise ConfigError(
            f"expected {NUM_AUX_LAYERS} auxiliary layer ids, got {len(ids)}: {ids}", where=where
        )
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise ConfigError(f"layer id {i!r} is not an integer", where=where)
        if not 0 <= i < num_layers:
            raise ConfigError(
                f"layer {i} does not exist in a target with {num_layers} decoder layers "
                f"(expected 0..{num_layers - 1}, eyas numbering = output of layer i; "
                f"'input of layer' ids such as [2, 30, 58] convert with from_input_of_layer_ids)",
                where=where,
            )
    if not _ascending(ids):
        raise ConfigError(f"layer ids must be distinct and ascending, got {ids}", where=where)
    return ids
