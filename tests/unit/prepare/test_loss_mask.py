"""Loss masks: the masked tokens decode to exactly the assistant turns, for four templates.

Expected texts are written out per template from the template's documented format (not from
the code under test): per assistant turn, ``[reasoning block as rendered] + content +
end-of-turn token``; nothing of system/user/tool turns. Three templates run on a fast
byte-level BPE tokenizer; Kimi's runs on the Kimi-like tiktoken tokenizer, a slow tokenizer
loaded with ``trust_remote_code`` (its offsets come from its tiktoken encoding).
"""

from __future__ import annotations

import json
import random

import pytest
from support.loss_mask_fixtures import TEMPLATES, build_kimi_test_tokenizer, build_test_tokenizer
from transformers import AutoTokenizer

from eyas.conversation import Conversation, Message
from eyas.errors import DataError
from eyas.prepare.loss_mask import (
    TemplateError,
    final_turn_mode,
    mask_from_offsets,
    probe_template,
    reasoning_counts,
    render_with_spans,
    tokenize_conversation,
)
from eyas.prepare.offsets import encode_with_offsets
from eyas.tiny.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def test_tok(tmp_path_factory):
    return AutoTokenizer.from_pretrained(build_test_tokenizer(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def kimi_tok(tmp_path_factory):
    """The Kimi-like tiktoken tokenizer (slow, remote code), with Kimi's chat template."""
    folder = build_kimi_test_tokenizer(tmp_path_factory.mktemp("kimi"))
    return AutoTokenizer.from_pretrained(folder, trust_remote_code=True)


@pytest.fixture
def tok_for(request):
    """The tokenizer a template is tested with: Kimi's own for "kimi", the fast one otherwise."""
    return lambda template: request.getfixturevalue(
        "kimi_tok" if template == "kimi" else "test_tok"
    )


@pytest.fixture(scope="module")
def tiny_tok(tmp_path_factory):
    """The demo's real tokenizer (eyas.tiny), with its own chat template."""
    return AutoTokenizer.from_pretrained(build_tokenizer(tmp_path_factory.mktemp("tiny")))


def _runs(tok, ids, mask) -> list[str]:
    runs, cur = [], []
    for t, m in zip(ids, mask, strict=True):
        if m:
            cur.append(t)
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    if cur:
        runs.append(tok.decode(cur))
    return runs


def _tool_json(call: dict, key: str) -> str:
    fn = call["function"]
    return json.dumps({"name": fn["name"], key: fn["arguments"]})


def expected_runs(template: str, conv: Conversation, reasoning: bool) -> list[str]:
    """The assistant text each template renders, per assistant turn, written independently."""
    out = []
    msgs = conv.messages
    last_user = max((i for i, m in enumerate(msgs) if m.role == "user"), default=-1)
    # Kimi (final_turn as_generated, the default for its thinking generation prompt): the
    # final turn is what the model wrote after the generation prompt, its reasoning included;
    # the earlier turns are rendered as the prompt of that final turn showed them: the last
    # assistant turn without tool calls before it and all before that are history (no
    # reasoning), the turns of an ongoing tool exchange keep theirs.
    final = len(msgs) - 1 if msgs[-1].role == "assistant" else None
    history_end = max(
        (i for i, m in enumerate(msgs[:final]) if m.role == "assistant" and not m.tool_calls),
        default=-1,
    )
    for i, m in enumerate(msgs):
        if m.role != "assistant":
            continue
        calls = m.tool_calls or []
        if template == "demo":
            think = f"<think>\n{m.reasoning_content}\n</think>\n" if m.reasoning_content else ""
            tools = "".join(f"<tool_call>{_tool_json(c, 'arguments')}</tool_call>" for c in calls)
            if not reasoning and not m.content and think:  # the span starts where the
                think = think.removeprefix(f"<think>\n{m.reasoning_content}")  # content would
            elif not reasoning:
                think = ""
            out.append(think + m.content + tools + "<|end|>")
        elif template == "llama3":
            tools = "".join(_tool_json(c, "parameters") for c in calls)
            out.append(m.content.strip() + tools + "<|eot_id|>")
        elif template == "qwen3":
            rendered_think = i > last_user and (i == len(msgs) - 1 or bool(m.reasoning_content))
            r = (m.reasoning_content or "").strip("\n")
            think = f"<think>\n{r}\n</think>\n\n" if rendered_think else ""
            content = m.content.strip("\n")
            tools = "".join(
                ("\n" if (content or k) else "")
                + f"<tool_call>\n{_tool_json(c, 'arguments')}\n</tool_call>"
                for k, c in enumerate(calls)
            )
            out.append((think if reasoning else "") + content + tools + "<|im_end|>")
        elif template == "kimi":
            # The generation prompt ends with <think>: what follows it is the model's output.
            thought = (m.reasoning_content or "") if (i == final or i > history_end) else ""
            tools = kimi_tool_calls(calls)
            if reasoning or not m.content:  # no content: the span starts at the header's end
                out.append(thought + "</think>" + m.content + tools + "<|im_end|>")
            else:
                out.append(m.content + tools + "<|im_end|>")
    return out


def kimi_tool_calls(calls: list[dict]) -> str:
    """Kimi's tool-call section, as its template renders it (object arguments as JSON)."""
    tools = "".join(
        f"<|tool_call_begin|>{c.get('id', '')}<|tool_call_argument_begin|>"
        + json.dumps(c["function"]["arguments"])
        + "<|tool_call_end|>"
        for c in calls
    )
    return f"<|tool_calls_section_begin|>{tools}<|tool_calls_section_end|>" if tools else ""


def kimi_as_generated(tok, conv: Conversation) -> str:
    """What Kimi saw and wrote for a conversation's final assistant turn, written out by hand:
    the prompt it answered (its template with the generation prompt, ``...<think>``) and then
    its output ``reasoning</think>answer[tool calls]<|im_end|>``."""
    *before, final = conv.messages
    prompt = tok.apply_chat_template([m.to_openai() for m in before], tools=conv.tools,
                                     tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_assistant|>assistant<|im_middle|><think>")
    return (prompt + (final.reasoning_content or "") + "</think>" + final.content
            + kimi_tool_calls(final.tool_calls or []) + "<|im_end|>")


CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
CALL_1 = {"id": "functions.get_weather:0", **CALL}
CALL_2 = {"id": "functions.get_weather:1", "type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Berlin"}}}
WEATHER_TOOL = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]

