"""Tokenizers and templates for the loss-mask and tokenization tests (built offline, fast).

`build_test_tokenizer(out_dir)` trains a small byte-level BPE whose added tokens cover the
Llama-3-style and Qwen3-thinking-style templates of ``tests/support/templates/`` as well as the demo
template, and saves it as a `transformers` folder. `build_kimi_test_tokenizer(out_dir)` builds
the Kimi-like tiktoken tokenizer (a slow tokenizer loaded with ``trust_remote_code``, with Kimi's
chat template) on the same small text. `TEMPLATES` maps a template name to its text.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from eyas.tiny.kimi_template import CHAT_TEMPLATE as KIMI_TEMPLATE
from eyas.tiny.kimi_tokenizer import CJK_LINES, build_kimi_tokenizer
from eyas.tiny.template import CHAT_TEMPLATE as DEMO_TEMPLATE

TEMPLATE_DIR = Path(__file__).parent / "templates"
TEMPLATES = {
    "demo": DEMO_TEMPLATE,
    "llama3": (TEMPLATE_DIR / "llama3_style.jinja").read_text(encoding="utf-8"),
    "qwen3": (TEMPLATE_DIR / "qwen3_thinking_style.jinja").read_text(encoding="utf-8"),
    "kimi": KIMI_TEMPLATE,
}

SPECIAL = [
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|end|>",
    "<|pad|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|tool|>",
]
# Visible markup, added but not special (as thinking models ship them).
MARKUP = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]

_CORPUS = [
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "Hello! How can I help you today? I think the answer is 42, because 6 * 7 = 42.",
    "Paris is the capital of France. Berlin is the capital of Germany.",
    "Ünïcödé: café, naïve, 日本語のテキスト, emoji 🙂🚀, Ελληνικά, русский текст.",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "system user assistant tool ipython You are a helpful assistant. Think step by step.",
]


def build_test_tokenizer(out_dir: Path) -> Path:
    """Train the test tokenizer and save it at `out_dir` (a second or less)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    tok.add_tokens(MARKUP)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|end|>",
        pad_token="<|pad|>",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = DEMO_TEMPLATE
    fast.save_pretrained(out_dir)
    return Path(out_dir)


def build_kimi_test_tokenizer(out_dir: Path) -> Path:
    """The Kimi-like tokenizer folder trained on the small test text (a second or two).

    Load it with ``AutoTokenizer.from_pretrained(out_dir, trust_remote_code=True)``.
    """
    return build_kimi_tokenizer(out_dir, texts=(_CORPUS + CJK_LINES) * 20)
