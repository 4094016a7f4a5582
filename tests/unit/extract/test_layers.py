import ast
import copy
import importlib.util
import itertools
import types
from pathlib import Path

import pytest

from eyas.errors import ConfigError
from eyas.layers import (
    PLUS_ONE,
    PLUS_ONE_IF_FIRST_IS_ONE,
    SGLANG_LAYER_RULES,
    check_sglang_capturable,
    default_aux_layers,
    from_input_of_layer_ids,
    from_sglang_ids,
    hf_hidden_states_index,
    sglang_layers_to_capture,
    to_input_of_layer_ids,
    to_sglang_ids,
    validate_layers,
)


def test_kimi_61_layers_default_and_conversions():
    ids = default_aux_layers(61)
    assert ids == [1, 29, 57]
    assert to_sglang_ids(ids) == [1, 29, 57]
    assert to_input_of_layer_ids(ids) == [2, 30, 58]
    assert from_input_of_layer_ids([2, 30, 58]) == [1, 29, 57]
    assert [hf_hidden_states_index(i) for i in ids] == [2, 30, 58]


def test_llama_32_layers_default():
    assert default_aux_layers(32) == [1, 15, 28]


@pytest.mark.parametrize("depth,expected", [(3, [0, 1, 2]), (4, [0, 1, 2]), (5, [0, 2, 3]),
                                            (6, [0, 2, 4]), (7, [1, 2, 3]), (8, [1, 3, 4])])
def test_small_depths_give_three_distinct_valid_layers(depth, expected):
    ids = default_aux_layers(depth)
    assert ids == expected
    assert validate_layers(ids, depth) == ids


def test_every_depth_default_validates():
    for depth in range(3, 200):
        validate_layers(default_aux_layers(depth), depth)


def test_too_shallow_target_is_refused():
    with pytest.raises(ConfigError, match="2 decoder layer"):
        default_aux_layers(2)


def test_validation_names_layer_and_depth():
    with pytest.raises(ConfigError, match=r"layer 30 does not exist.*8 decoder layers"):
        validate_layers([2, 30, 58], 8)
    with pytest.raises(ConfigError, match="expected 3"):
        validate_layers([1, 2], 8)
    with pytest.raises(ConfigError, match="ascending"):
        validate_layers([3, 1, 2], 8)
    with pytest.raises(ConfigError, match="not an integer"):
        validate_layers([1, 2.0, 3], 8)
    with pytest.raises(ConfigError, match="does not exist"):
        validate_layers([-1, 2, 3], 8)


# -- SGLang's layer ids per model family ---------------------------------------------------------
KIMI = "KimiK25ForConditionalGeneration"


def test_llama_family_passes_eyas_ids_unchanged():
    for ids in ([1, 15, 28], [0, 15, 28], [3, 15, 28]):
        assert to_sglang_ids(ids, "LlamaForCausalLM") == ids
        assert to_sglang_ids(ids) == ids  # None = the Llama/SpecForge numbering


def test_deepseek_family_adds_one_only_where_sglang_does_not():
    for arch in ("DeepseekV3ForCausalLM", KIMI):
        assert to_sglang_ids([1, 29, 57], arch) == [1, 29, 57]  # SGLang adds 1 itself
        assert to_sglang_ids([3, 30, 57], arch) == [4, 31, 58]  # SGLang takes these as given
        with pytest.raises(ConfigError, match=r"cannot capture layers \[0, 29, 57\]"):
            to_sglang_ids([0, 29, 57], arch)


def test_unknown_architecture_passes_only_ids_every_family_agrees_on():
    assert to_sglang_ids([1, 20, 40], "SomeNewForCausalLM") == [1, 20, 40]
    with pytest.raises(ConfigError, match="does not know how SGLang numbers"):
        to_sglang_ids([2, 20, 40], "SomeNewForCausalLM")


def test_from_sglang_ids_reads_a_drafter_config_back_per_family():
    assert from_sglang_ids([0, 15, 28], "LlamaForCausalLM") == [0, 15, 28]
    assert from_sglang_ids([0, 15, 28]) == [0, 15, 28]
    for arch in ("DeepseekV3ForCausalLM", KIMI):
        assert from_sglang_ids([1, 29, 57], arch) == [1, 29, 57]
        assert from_sglang_ids([4, 31, 58], arch) == [3, 30, 57]  # not [4, 31, 58]
    assert from_sglang_ids([1, 20, 40], "SomeNewForCausalLM") == [1, 20, 40]
    with pytest.raises(ConfigError, match="read \\[4, 31, 58\\] differently"):
        from_sglang_ids([4, 31, 58], "SomeNewForCausalLM")


@pytest.mark.parametrize("arch", [None, *sorted(SGLANG_LAYER_RULES)])
def test_from_sglang_ids_inverts_to_sglang_ids(arch):
    for ids in itertools.combinations(range(0, 12), 3):
        try:
            passed = to_sglang_ids(list(ids), arch)
        except ConfigError:
            continue
        assert from_sglang_ids(passed, arch) == list(ids), (arch, ids, passed)