CONVERSATIONS = {
    "single": Conversation(
        "single", [Message("user", "Hello!"), Message("assistant", "Hello! How can I help?")]
    ),
    "system": Conversation(
        "system",
        [
            Message("system", "You are a helpful assistant."),
            Message("user", "What is 6 * 7?"),
            Message("assistant", "The answer is 42."),
        ],
    ),
    "multi_reasoning": Conversation(
        "multi_reasoning",
        [
            Message("system", "Think step by step."),
            Message("user", "Paris is the capital of which country?"),
            Message("assistant", "France.", reasoning_content="Paris is the capital of France."),
            Message("user", "And Berlin?"),
            Message("assistant", "Germany.", reasoning_content="Berlin is the capital of Germany."),
        ],
    ),
    "echo": Conversation(  # the answer repeats the question: must not be matched in the user turn
        "echo",
        [
            Message("user", "Hello"),
            Message("assistant", "Hello"),
            Message("user", "Hello"),
            Message("assistant", "Hello", reasoning_content="Hello"),
        ],
    ),
    "unicode": Conversation(
        "unicode",
        [
            Message("user", "Ünïcödé? 日本語"),
            Message(
                "assistant", "café naïve 日本語のテキスト 🙂🚀", reasoning_content="Ελληνικά 🙂"
            ),
        ],
    ),
    "tools": Conversation(
        "tools",
        [
            Message("user", "Weather in Paris?"),
            Message("assistant", "", tool_calls=[CALL]),
            Message("tool", '{"temp": 21}'),
            Message("assistant", "It is 21 degrees in Paris."),
        ],
        tools=WEATHER_TOOL,
    ),
    # A thinking model's agent loop: a finished exchange (history), then a tool call whose
    # reasoning the target saw when it wrote the final answer, then the final answer.
    "tools_reasoning": Conversation(
        "tools_reasoning",
        [
            Message("system", "Use the tools."),
            Message("user", "Weather in Paris?"),
            Message("assistant", "", reasoning_content="I should look it up.",
                    tool_calls=[CALL_1]),
            Message("tool", '{"temp": 21}'),
            Message("assistant", "It is 21 degrees in Paris.",
                    reasoning_content="The tool says 21."),
            Message("user", "And Berlin?"),
            Message("assistant", "Checking.", reasoning_content="Same tool, other city.",
                    tool_calls=[CALL_2]),
            Message("tool", '{"temp": 18}'),
            Message("assistant", "It is 18 degrees in Berlin.",
                    reasoning_content="The tool says 18; answer briefly."),
        ],
        tools=WEATHER_TOOL,
    ),
}


