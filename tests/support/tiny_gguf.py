"""A tiny Llama GGUF file written with the ``gguf`` package (random float32 weights, a
byte-level BPE tokenizer and a ChatML template in its metadata): what `eyas.gguf_target`
assembles in tests, without the 93 MB SmolLM2 file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _byte_chars() -> list[str]:
    """GPT-2's byte-to-unicode table, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs, strict=True))
    return [chr(table[b]) for b in range(256)]


def write_tiny_gguf(path: Path, *, layers: int = 2, hidden: int = 64, heads: int = 4,
                    kv_heads: int = 2, intermediate: int = 96, seed: int = 0,
                    chat_template: str | None = CHATML) -> Path:
    """Write a tiny Llama GGUF at `path` and return it."""
    import gguf

    chars = _byte_chars()
    merges = ["Ġ t", "h e", "Ġt he", "i n", "a n"]
    merged = [m.replace(" ", "") for m in merges]
    tokens = SPECIAL + chars + merged
    types = [3] * len(SPECIAL) + [1] * (len(tokens) - len(SPECIAL))
    vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_block_count(layers)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(intermediate)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_file_type(0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    head_dim = hidden // heads
    writer.add_tensor("token_embd.weight", w(vocab, hidden))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", 1 + w(hidden))
        writer.add_tensor(f"blk.{i}.attn_q.weight", w(heads * head_dim, hidden))
        writer.add_tensor(f"blk.{i}.attn_k.weight", w(kv_heads * head_dim, hidden))
        writer.add_tensor(f"blk.{i}.attn_v.weight", w(kv_heads * head_dim, hidden))
        writer.add_tensor(f"blk.{i}.attn_output.weight", w(hidden, heads * head_dim))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", 1 + w(hidden))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", w(intermediate, hidden))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", w(intermediate, hidden))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", w(hidden, intermediate))
    writer.add_tensor("output_norm.weight", 1 + w(hidden))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
