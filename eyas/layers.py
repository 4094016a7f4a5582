"""The one layer numbering eyas uses for EAGLE-3 auxiliary hidden states.

eyas numbers an auxiliary layer by the **0-based index of the decoder layer whose OUTPUT is
captured** -- the numbering of SpecForge's and SGLang's Llama-style configs
(``eagle_config.eagle_aux_hidden_state_layer_ids``). The EAGLE-3 default for a target with
``L`` decoder layers is ``[1, L//2 - 1, L - 4]``: ``[1, 29, 57]`` for 61 layers (Kimi-K2.5,
DeepSeek-V3), ``[1, 15, 28]`` for 32 layers (Llama-3.1-8B).

Other numberings of the same three states, and how to convert:

========================  ==============  =================================================
numbering                 61-layer value  conversion
========================  ==============  =================================================
eyas / SpecForge          [1, 29, 57]     identity
"input of layer i"        [2, 30, 58]     ``to_input_of_layer_ids`` (+1); our users wrote
                                          this form; SGLang captures at a layer's input
SGLang layer ids          [1, 29, 57]     ``to_sglang_ids(ids, architecture)``: depends on
                                          the model family (below); back with
                                          ``from_sglang_ids(ids, architecture)``
HF ``hidden_states`` idx  [2, 30, 58]     ``hf_hidden_states_index`` (+1): index 0 of
                                          ``output_hidden_states`` is the embeddings
========================  ==============  =================================================

SGLang's model classes turn the ids they are given (``--return-aux-hidden-state-layer-ids``,
or a drafter's ``eagle_aux_hidden_state_layer_ids``) into "input of layer" ids in
``set_eagle3_layers_to_capture``, and the families disagree (SGLang 0.5.23):

- ``plus-one`` (``models/llama.py``, Qwen2/Qwen3/Qwen3-MoE): every id + 1, so eyas ids pass
  unchanged;
- ``plus-one-if-first-is-one`` (``models/deepseek_v2.py``: DeepSeek-V2/V3, Kimi-K2/K2.5
  through ``kimi_k25.py``; ``glm4_moe_lite.py``): + 1 only when the first id is 1, otherwise
  the ids are taken as "input of layer" ids already. eyas passes ``[1, 29, 57]`` unchanged
  and ``[3, 30, 57]`` as ``[4, 31, 58]``; a first eyas id of 0 cannot be expressed (SGLang
  would read ``[1, ...]`` as "add one") and is refused.

For an architecture eyas has no rule for, ids starting at 1 (every default from 7 layers up)
mean the same under every rule in SGLang's sources and pass unchanged; anything else is
refused rather than guessed. ``SGLANG_LAYER_RULES`` is checked against SGLang's own source
by the tests (``tests/unit/extract/test_layers.py``).

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


PLUS_ONE = "plus-one"
PLUS_ONE_IF_FIRST_IS_ONE = "plus-one-if-first-is-one"
SGLANG_LAYER_RULES: dict[str, str] = {
    "LlamaForCausalLM": PLUS_ONE,
    "Qwen2ForCausalLM": PLUS_ONE,
    "Qwen3ForCausalLM": PLUS_ONE,
    "Qwen3MoeForCausalLM": PLUS_ONE,
    "DeepseekV2ForCausalLM": PLUS_ONE_IF_FIRST_IS_ONE,
    "DeepseekV3ForCausalLM": PLUS_ONE_IF_FIRST_IS_ONE,
    "KimiK25ForConditionalGeneration": PLUS_ONE_IF_FIRST_IS_ONE,  # its language_model is DeepseekV3
    "Glm4MoeLiteForCausalLM": PLUS_ONE_IF_FIRST_IS_ONE,
}
"""HF ``architectures[0]`` -> how SGLang 0.5.23's model class maps the layer ids it is given
(``set_eagle3_layers_to_capture``) to the layers whose *input* it captures."""


def sglang_layers_to_capture(passed: Sequence[int], rule: str) -> list[int]:
    """What SGLang's ``set_eagle3_layers_to_capture`` makes of `passed` under `rule`: the
    "input of layer" ids it captures (a copy of the rule's behaviour, held against SGLang's
    source by the tests)."""
    passed = [int(i) for i in passed]
    if rule == PLUS_ONE:
        return [i + 1 for i in passed]
    if rule == PLUS_ONE_IF_FIRST_IS_ONE:
        return [i + 1 for i in passed] if passed and passed[0] == 1 else passed
    raise ValueError(f"unknown SGLang layer rule {rule!r}")


def to_sglang_ids(ids: Sequence[int], architecture: str | None = None, *,
                  where: str = "extract.aux_layers") -> list[int]:
    """The ids to give SGLang (``--return-aux-hidden-state-layer-ids`` or a drafter's
    ``eagle_aux_hidden_state_layer_ids``) so that it captures the outputs of eyas layers `ids`
    of a target of `architecture` (HF ``architectures[0]``; None = the Llama rule, SGLang's
    and SpecForge's own numbering).

    Raises ConfigError when no ids make SGLang capture those layers: a first id of 0 on the
    ``plus-one-if-first-is-one`` family, or ids not starting at 1 on an architecture without a
    known rule (see the module docstring).
    """
    ids = [int(i) for i in ids]
    wanted = to_input_of_layer_ids(ids)
    rule = PLUS_ONE if architecture is None else SGLANG_LAYER_RULES.get(architecture)
    rules = [rule] if rule else sorted(set(SGLANG_LAYER_RULES.values()))
    for candidate in (ids, wanted):
        if all(sglang_layers_to_capture(candidate, r) == wanted for r in rules):
            return list(candidate)
    if rule is None:
        raise ConfigError(
            f"eyas does not know how SGLang numbers the capture layers of {architecture!r} "
            f"(known: {', '.join(sorted(SGLANG_LAYER_RULES))}); layers starting at 1 (the "
            f"EAGLE-3 default) work on every family, {ids} does not", where=where)
    raise ConfigError(
        f"SGLang cannot capture layers {ids} of a {architecture} target: its model class adds 1 "
        f"to the ids only when the first is 1 ({rule}), so the output of layer 0 (input of "
        f"layer 1) cannot be named; choose a first layer >= 1 or use extract.backend: hf",
        where=where)


def from_sglang_ids(ids: Sequence[int], architecture: str | None = None, *,
                    where: str = "eagle_config.eagle_aux_hidden_state_layer_ids") -> list[int]:
    """The eyas layer ids that SGLang ids `ids` (a drafter's ``eagle_aux_hidden_state_layer_ids``)
    capture on a target of `architecture`: the inverse of `to_sglang_ids` (None = the Llama
    rule, under which both numberings agree).

    Raises ConfigError when the architecture has no known rule and the rules disagree on `ids`
    (ids not starting at 1), rather than guessing.
    """
    ids = [int(i) for i in ids]
    rule = PLUS_ONE if architecture is None else SGLANG_LAYER_RULES.get(architecture)
    rules = [rule] if rule else sorted(set(SGLANG_LAYER_RULES.values()))
    readings = {tuple(from_input_of_layer_ids(sglang_layers_to_capture(ids, r))) for r in rules}
    if len(readings) == 1:
        return list(readings.pop())
    raise ConfigError(
        f"eyas does not know how SGLang numbers the capture layers of {architecture!r} "
        f"(known: {', '.join(sorted(SGLANG_LAYER_RULES))}), and its families read {ids} "
        f"differently: {sorted(readings)}", where=where)


def check_sglang_capturable(ids: Sequence[int], num_layers: int, architecture: str | None, *,
                            where: str = "extract.aux_layers") -> list[int]:
    """`validate_layers` plus what SGLang can capture: not the last decoder layer (SGLang
    captures a layer's output at the next layer's input) and ids `to_sglang_ids` can express.
    Returns the ids to give SGLang; raises ConfigError."""
    ids = validate_layers(list(ids), num_layers, where=where)
    if ids[-1] >= num_layers - 1:
        raise ConfigError(
            f"layer {ids[-1]} is the last of {num_layers} decoder layers; SGLang captures the "
            f"output of layer i at the input of layer i + 1, so it can capture 0..{num_layers - 2} "
            f"only (use extract.backend: hf for the last layer's output)", where=where)
    return to_sglang_ids(ids, architecture, where=where)


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