TEMPLATE_NAMES = ["demo", "llama3", "qwen3", "kimi"]


@pytest.mark.parametrize("reasoning", [True, False], ids=["reasoning", "no_reasoning"])
@pytest.mark.parametrize("conv_name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("template", TEMPLATE_NAMES)
def test_masked_tokens_decode_to_exactly_the_assistant_turns(
    tok_for, template, conv_name, reasoning
):
    tok = tok_for(template)
    conv = CONVERSATIONS[conv_name]
    ids, mask = tokenize_conversation(
        tok, conv, train_on_reasoning=reasoning, chat_template=TEMPLATES[template]
    )
    assert len(ids) == len(mask)
    assert _runs(tok, ids, mask) == expected_runs(template, conv, reasoning)
    if template == "kimi":
        # The prompt Kimi answered, then what it wrote (its thinking generation prompt).
        reference = tok(kimi_as_generated(tok, conv), add_special_tokens=False)["input_ids"]
    else:
        # input_ids are what the template + tokenizer give (no double BOS, nothing changed,
        # no generation prompt even where the tokenizer class defaults to adding one).
        reference = tok.apply_chat_template(
            [m.to_openai() for m in conv.messages],
            tools=conv.tools,
            tokenize=True,
            return_dict=False,
            add_generation_prompt=False,
            chat_template=TEMPLATES[template],
        )
    assert ids == list(reference)


@pytest.mark.parametrize("reasoning", [True, False])
@pytest.mark.parametrize("conv_name", ["single", "system", "multi_reasoning", "tools"])
def test_demo_tokenizer_and_its_own_template(tiny_tok, conv_name, reasoning):
    conv = CONVERSATIONS[conv_name]
    ids, mask = tokenize_conversation(tiny_tok, conv, train_on_reasoning=reasoning)
    assert _runs(tiny_tok, ids, mask) == expected_runs("demo", conv, reasoning)


def test_nothing_of_user_or_system_turns_is_masked(test_tok):
    conv = CONVERSATIONS["multi_reasoning"]
    ids, mask = tokenize_conversation(test_tok, conv, chat_template=TEMPLATES["qwen3"])
    unmasked = test_tok.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    for m in conv.messages:
        if m.role in ("system", "user"):
            assert m.content in unmasked
    masked = test_tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert "capital of which country" not in masked and "<|im_start|>" not in masked


def test_qwen3_drops_earlier_reasoning_and_masks_only_what_is_rendered(test_tok):
    conv = CONVERSATIONS["multi_reasoning"]
    ids, mask = tokenize_conversation(test_tok, conv, chat_template=TEMPLATES["qwen3"])
    text = test_tok.decode(ids)
    assert "Paris is the capital of France." not in text  # dropped by the template
    assert _runs(test_tok, ids, mask)[0] == "France.<|im_end|>"


def _cut_multi_turn() -> Conversation:
    """Phase 1's answers as read back: the second answer was cut at max_tokens."""
    return Conversation.from_json({
        "id": "cut",
        "conversations": [
            {"role": "user", "content": "Paris is the capital of which country?"},
            {"role": "assistant", "content": "France."},
            {"role": "user", "content": "And Berlin?"},
            {"role": "assistant", "content": "Berlin is the capital of"},
        ],
        "finish_reasons": ["stop", "length"],
    })


@pytest.mark.parametrize("template", ["demo", "llama3", "qwen3"])
def test_an_answer_cut_at_max_tokens_leaves_its_end_of_turn_unsupervised(test_tok, template):
    cut = _cut_multi_turn()
    finished = Conversation(cut.id, [Message(m.role, m.content) for m in cut.messages])
    ids, mask = tokenize_conversation(test_tok, cut, chat_template=TEMPLATES[template])
    eot = probe_template(test_tok, TEMPLATES[template]).end_of_turn
    want = expected_runs(template, finished, True)
    # The finished first answer keeps its end-of-turn; the cut one is supervised up to its
    # last written token only: the template closed the turn, the target never did.
    assert _runs(test_tok, ids, mask) == [want[0], want[1].removesuffix(eot)]
    finished_ids, finished_mask = tokenize_conversation(test_tok, finished,
                                                        chat_template=TEMPLATES[template])
    assert ids == finished_ids
    assert sum(finished_mask) - sum(mask) == 1  # exactly the closing end-of-turn token
    # Supervising it anyway (tokenize.cut_answers: keep) gives the finished conversation's mask.
    _, kept = tokenize_conversation(test_tok, cut, chat_template=TEMPLATES[template],
                                    supervise_truncated_end=True)
    assert kept == finished_mask


CUT_THINKING = Conversation.from_json({
    "id": "cut-thinking",
    "conversations": [{"role": "user", "content": "What is 6 * 7?"},
                      {"role": "assistant", "content": "",
                       "reasoning_content": "I think the answer is"}],
    "finish_reasons": ["length"],
})


def test_an_answer_cut_inside_its_reasoning_leaves_the_closing_tags_unsupervised(test_tok):
    ids, mask = tokenize_conversation(test_tok, CUT_THINKING, chat_template=TEMPLATES["demo"])
    # The demo template closes the thought ("</think>") and the turn ("<|end|>"): neither is
    # the target's.
    assert _runs(test_tok, ids, mask) == ["<think>\nI think the answer is"]
    # Without training on reasoning nothing of this turn is left to learn.
    with pytest.raises(DataError, match="loss mask is empty"):
        tokenize_conversation(test_tok, CUT_THINKING, train_on_reasoning=False,
                              chat_template=TEMPLATES["demo"])


def test_probe_finds_header_and_end_of_turn(test_tok, tiny_tok, kimi_tok):
    p = probe_template(test_tok, TEMPLATES["llama3"])
    assert p.end_of_turn == "<|eot_id|>"
    assert p.header == "<|start_header_id|>assistant<|end_header_id|>\n\n"
    q = probe_template(test_tok, TEMPLATES["qwen3"])
    assert (q.header, q.end_of_turn) == ("<|im_start|>assistant\n", "<|im_end|>")
    d = probe_template(tiny_tok)
    assert (d.header, d.end_of_turn) == ("<|assistant|>\n", "<|end|>")
    k = probe_template(kimi_tok)  # its own template; the slow tokenizer's offsets
    assert (k.header, k.end_of_turn) == (
        "<|im_assistant|>assistant<|im_middle|><think>",
        "<|im_end|>",
    )


def test_rewritten_content_is_an_error_naming_sample_and_turn(test_tok):
    shouting = TEMPLATES["llama3"].replace(
        "(message['content'] or '') | trim", "(message['content'] or '') | replace('quiet', 'loud')"
    )
    conv = Conversation(
        "s-7",
        [Message("user", "hi"), Message("assistant", "quiet answer")],
        meta={"path": "data.jsonl", "line": 7},
    )
    with pytest.raises(DataError) as exc:
        tokenize_conversation(test_tok, conv, chat_template=shouting)
    msg = str(exc.value)
    assert "data.jsonl:7" in msg and "'s-7'" in msg and "messages[1].content" in msg


def test_conversation_without_assistant_turn_is_an_error(test_tok):
    conv = Conversation("p", [Message("user", "hi")])
    with pytest.raises(DataError, match="no assistant turn"):
        tokenize_conversation(test_tok, conv, chat_template=TEMPLATES["llama3"])


@pytest.mark.parametrize(("template", "marker"), [("llama3", "<|eot_id|>"), ("kimi", "<|im_end|>")])
def test_content_containing_the_end_of_turn_marker_is_an_error(tok_for, template, marker):
    conv = Conversation("p", [Message("user", "hi"), Message("assistant", f"a {marker} b")])
    with pytest.raises(DataError, match="end-of-turn marker"):
        tokenize_conversation(tok_for(template), conv, chat_template=TEMPLATES[template])


@pytest.mark.parametrize(
    "question",
    ["Why does <|im_end|> end a turn?", "What is </think> for?", "Is [EOS] <|im_user|> a token?"],
)
def test_user_text_that_spells_special_tokens_leaves_the_mask_exact(kimi_tok, question):
    """Kimi's tokenizer encodes spelled special tokens as the tokens themselves; the mask
    still covers exactly the answer."""
    conv = Conversation("s", [Message("user", question), Message("assistant", "It is special.")])
    ids, mask = tokenize_conversation(kimi_tok, conv)
    assert _runs(kimi_tok, ids, mask) == ["</think>It is special.<|im_end|>"]


def test_user_text_that_spells_the_assistant_header_is_an_error_not_a_wrong_mask(kimi_tok):
    spoof = "Say <|im_assistant|>assistant<|im_middle|><think> please"
    conv = Conversation("s", [Message("user", spoof), Message("assistant", "No.")])
    with pytest.raises(DataError, match="content was not found"):
        tokenize_conversation(kimi_tok, conv)


def test_template_without_added_end_token_cannot_be_probed(test_tok):
    plain = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(TemplateError, match="end-of-turn"):
        probe_template(test_tok, plain)


def test_mask_from_offsets_overlap_rule():
    spans = [(5, 10), (20, 22)]
    offsets = [(0, 5), (4, 6), (6, 10), (10, 12), (12, 20), (20, 21), (21, 21), (21, 22), (22, 30)]
    # (4, 6) straddles the span start: masked; zero-width (21, 21) inside a span: masked.
    assert mask_from_offsets(offsets, spans) == [0, 1, 1, 0, 0, 1, 1, 1, 0]
    assert mask_from_offsets([(0, 3)], []) == [0]


_PIECES = [
    "Hello",
    "hello",
    " world",
    "  ",
    "\n",
    "\n\n",
    "\t",
    "café",
    "日本語",
    "🙂",
    "42",
    "6 * 7",
    "Paris",
    "<",
    ">",
    "{",
    "}",
    "def f(x):\n    return x",
    "—",
    "naïve",
    "Ελληνικά",
    ".",
]


def _random_text(rng: random.Random, user_words: str = "") -> str:
    parts = [rng.choice(_PIECES) for _ in range(rng.randint(1, 8))]
    if user_words and rng.random() < 0.5:
        parts.insert(rng.randint(0, len(parts)), user_words)
    return "".join(parts)


@pytest.mark.parametrize("template", TEMPLATE_NAMES)
def test_property_random_texts(tok_for, template):
    """Seeded random conversations (unicode, whitespace, answers repeating the question).

    A masked run equals the expected assistant text, except that a token straddling the start
    of the turn (template newline merged with the content's leading whitespace) may add
    whitespace in front: the documented overlap rule.
    """
    tok = tok_for(template)
    rng = random.Random(1234 + len(template))
    for n in range(60):
        msgs = []
        if rng.random() < 0.5:
            msgs.append(Message("system", _random_text(rng)))
        for _ in range(rng.randint(1, 3)):
            question = _random_text(rng)
            msgs.append(Message("user", question))
            answer = _random_text(rng, question)
            if not answer.strip():
                answer = "ok" + answer
            thought = _random_text(rng, question) if rng.random() < 0.5 else None
            if thought is not None and not thought.strip():
                thought = None
            msgs.append(Message("assistant", answer, reasoning_content=thought))
        conv = Conversation(f"r{n}", msgs)
        reasoning = rng.random() < 0.5
        ids, mask = tokenize_conversation(
            tok, conv, train_on_reasoning=reasoning, chat_template=TEMPLATES[template]
        )
        runs = _runs(tok, ids, mask)
        expected = expected_runs(template, conv, reasoning)
        assert len(runs) == len(expected), (conv, runs, expected)
        for got, want in zip(runs, expected, strict=True):
            assert got.endswith(want), (conv, got, want)
            assert not got[: len(got) - len(want)].strip(), (conv, got, want)


def test_a_cut_thought_is_supervised_as_written_not_the_templates_closing_tags(kimi_tok):
    # Kimi's template renders the last answer as history ("<think></think>"); as generated,
    # the thought is the target's, the closing tag and end-of-turn the template's.
    ids, mask = tokenize_conversation(kimi_tok, CUT_THINKING)
    assert _runs(kimi_tok, ids, mask) == ["I think the answer is"]
    assert kimi_tok.decode(ids).endswith("<think>I think the answer is</think><|im_end|>")
    # As the template renders it, nothing of the turn is the target's: nothing to train.
    with pytest.raises(DataError, match="loss mask is empty"):
        tokenize_conversation(kimi_tok, CUT_THINKING, final_turn="as_template")


def _supervised_reasoning(tok, conv, **kwargs) -> dict[str, int]:
    rendered = render_with_spans(tok, conv, **kwargs)
    ((ids, offsets),) = encode_with_offsets(tok, [rendered.text])
    return reasoning_counts(tok, rendered, offsets, mask_from_offsets(offsets, rendered.spans))


@pytest.mark.parametrize("conv_name", ["multi_reasoning", "tools_reasoning", "unicode", "echo"])
def test_kimi_final_reasoning_is_trained_as_generated_and_counted(kimi_tok, conv_name):
    """The bug this guards against: Kimi's template drops a finished answer's reasoning, so
    rendering the conversation as the template does trains none of the final thought."""
    conv = CONVERSATIONS[conv_name]
    final = conv.messages[-1].reasoning_content
    n_final = len(kimi_tok(final, add_special_tokens=False)["input_ids"])
    ids, mask = tokenize_conversation(kimi_tok, conv)
    # Decoded supervised tokens of the final turn == exactly what the target wrote.
    assert _runs(kimi_tok, ids, mask)[-1] == f"{final}</think>{conv.messages[-1].content}" + (
        kimi_tool_calls(conv.messages[-1].tool_calls or [])) + "<|im_end|>"
    counts = _supervised_reasoning(kimi_tok, conv)
    assert counts["final_reasoning_tokens"] == counts["final_reasoning_supervised"] == n_final
    # As the template renders it: the final thought is generated but never supervised.
    old = _supervised_reasoning(kimi_tok, conv, final_turn="as_template")
    assert old["final_reasoning_tokens"] == n_final and old["final_reasoning_supervised"] == 0
    _, old_mask = tokenize_conversation(kimi_tok, conv, final_turn="as_template")
    # Exactly the reasoning tokens are added to what is trained.
    assert sum(mask) - sum(old_mask) == counts["reasoning_supervised"] - old["reasoning_supervised"]


def test_kimi_tool_exchange_reasoning_the_target_saw_is_trained(kimi_tok):
    conv = CONVERSATIONS["tools_reasoning"]
    counts = _supervised_reasoning(kimi_tok, conv)
    earlier = [m.reasoning_content for m in conv.messages[:-1] if m.reasoning_content]
    n = {r: len(kimi_tok(r, add_special_tokens=False)["input_ids"]) for r in earlier}
    # The finished first exchange is history (its two thoughts dropped); the ongoing one's
    # thought and the final one are in the prompt / the output, and supervised.
    dropped = n["I should look it up."] + n["The tool says 21."]
    assert counts["reasoning_tokens"] - counts["reasoning_supervised"] == dropped
    runs = _runs(kimi_tok, *tokenize_conversation(kimi_tok, conv))
    assert runs[2] == ("Same tool, other city.</think>Checking."
                       + kimi_tool_calls([CALL_2]) + "<|im_end|>")


def test_final_turn_as_generated_keeps_other_templates_unchanged(test_tok):
    for name in ("demo", "llama3", "qwen3"):
        for conv in CONVERSATIONS.values():
            a = tokenize_conversation(test_tok, conv, chat_template=TEMPLATES[name])
            b = tokenize_conversation(test_tok, conv, chat_template=TEMPLATES[name],
                                      final_turn="as_generated")
            assert a == b, (name, conv.id)


def test_probe_tells_thinking_prompts_and_dropped_final_reasoning(test_tok, kimi_tok):
    k = probe_template(kimi_tok)
    assert (k.think_open, k.drops_final_reasoning) == ("<think>", True)
    assert final_turn_mode("auto", k) == "as_generated"
    for name, drops in (("demo", False), ("llama3", True), ("qwen3", False)):
        p = probe_template(test_tok, TEMPLATES[name])
        assert (p.think_open, p.drops_final_reasoning) == (None, drops), name
        assert final_turn_mode("auto", p) == "as_template"
    # A Qwen3-2507-style thinking prompt (the template opens the thought for the model).
    opened = TEMPLATES["qwen3"].replace("{{- '<|im_start|>assistant\\n' -}}\n{%- endif -%}",
                                        "{{- '<|im_start|>assistant\\n<think>\\n' -}}\n{%- endif -%}")
    assert opened != TEMPLATES["qwen3"]
    assert probe_template(test_tok, opened).think_open == "<think>"



def test_a_thinking_prompt_whose_history_drops_the_thought_is_left_as_rendered(test_tok):
    """A DeepSeek-R1-like template: the generation prompt opens a thought, finished turns
    render no think block at all. Where the output starts in a finished turn is unknown: the
    sample stays as the template renders it (answers masked after the bare header), and the
    counts say its final reasoning is not trained."""
    r1_like = TEMPLATES["llama3"].replace(
        "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n{%- endif -%}",
        "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n<think>\\n' -}}\n{%- endif -%}")
    assert r1_like != TEMPLATES["llama3"]
    assert probe_template(test_tok, r1_like).think_open == "<think>"
    conv = CONVERSATIONS["multi_reasoning"]
    ids, mask = tokenize_conversation(test_tok, conv, chat_template=r1_like)
    assert (ids, mask) == tokenize_conversation(test_tok, conv, chat_template=r1_like,
                                                final_turn="as_template")
    assert _runs(test_tok, ids, mask) == expected_runs("llama3", conv, True)
    counts = _supervised_reasoning(test_tok, conv, chat_template=r1_like)
    assert counts["final_reasoning_tokens"] > 0 and counts["final_reasoning_supervised"] == 0
