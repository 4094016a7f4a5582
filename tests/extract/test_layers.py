import pytest

from eyas.errors import ConfigError
from eyas.layers import (
    default_aux_layers,
    from_input_of_layer_ids,
    hf_hidden_states_index,
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
