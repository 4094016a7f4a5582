"""The tiny chat template renders the documented strings (rendered by transformers' Jinja)."""

from __future__ import annotations

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from eyas.tiny.template import CHAT_TEMPLATE


def render(messages, **kwargs) -> str:
    rendered, _ = render_jinja_template(
        conversations=[messages],
        chat_template=CHAT_TEMPLATE,
        bos_token="<|begin_of_text|>",
        eos_token="<|end|>",
        **kwargs,
    )
    return rendered[0]


def test_single_turn_with_system_and_generation_prompt():
    messages = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Hi"},
    ]
    assert render(messages, add_generation_prompt=True) == (
        "<|begin_of_text|><|system|>\nBe terse.<|end|><|user|>\nHi<|end|><|assistant|>\n"
    )
    assert render(messages).endswith("Hi<|end|>")


def test_multi_turn_and_reasoning_on_every_assistant_turn():
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b", "reasoning_content": "r1"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d", "reasoning_content": "r2"},
        {"role": "user", "content": "e"},
        {"role": "assistant", "content": "f"},
    ]
    assert render(messages) == (
        "<|begin_of_text|><|user|>\na<|end|>"
        "<|assistant|>\n<think>\nr1\n</think>\nb<|end|>"
        "<|user|>\nc<|end|>"
        "<|assistant|>\n<think>\nr2\n</think>\nd<|end|>"
        "<|user|>\ne<|end|>"
        "<|assistant|>\nf<|end|>"
    )


def test_tool_turns_tool_calls_and_tools():
    messages = [
        {"role": "user", "content": "time?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "now", "arguments": "{}"}}],
        },
        {"role": "tool", "content": "12:00"},
        {"role": "assistant", "content": "Noon."},
    ]
    tools = [{"type": "function", "function": {"name": "now", "parameters": {}}}]
    out = render(messages, tools=tools)
    assert out.startswith("<|begin_of_text|><|system|>\nAvailable tools:\n{")
    assert '<|assistant|>\n<tool_call>{"name": "now", "arguments": "{}"}</tool_call><|end|>' in out
    assert out.endswith("<|tool|>\n12:00<|end|><|assistant|>\nNoon.<|end|>")


def test_content_parts_are_joined():
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]}
    ]
    assert render(messages) == "<|begin_of_text|><|user|>\nxy<|end|>"


def test_unknown_role_is_an_error():
    with pytest.raises(Exception, match="unknown role: robot"):
        render([{"role": "robot", "content": "beep"}])
