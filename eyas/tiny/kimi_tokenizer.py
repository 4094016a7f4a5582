"""A tokenizer folder that behaves like Kimi-K2.5's, built offline.

``build_kimi_tokenizer(out_dir)`` writes a folder that
``AutoTokenizer.from_pretrained(out_dir, trust_remote_code=True)`` loads, laid out like
Kimi-K2.5's own::

    tiktoken.model             BPE ranks: base64 token bytes and rank, one per line
    tokenization_kimi_like.py  the tokenizer class (`eyas.tiny.tokenization_kimi_like`)
    tokenizer_config.json      auto_map -> that class, special tokens, added_tokens_decoder
    chat_template.jinja        Kimi-K2.5's chat format (`eyas.tiny.kimi_template`)

The ranks are trained here, on the standard library text the tiny target learns from plus a
few lines of Chinese and Japanese (so Kimi's separate Han branch gets merges of its own):
`BASE_VOCAB` ranks, then the 256 reserved special tokens at Kimi's offsets. Byte-level BPE
training (the ``tokenizers`` library, splitting text with Kimi's own pattern) only chooses
the ranks; encoding is tiktoken's, as in Kimi's class. Two builds give identical files.
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from eyas.tiny import tokenization_kimi_like as remote
from eyas.tiny.kimi_template import CHAT_TEMPLATE, SPECIAL_TOKEN_OFFSETS

BASE_VOCAB = 3840
"""Ranks before the special tokens: with the 256 reserved ones, a vocabulary of 4096."""
MODEL_MAX_LENGTH = 262144

# Han and kana text (written for this file) so the Han branch of the pattern sees real runs.
CJK_LINES = [
    "今天天气很好，我们去公园散步吧。",
    "这个函数返回两个数字的和，请检查输入是否为整数。",
    "北京是中国的首都，上海是最大的城市。",
    "机器学习模型需要大量的数据来训练。",
    "日本語のテキストも少し含めます。東京は日本の首都です。",
    "请用中文回答：六乘以七等于多少？答案是四十二。",
    "代码审查发现了三个错误，已经全部修复。",
    "推理过程：先计算括号里的内容，再计算乘法。",
]


def _training_texts() -> list[str]:
    from eyas.tiny.corpus import tokenizer_texts

    return tokenizer_texts() + CJK_LINES * 50


def train_ranks(texts: Iterable[str], base_vocab: int = BASE_VOCAB) -> dict[bytes, int]:
    """Byte-level BPE ranks (token bytes -> rank) of `base_vocab` tokens learnt from `texts`.

    Every single byte is a token; merged tokens are ranked in the order they were learnt,
    which is the priority tiktoken's BPE applies. No token spells a special token's text.
    """
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(remote.PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=base_vocab,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    to_byte = {c: b for b, c in remote._byte_alphabet().items()}
    specials = {s.encode("utf-8") for s in SPECIAL_TOKEN_OFFSETS.values()}
    ranks: dict[bytes, int] = {}
    for token, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1]):
        data = bytes(to_byte[c] for c in token)
        if data not in specials and data not in ranks:
            ranks[data] = len(ranks)
    missing = set(range(256)) - {d[0] for d in ranks if len(d) == 1}
    if missing:  # cannot happen with the byte alphabet as initial alphabet
        raise RuntimeError(f"BPE training lost single bytes {sorted(missing)[:5]}")
    return ranks


def write_ranks(path: Path, ranks: dict[bytes, int]) -> None:
    """Write `ranks` in tiktoken's file format (``base64 rank`` lines, by rank)."""
    lines = [
        f"{base64.b64encode(token).decode('ascii')} {rank}\n"
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1])
    ]
    Path(path).write_text("".join(lines), encoding="ascii")


def tokenizer_config(n_base: int) -> dict:
    """The ``tokenizer_config.json`` of a folder whose ranks file holds `n_base` tokens."""
    decoder = {}
    for offset in range(remote.NUM_RESERVED_SPECIAL):
        token_id = n_base + offset
        content = SPECIAL_TOKEN_OFFSETS.get(offset, f"<|reserved_token_{token_id}|>")
        decoder[str(token_id)] = {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
    return {
        "added_tokens_decoder": decoder,
        "auto_map": {
            "AutoTokenizer": [f"{remote.__name__.rsplit('.', 1)[-1]}.KimiLikeTokenizer", None]
        },
        "bos_token": "[BOS]",
        "clean_up_tokenization_spaces": False,
        "eos_token": "[EOS]",
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": "[PAD]",
        "tokenizer_class": "KimiLikeTokenizer",
        "unk_token": "[UNK]",
    }


def build_kimi_tokenizer(out_dir: Path, *, texts: Iterable[str] | None = None) -> Path:
    """Train and write the Kimi-like tokenizer folder at `out_dir`; return `out_dir`.

    `texts` replaces the training text (tests use a small one to build in a second). Files
    are written to a temporary sibling and moved into place one by one. Needs no network.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ranks = train_ranks(_training_texts() if texts is None else texts)
    with tempfile.TemporaryDirectory(prefix=".tmp-kimi-tokenizer-", dir=out_dir) as tmp_str:
        tmp = Path(tmp_str)
        write_ranks(tmp / remote.VOCAB_FILE, ranks)
        shutil.copyfile(remote.__file__, tmp / Path(remote.__file__).name)
        (tmp / "tokenizer_config.json").write_text(
            json.dumps(tokenizer_config(len(ranks)), indent=2, sort_keys=True) + "\n",
            encoding="utf-8",
        )
        (tmp / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
        for item in sorted(tmp.iterdir()):
            shutil.move(str(item), str(out_dir / item.name))
    return out_dir
