"""Kimi-K2.5's chat format: its special tokens and a Jinja template that renders it.

The template is eyas's own text, written to render what Kimi-K2.5's published
``chat_template.jinja`` renders (see docs/data-preparation.md, "Kimi", for how that was checked
and what was read). One conversation, rendered::

    <|im_user|>user<|im_middle|>What is 6 * 7?<|im_end|>
    <|im_assistant|>assistant<|im_middle|><think></think>42<|im_end|>

(shown on two lines; the template writes no newlines between turns). The rules:

- a turn is ``<|im_user|>``, ``<|im_assistant|>`` or ``<|im_system|>`` (every other role:
  system, tool) + the message's ``name`` or role + ``<|im_middle|>`` + content + ``<|im_end|>``;
- no system turn is added: a conversation without a system message starts with its first
  turn (Kimi-K2-Thinking's template added "You are Kimi, ..." here; K2.5's does not);
- with ``tools``, a ``tool_declare`` system turn comes before everything: the
  ``tools_ts_str`` variable when given (Kimi's tokenizer class passes TypeScript-style text),
  else the tools as compact JSON (no spaces after ``,`` and ``:``);
- assistant turns up to and including the last one without tool calls are *history*: their
  reasoning is dropped, they render ``<think></think>`` + content. Assistant turns after it
  (an ongoing tool-call exchange) keep it: ``<think>`` + reasoning + ``</think>`` + content
  (``<think></think>`` when the template variable ``thinking`` is false);
- tool calls follow the content: ``<|tool_calls_section_begin|>``, then per call
  ``<|tool_call_begin|>`` + id + ``<|tool_call_argument_begin|>`` + arguments (a string as
  is, anything else as JSON) + ``<|tool_call_end|>``, then ``<|tool_calls_section_end|>``;
- a tool result reads ``## Return of <tool_call_id>`` + newline + content;
- list content renders text parts as they are and parts of type ``image`` / ``image_url`` as
  ``<|media_begin|>image<|media_content|><|media_pad|><|media_end|>`` + newline;
- ``add_generation_prompt`` appends ``<|im_assistant|>assistant<|im_middle|><think>``
  (``<think></think>`` when ``thinking`` is false): in thinking mode, the default, the model
  writes ``reasoning</think>answer<|im_end|>`` after it.

A consequence worth knowing: a finished conversation's final answer is history, so its
``reasoning_content`` is not in the template's rendering of it. eyas's phase 2 therefore
renders the final turn as the model wrote it (``tokenize.final_turn``, see
docs/data-preparation.md), not as this template renders it.
"""

from __future__ import annotations

# Kimi-K2.5's special tokens, by offset from the end of the base vocabulary (its
# tokenizer_config.json numbers them 163584 + offset). Offsets not listed are reserved.
SPECIAL_TOKEN_OFFSETS = {
    0: "[BOS]",
    1: "[EOS]",
    2: "<|im_end|>",
    3: "<|im_user|>",
    4: "<|im_assistant|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    9: "[EOT]",
    10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>",
    12: "<|tool_calls_section_end|>",
    13: "<|tool_call_begin|>",
    14: "<|tool_call_argument_begin|>",
    15: "<|tool_call_end|>",
    17: "<|im_middle|>",
    18: "<|media_begin|>",
    19: "<|media_content|>",
    20: "<|media_end|>",
    21: "<|media_pad|>",
    22: "<think>",
    23: "</think>",
    254: "[UNK]",
    255: "[PAD]",
}
END_OF_TURN = "<|im_end|>"

CHAT_TEMPLATE = (
    # Index of the last assistant message without tool calls: it and all before it are history.
    "{%- set ns = namespace(history_end=-1) -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' and not m.get('tool_calls') -%}"
    "{%- set ns.history_end = loop.index0 -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- set no_thinking = thinking is defined and thinking is false -%}"
    "{%- if tools -%}"
    "{{- '<|im_system|>tool_declare<|im_middle|>' -}}"
    "{%- if tools_ts_str -%}{{- tools_ts_str -}}"
    "{%- else -%}{{- tools | tojson(separators=(',', ':')) -}}{%- endif -%}"
    "{{- '<|im_end|>' -}}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- set who = m.get('name') or m['role'] -%}"
    "{%- if m['role'] == 'user' -%}{{- '<|im_user|>' ~ who ~ '<|im_middle|>' -}}"
    "{%- elif m['role'] == 'assistant' -%}{{- '<|im_assistant|>' ~ who ~ '<|im_middle|>' -}}"
    "{%- else -%}{{- '<|im_system|>' ~ who ~ '<|im_middle|>' -}}"
    "{%- endif -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "{%- if loop.index0 > ns.history_end and not no_thinking -%}"
    "{{- '<think>' ~ m.get('reasoning_content', '') ~ '</think>' -}}"
    "{%- else -%}"
    "{{- '<think></think>' -}}"
    "{%- endif -%}"
    "{%- elif m['role'] == 'tool' -%}"
    "{{- '## Return of ' ~ m['tool_call_id'] ~ '\n' -}}"
    "{%- endif -%}"
    "{%- set c = m.get('content') -%}"
    "{%- if c is string -%}{{- c -}}"
    "{%- elif c is not none -%}"
    "{%- for part in c -%}"
    "{%- if part['type'] in ('image', 'image_url') -%}"
    "{{- '<|media_begin|>image<|media_content|><|media_pad|><|media_end|>\n' -}}"
    "{%- else -%}{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- if m['role'] == 'assistant' and m.get('tool_calls') -%}"
    "{{- '<|tool_calls_section_begin|>' -}}"
    "{%- for call in m['tool_calls'] -%}"
    "{%- set args = call['function']['arguments'] -%}"
    "{{- '<|tool_call_begin|>' ~ call['id'] ~ '<|tool_call_argument_begin|>' -}}"
    "{%- if args is string -%}{{- args -}}{%- else -%}{{- args | tojson -}}{%- endif -%}"
    "{{- '<|tool_call_end|>' -}}"
    "{%- endfor -%}"
    "{{- '<|tool_calls_section_end|>' -}}"
    "{%- endif -%}"
    "{{- '<|im_end|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_assistant|>assistant<|im_middle|>' -}}"
    "{{- '<think></think>' if no_thinking else '<think>' -}}"
    "{%- endif -%}"
)
