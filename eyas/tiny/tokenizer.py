"""The tiny target's tokenizer: byte-level BPE trained offline on the standard library.

`build_tokenizer(out_dir)` writes a `transformers` tokenizer folder that
``AutoTokenizer.from_pretrained(out_dir)`` loads offline: ``tokenizer.json``,
``tokenizer_config.json`` (eos = end-of-turn token, pad, bos) and the chat template.
Two builds on the same Python version give byte-identical ``tokenizer.json``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from eyas.tiny.corpus import tokenizer_texts
from eyas.tiny.template import (
    BOS,
    CHAT_TEMPLATE,
    END_OF_TURN,
    MARKUP_TOKENS,
    PAD,
    SPECIAL_TOKENS,
)

VOCAB_SIZE = 4096
MODEL_MAX_LENGTH = 2048


def train_tokenizer_object(vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """Train the byte-level BPE `tokenizers.Tokenizer` (special and markup tokens included)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tokenizer_texts(), trainer=trainer)
    # Markup tokens are single ids but stay visible in decoded text.
    tok.add_tokens(list(MARKUP_TOKENS))
    return tok


def build_tokenizer(out_dir: Path) -> Path:
    """Train the tiny tokenizer and save it as a `transformers` folder at `out_dir`.

    Returns `out_dir`. Existing files of the same names are replaced; the folder appears
    complete or not at all (written to a temporary sibling, then moved file by file into
    place). Takes a few seconds; needs no network.
    """
    return save_tokenizer(train_tokenizer_object(), out_dir)


def save_tokenizer(tokenizer_object: Tokenizer, out_dir: Path) -> Path:
    """Save a trained tiny `tokenizers.Tokenizer` as a `transformers` folder at `out_dir`.

    Adds the special tokens' roles (bos, eos = end of turn, pad), the chat template and a
    portable ``tokenizer_config.json``; `build_tokenizer` and the shipped tiny target (which
    carries only ``tokenizer.json``) both end here. Returns `out_dir`.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast = fast_tokenizer(tokenizer_object)
    with tempfile.TemporaryDirectory(prefix=".tmp-tokenizer-", dir=out_dir) as tmp:
        fast.save_pretrained(tmp)
        _make_config_portable(Path(tmp) / "tokenizer_config.json")
        for item in sorted(Path(tmp).iterdir()):
            shutil.move(str(item), str(out_dir / item.name))
    return out_dir


def fast_tokenizer(tokenizer_object: Tokenizer) -> PreTrainedTokenizerFast:
    """The `transformers` tokenizer of a tiny `tokenizers.Tokenizer`: roles, chat template."""
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer_object,
        bos_token=BOS,
        eos_token=END_OF_TURN,
        pad_token=PAD,
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _make_config_portable(config_path: Path) -> None:
    """Name a tokenizer class and carry the chat template that transformers 4.x also knows.

    transformers 5 writes ``TokenizersBackend`` and a separate ``chat_template.jinja``;
    serving engines on GPU hosts often pin transformers 4.x, which knows neither.
    """
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
