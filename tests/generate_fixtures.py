"""A tiny random chat model for phase-1 tests, built offline in a second or two.

Used until (and besides) the project's real tiny target: a `LlamaForCausalLM` with random
weights and a byte-level BPE tokenizer trained on a few hundred generated strings, with a
chat template, saved with `save_pretrained` so that `transformers serve` loads it offline.
"""

from __future__ import annotations

from pathlib import Path

END = "<|end|>"
SPECIAL = ["<|bos|>", END, "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for m in messages -%}"
    "{{- '<|' + m['role'] + '|>\n' + m['content'] + '<|end|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\n' -}}{%- endif -%}"
)


def _corpus() -> list[str]:
    words = ("alpha beta gamma delta spec draft token model layer hidden state answer question "
             "python code write a function that returns the sum of two numbers please explain why "
             "the sky is blue hello world").split()
    return [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(3 + i % 9)) for i in range(400)]


def build_random_chat_model(out_dir: Path, *, seed: int = 0) -> Path:
    """Write a random 2-layer Llama chat model (tokenizer + chat template) to `out_dir`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out_dir = Path(out_dir)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=SPECIAL, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token=END, pad_token="<|pad|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id, tie_word_embeddings=True,
    )
    LlamaForCausalLM(config).save_pretrained(out_dir)
    return out_dir
