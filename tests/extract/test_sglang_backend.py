import pytest

from eyas.extract.sglang_backend import build_sglang_plan, sglang_available
from eyas.layers import default_aux_layers


def test_plan_uses_sglang_numbering(tmp_path):
    plan = build_sglang_plan(tmp_path, aux_layers=default_aux_layers(61), tp_size=8,
                             context_length=8192)
    assert plan.eagle3_layer_ids == [1, 29, 57]
    assert plan.server_args["enable_return_hidden_states"] is True
    cli = plan.cli_args()
    assert cli[:2] == ["--model-path", str(tmp_path)]
    assert "--tp-size" in cli and "8" in cli and "--disable-radix-cache" in cli


@pytest.mark.skipif(not sglang_available(),
                    reason="SGLang is not installed in this environment (it pins its own torch; "
                           "install eyas[sglang] in a separate environment on a GPU host)")
def test_sglang_server_args_accept_our_arguments(tmp_path):
    import argparse

    from sglang.srt.server_args import ServerArgs

    plan = build_sglang_plan(tmp_path, aux_layers=[1, 15, 28], context_length=4096)
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(plan.cli_args())
    for key, value in plan.server_args.items():
        assert getattr(ns, key) == value, key

