"""The tiny target network and its training loop, in one file.

The network is a stock ``LlamaForCausalLM`` (so every tool that loads Llama loads it): 4 layers,
hidden 256, 4 attention heads, tied embeddings, the tiny tokenizer's vocabulary. It is trained
for a fixed number of AdamW steps on CPU, on chat-rendered stdlib Q&A conversations packed into
fixed-length rows, with the loss on assistant tokens (answer text and its end-of-turn token).
The same seed, steps and thread count give the same weights on the same machine.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from eyas.tiny.qa import split_qa, training_messages


@dataclass(frozen=True)
class TrainSettings:
    """How the tiny target is trained; recorded in ``eyas_build.json``."""

    seed: int = 1234
    """Seeds weights init and the data order."""
    steps: int = 300
    """Optimizer steps (fixed, so the result does not depend on machine speed)."""
    batch_rows: int = 8
    """Packed rows per step."""
    row_tokens: int = 256
    """Tokens per packed row."""
    lr: float = 3e-3
    """Peak AdamW learning rate (linear warmup, cosine decay to 10%)."""
    warmup_steps: int = 20
    """Steps of linear warmup."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    threads: int = 2
    """torch CPU threads (part of what makes a run reproducible)."""

    def to_json(self) -> dict:
        return asdict(self)


def tiny_llama_config(tokenizer: PreTrainedTokenizerBase) -> LlamaConfig:
    """The tiny target's architecture for `tokenizer` (vocab and special ids taken from it)."""
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def encode_with_assistant_mask(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict]
) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation and a 0/1 mask of assistant-written tokens.

    The mask covers each assistant turn after its ``<|assistant|>\\n`` header, up to and
    including its end-of-turn token. The spans are found by rendering prefixes of the
    conversation (no template markers needed) and mapped to tokens by character offsets.
    """
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            start = len(
                tokenizer.apply_chat_template(
                    messages[:i], tokenize=False, add_generation_prompt=True
                )
            )
            end = len(tokenizer.apply_chat_template(messages[: i + 1], tokenize=False))
            spans.append((start, end))
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [
        int(any(start <= tok_start < end for start, end in spans))
        for tok_start, _ in enc["offset_mapping"]
    ]
    return list(enc["input_ids"]), mask


def packed_rows(
    tokenizer: PreTrainedTokenizerBase, settings: TrainSettings
) -> tuple[torch.Tensor, torch.Tensor]:
    """All training conversations, encoded, seeded-shuffled and packed into fixed rows.

    Returns ``(input_ids_NT, loss_mask_NT)`` with ``T = settings.row_tokens``; a conversation
    longer than a row is cut, one never spans rows (rows are padded with the pad token).
    """
    train, _ = split_qa()
    encoded = [encode_with_assistant_mask(tokenizer, training_messages(qa)) for qa in train]
    order = torch.randperm(len(encoded), generator=torch.Generator().manual_seed(settings.seed))
    width = settings.row_tokens
    rows_ids: list[list[int]] = []
    rows_mask: list[list[int]] = []
    cur_ids: list[int] = []
    cur_mask: list[int] = []
    for idx in order.tolist():
        ids, mask = encoded[idx]
        ids, mask = ids[:width], mask[:width]
        if len(cur_ids) + len(ids) > width:
            rows_ids.append(cur_ids + [tokenizer.pad_token_id] * (width - len(cur_ids)))
            rows_mask.append(cur_mask + [0] * (width - len(cur_mask)))
            cur_ids, cur_mask = [], []
        cur_ids += ids
        cur_mask += mask
    if cur_ids:
        rows_ids.append(cur_ids + [tokenizer.pad_token_id] * (width - len(cur_ids)))
        rows_mask.append(cur_mask + [0] * (width - len(cur_mask)))
    return torch.tensor(rows_ids), torch.tensor(rows_mask)


def _lr_at(step: int, settings: TrainSettings) -> float:
    if step < settings.warmup_steps:
        return settings.lr * (step + 1) / settings.warmup_steps
    progress = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
    return settings.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_tiny_llama(
    tokenizer: PreTrainedTokenizerBase,
    settings: TrainSettings,
    *,
    log: Callable[[str], None] | None = None,
    max_seconds: float | None = None,
) -> tuple[LlamaForCausalLM, dict]:
    """Initialise and train the tiny target; return the model and training stats.

    Training runs `settings.steps` steps, or stops earlier once `max_seconds` have passed
    (then the result depends on machine speed; ``steps`` in the stats says how many ran).
    Stats: ``final_loss`` (mean masked loss over the last 10 steps), ``first_loss``,
    ``steps``, ``tokens_seen``, ``rows``, ``seconds``, ``parameters``.
    """
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    try:
        torch.manual_seed(settings.seed)
        input_ids_NT, loss_mask_NT = packed_rows(tokenizer, settings)
        model = LlamaForCausalLM(tiny_llama_config(tokenizer))
        model.train()
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=settings.lr,
            weight_decay=settings.weight_decay,
            betas=(0.9, 0.95),
        )
        n_rows = input_ids_NT.shape[0]
        order = torch.randperm(n_rows, generator=torch.Generator().manual_seed(settings.seed + 1))
        losses: list[float] = []
        start = time.monotonic()
        cursor = 0
        for step in range(settings.steps):
            if max_seconds is not None and step and time.monotonic() - start > max_seconds:
                break
            if cursor + settings.batch_rows > n_rows:
                order = torch.randperm(
                    n_rows, generator=torch.Generator().manual_seed(settings.seed + 1 + step)
                )
                cursor = 0
            batch = order[cursor : cursor + settings.batch_rows]
            cursor += settings.batch_rows
            ids_BT = input_ids_NT[batch]
            mask_BT = loss_mask_NT[batch]
            for group in optimizer.param_groups:
                group["lr"] = _lr_at(step, settings)
            logits_BTV = model(input_ids=ids_BT).logits
            # Position t predicts token t+1; the mask of the predicted token decides.
            logits = logits_BTV[:, :-1].reshape(-1, logits_BTV.shape[-1])
            targets = ids_BT[:, 1:].reshape(-1)
            weights = mask_BT[:, 1:].reshape(-1).float()
            token_loss = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
            loss = (token_loss * weights).sum() / weights.sum().clamp_min(1.0)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
            if log and step % 25 == 0:
                log(
                    f"step {step}/{settings.steps} loss {losses[-1]:.3f} "
                    f"({time.monotonic() - start:.0f}s)"
                )
        model.eval()
        stats = {
            "first_loss": losses[0],
            "final_loss": sum(losses[-10:]) / len(losses[-10:]),
            "steps": len(losses),
            "rows": n_rows,
            "tokens_seen": len(losses) * settings.batch_rows * settings.row_tokens,
            "seconds": round(time.monotonic() - start, 1),
            "parameters": sum(p.numel() for p in model.parameters()),
        }
        return model, stats
    finally:
        torch.set_num_threads(previous_threads)
