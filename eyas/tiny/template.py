"""The tiny target's chat format: special tokens and the Jinja chat template.

Rendered form of one conversation (no newline after an end-of-turn token)::

    <|begin_of_text|><|system|>
    You are terse.<|end|><|user|>
    Hi<|end|><|assistant|>
    <think>
    The user greets me.
    </think>
    Hello.<|end|>

- Every turn is ``<|ROLE|>\\n`` + content + ``<|end|>``; roles are system, user, assistant, tool.
- An assistant turn with ``reasoning_content`` renders it as ``<think>\\n...\\n</think>\\n``
  before the content, on every assistant turn that has it (no turn is treated specially).
- An assistant turn with ``tool_calls`` renders each as ``<tool_call>{json}</tool_call>``
  after the content.
- ``tools`` (when given) become a ``<|system|>`` turn listing them as JSON, before all messages.
- ``add_generation_prompt`` appends ``<|assistant|>\\n``.

Like most real templates it has no ``{% generation %}`` markers: the loss mask of assistant
tokens must be derived elsewhere (that is part of what eyas tests).
"""

from __future__ import annotations

BOS = "<|begin_of_text|>"
END_OF_TURN = "<|end|>"
PAD = "<|pad|>"
ROLE_TOKENS = {
    "system": "<|system|>",
    "user": "<|user|>",
    "assistant": "<|assistant|>",
    "tool": "<|tool|>",
}
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

# Control tokens: skipped by decode(skip_special_tokens=True).
SPECIAL_TOKENS = [BOS, END_OF_TURN, PAD, *ROLE_TOKENS.values()]
# Markup tokens that stay visible in decoded text (like real thinking models' <think>).
MARKUP_TOKENS = [THINK_OPEN, THINK_CLOSE, TOOL_CALL_OPEN, TOOL_CALL_CLOSE]

CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- if tools -%}"
    "{{- '<|system|>\n' + 'Available tools:\n' -}}"
    "{%- for tool in tools -%}{{- tool | tojson -}}{{- '\n' -}}{%- endfor -%}"
    "{{- '<|end|>' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] -%}"
    "{{- raise_exception('unknown role: ' + message['role']) -}}"
    "{%- endif -%}"
    "{{- '<|' + message['role'] + '|>\n' -}}"
    "{%- if message['role'] == 'assistant' and message.get('reasoning_content') -%}"
    "{{- '<think>\n' + message['reasoning_content'] + '\n</think>\n' -}}"
    "{%- endif -%}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- elif message['content'] -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- if message['role'] == 'assistant' and message.get('tool_calls') -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- set fn = call['function'] if call.get('function') else call -%}"
    "{{- '<tool_call>' -}}"
    "{{- {'name': fn['name'], 'arguments': fn['arguments']} | tojson -}}"
    "{{- '</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|end|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\n' -}}{%- endif -%}"
)
