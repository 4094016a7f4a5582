"""The replica's chat template renders what Kimi-K2.5's published template renders.

Each expected string below was written out by hand from reading Kimi-K2.5's
``chat_template.jinja`` (its history/suffix split at the last assistant turn without tool
calls, its ``thinking`` switch, its generation prompt), not produced by the code under test.
"""

from __future__ import annotations

import pytest
from support.loss_mask_fixtures import build_kimi_test_tokenizer
from transformers import AutoTokenizer

U = "<|im_user|>user<|im_middle|>"
A = "<|im_assistant|>assistant<|im_middle|>"
S = "<|im_system|>system<|im_middle|>"
E = "<|im_end|>"
CALL = {"id": "functions.get_weather:0", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CALLS = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
         '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>')
RESULT = "<|im_system|>tool<|im_middle|>## Return of functions.get_weather:0\n21 degrees" + E


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return AutoTokenizer.from_pretrained(
        build_kimi_test_tokenizer(tmp_path_factory.mktemp("kimi")), trust_remote_code=True)


def render(tok, messages, *, gen=False, **kwargs):
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen, **kwargs)


def q(text):
    return {"role": "user", "content": text}


def a(text, reasoning=None, calls=None):
    m = {"role": "assistant", "content": text}
    if reasoning is not None:
        m["reasoning_content"] = reasoning
    if calls:
        m["tool_calls"] = calls
    return m


TOOL = {"role": "tool", "content": "21 degrees", "tool_call_id": "functions.get_weather:0"}


def test_final_answer_is_history_its_reasoning_dropped_no_default_system(tok):
    assert render(tok, [q("6*7?"), a("42", "six sevens")]) == f"{U}6*7?{E}{A}<think></think>42{E}"


@pytest.mark.parametrize(("kwargs", "tail"), [({}, "<think>"), ({"thinking": True}, "<think>"),
                                              ({"thinking": False}, "<think></think>")])
def test_generation_prompt_opens_a_thought_unless_thinking_is_off(tok, kwargs, tail):
    assert render(tok, [q("Hi")], gen=True, **kwargs) == f"{U}Hi{E}{A}{tail}"


def test_every_earlier_answer_is_history(tok):
    msgs = [{"role": "system", "content": "Be brief."}, q("Q1"), a("A1", "R1"), q("Q2"),
            a("A2", "R2")]
    assert render(tok, msgs) == (f"{S}Be brief.{E}{U}Q1{E}{A}<think></think>A1{E}"
                                 f"{U}Q2{E}{A}<think></think>A2{E}")
    # The prompt the target answered Q2 from: A1 is history there too.
    assert render(tok, msgs[:4], gen=True) == (f"{S}Be brief.{E}{U}Q1{E}{A}<think></think>A1{E}"
                                               f"{U}Q2{E}{A}<think>")


def test_an_ongoing_tool_exchange_keeps_its_reasoning(tok):
    msgs = [q("Q1"), a("A1", "R1"), q("Weather?"), a("", "I should look.", [CALL]), TOOL]
    assert render(tok, msgs, gen=True) == (
        f"{U}Q1{E}{A}<think></think>A1{E}{U}Weather?{E}"
        f"{A}<think>I should look.</think>{CALLS}{E}{RESULT}{A}<think>")
    off = render(tok, msgs, gen=True, thinking=False)
    assert f"{A}<think></think>{CALLS}{E}" in off and off.endswith(f"{A}<think></think>")


def test_a_finished_tool_exchange_is_all_history(tok):
    msgs = [q("Weather?"), a("", "I should look.", [CALL]), TOOL, a("21 degrees.", "Got it.")]
    assert render(tok, msgs) == (f"{U}Weather?{E}{A}<think></think>{CALLS}{E}{RESULT}"
                                 f"{A}<think></think>21 degrees.{E}")


def test_tools_are_declared_first_as_compact_json(tok):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert render(tok, [q("Hi")], tools=tools) == (
        '<|im_system|>tool_declare<|im_middle|>[{"function":{"name":"f","parameters":{}},'
        f'"type":"function"}}]{E}{U}Hi{E}')
    ts = render(tok, [q("Hi")], tools=tools, tools_ts_str="type f = () => any;")
    assert ts.startswith(f"<|im_system|>tool_declare<|im_middle|>type f = () => any;{E}{U}")


def test_image_parts(tok):
    msg = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}},
                                       {"type": "text", "text": "What is it?"}]}
    assert render(tok, [msg]) == (
        f"{U}<|media_begin|>image<|media_content|><|media_pad|><|media_end|>\nWhat is it?{E}")