@pytest.mark.parametrize("arch", sorted(SGLANG_LAYER_RULES))
def test_every_mapping_makes_sglang_capture_the_wanted_layers_pinned_rule(arch):
    """Against the pinned copy of SGLang 0.5.23's rules: whatever eyas passes, SGLang ends up
    capturing the inputs of layers ids + 1, i.e. the outputs of the eyas layers."""
    rule = SGLANG_LAYER_RULES[arch]
    for a, b, c in itertools.combinations(range(0, 12), 3):
        ids = [a, b, c]
        try:
            passed = to_sglang_ids(ids, arch)
        except ConfigError:
            assert rule == PLUS_ONE_IF_FIRST_IS_ONE and a == 0
            continue
        assert sglang_layers_to_capture(passed, rule) == to_input_of_layer_ids(ids)


def test_pinned_rules_as_written_in_sglang_0_5_23():
    # deepseek_v2.py: `if layer_ids and layer_ids[0] == 1: [v + 1 ...] else: list(layer_ids)`
    assert sglang_layers_to_capture([1, 29, 57], PLUS_ONE_IF_FIRST_IS_ONE) == [2, 30, 58]
    assert sglang_layers_to_capture([3, 30, 57], PLUS_ONE_IF_FIRST_IS_ONE) == [3, 30, 57]
    # llama.py: `[val + 1 for val in layer_ids]`
    assert sglang_layers_to_capture([3, 30, 57], PLUS_ONE) == [4, 31, 58]


def test_sglang_capture_limits():
    assert check_sglang_capturable([1, 29, 57], 61, KIMI) == [1, 29, 57]
    assert check_sglang_capturable([2, 30, 59], 61, KIMI) == [3, 31, 60]
    with pytest.raises(ConfigError, match="layer 60 is the last of 61"):
        check_sglang_capturable([1, 29, 60], 61, KIMI)
    with pytest.raises(ConfigError, match="does not exist"):
        check_sglang_capturable([1, 29, 61], 61, KIMI)


# The rule as SGLang's installed source writes it: each class's set_eagle3_layers_to_capture,
# compiled on its own (no SGLang import, no GPU) and run on a stand-in model object.
def _sglang_models_dir():
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "srt" / "models"


MODELS = _sglang_models_dir()


def _class_method(cls_name: str):
    """(file, class node, method node) of ``cls_name.set_eagle3_layers_to_capture`` in SGLang's
    models, following base classes defined in the same file."""
    for path in sorted(MODELS.glob("*.py")):
        tree = ast.parse(path.read_text())
        classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        name = cls_name
        while name in classes:
            node = classes[name]
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "set_eagle3_layers_to_capture":
                    return path, node, item
            bases = [b.id for b in node.bases if isinstance(b, ast.Name) and b.id in classes]
            if not bases:
                break
            name = bases[0]
    raise AssertionError(f"{cls_name}.set_eagle3_layers_to_capture not found in {MODELS}")


class _Recorder(types.SimpleNamespace):
    def set_eagle3_layers_to_capture(self, ids):
        self.delegated = list(ids)


def _run_rule(method: ast.FunctionDef, passed, num_layers=61):
    fn = copy.deepcopy(method)
    fn.returns = None
    for arg in (*fn.args.args, *fn.args.kwonlyargs):
        arg.annotation = None
    code = compile(ast.Module(body=[fn], type_ignores=[]), "<sglang rule>", "exec")
    scope: dict = {}
    exec(code, scope)  # noqa: S102 - SGLang's own method, compiled from its installed source
    inner = _Recorder(layers_to_capture=None, delegated=None)
    self = types.SimpleNamespace(pp_group=types.SimpleNamespace(is_last_rank=True),
                                 config=types.SimpleNamespace(num_hidden_layers=num_layers),
                                 model=inner, language_model=inner,
                                 capture_aux_hidden_states=False)
    scope["set_eagle3_layers_to_capture"](self, list(passed))
    return inner


@pytest.mark.skipif(MODELS is None, reason="SGLang is not installed here (the pinned rule above "
                                           "holds its behaviour)")
@pytest.mark.parametrize("arch", sorted(SGLANG_LAYER_RULES))
def test_rules_match_the_installed_sglang_source(arch):
    path, cls, method = _class_method(arch)
    rule = SGLANG_LAYER_RULES[arch]
    for passed in ([1, 29, 57], [3, 30, 57], [0, 29, 57], [2, 30, 58], [1, 2, 3], [5, 6, 7]):
        out = _run_rule(method, passed)
        if out.delegated is not None and arch == KIMI:
            # kimi_k25.py hands the ids to its language_model, a DeepseekV3ForCausalLM
            assert "DeepseekV3ForCausalLM(" in path.read_text()
            out = _run_rule(_class_method("DeepseekV3ForCausalLM")[2], out.delegated)
        captured = out.delegated if out.delegated is not None else out.layers_to_capture
        assert captured == sglang_layers_to_capture(passed, rule), (arch, passed, path.name)
