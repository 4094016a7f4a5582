"""The tiny target network and its training loop, in one file.

The network is a stock ``LlamaForCausalLM`` (so every tool that loads Llama loads it): 4 layers,
hidden 256, 4 attention heads, tied embeddings, the tiny tokenizer's vocabulary (about 4.2M
parameters). It is trained for a fixed number of AdamW steps on CPU, on chat-rendered stdlib
Q&A conversations (`eyas.tiny.qa.training_conversations`) packed into fixed-length rows, with
the loss on assistant tokens (answer text and its end-of-turn token). The same settings (seed,
steps, one CPU thread) give the same weights on the same machine; a run that checkpoints can be
killed and resumed without changing the result.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from eyas.errors import EyasError
from eyas.tiny.qa import split_qa, training_conversations


@dataclass(frozen=True)
class TrainSettings:
    """How the tiny target is built: its shape and its training; recorded with the weights."""

    hidden_size: int = 256
    """Width of the network."""
    intermediate_size: int = 688
    """Width of each MLP."""
    num_layers: int = 4
    """Decoder layers."""
    num_heads: int = 4
    """Attention heads (head size = hidden_size / num_heads)."""
    seed: int = 1234
    """Seeds weights init and the data order."""
    steps: int = 3000
    """Optimizer steps (fixed, so the result does not depend on machine speed)."""
    batch_rows: int = 8
    """Packed rows per step."""
    row_tokens: int = 256
    """Tokens per packed row."""
    lr: float = 2e-3
    """AdamW learning rate after warmup and before the decay."""
    warmup_steps: int = 100
    """Steps of linear warmup."""
    decay_steps: int = 600
    """The last steps, where the lr falls linearly to 10% ("warmup-stable-decay"): a run can
    be lengthened or shortened before its decay starts without changing its past steps."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    threads: int = 1
    """torch CPU threads: one is reproducible and, on a busy machine, as fast as two."""

    def to_json(self) -> dict:
        return asdict(self)


def tiny_llama_config(
    tokenizer: PreTrainedTokenizerBase, settings: TrainSettings | None = None
) -> LlamaConfig:
    """The tiny target's architecture for `tokenizer` (vocab and special ids taken from it)."""
    settings = settings or TrainSettings()
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=settings.hidden_size,
        intermediate_size=settings.intermediate_size,
        num_hidden_layers=settings.num_layers,
        num_attention_heads=settings.num_heads,
        num_key_value_heads=settings.num_heads,
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
    encoded = [
        encode_with_assistant_mask(tokenizer, messages)
        for qa in train
        for messages in training_conversations(qa)
    ]
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
    """Linear warmup, constant, then a linear decay to 10% over the last `decay_steps`."""
    if step < settings.warmup_steps:
        return settings.lr * (step + 1) / settings.warmup_steps
    decay_start = settings.steps - settings.decay_steps
    if step < decay_start:
        return settings.lr
    progress = (step - decay_start + 1) / max(1, settings.decay_steps)
    return settings.lr * (1.0 - 0.9 * min(1.0, progress))


def data_fingerprint(input_ids_NT: torch.Tensor, loss_mask_NT: torch.Tensor) -> str:
    """SHA-256 (16 hex digits) of the packed training rows: what the weights were trained on."""
    h = hashlib.sha256()
    for tensor in (input_ids_NT, loss_mask_NT):
        h.update(str(tuple(tensor.shape)).encode())
        h.update(tensor.to(torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


CHECKPOINT_NAME = "train-state.pt"


def _save_checkpoint(folder: Path, state: dict) -> None:
    """Write the training state atomically (a killed run leaves the previous checkpoint)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{CHECKPOINT_NAME}.{os.getpid()}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, folder / CHECKPOINT_NAME)


def _load_checkpoint(folder: Path, settings: TrainSettings, data: str) -> dict | None:
    """The saved training state in `folder`, None if there is none.

    A state saved under another number of `steps` resumes too, while neither run has begun
    its decay (their past steps are the same). Raises EyasError when it belongs to other
    settings or data: resuming it would give weights of no recipe (delete it to start over).
    """
    path = folder / CHECKPOINT_NAME
    if not path.is_file():
        return None
    state = torch.load(path, weights_only=True)
    saved = dict(state["settings"])
    saved_steps = saved.pop("steps")
    wanted = settings.to_json()
    wanted_steps = wanted.pop("steps")
    same_past = state["step"] <= min(saved_steps, wanted_steps) - settings.decay_steps
    if saved != wanted or state["data"] != data or not (saved_steps == wanted_steps or same_past):
        raise EyasError(
            f"{path}: checkpoint of other settings or training data (step {state['step']} of "
            f"{state['settings']}, data {state['data']}; wanted {settings.to_json()}, data "
            f"{data}); delete it to train from scratch"
        )
    state["settings"] = settings.to_json()
    return state


def train_tiny_llama(
    tokenizer: PreTrainedTokenizerBase,
    settings: TrainSettings,
    *,
    log: Callable[[str], None] | None = None,
    checkpoint_dir: Path | None = None,
    checkpoint_every: int = 100,
) -> tuple[LlamaForCausalLM, dict]:
    """Initialise and train the tiny target for `settings.steps` steps; return model and stats.

    With `checkpoint_dir`, the whole training state (weights, optimizer, data order, losses) is
    saved there every `checkpoint_every` steps and a run resumes from it: a killed run, resumed,
    gives the same weights as an uninterrupted one. Stats: ``first_loss``, ``final_loss``
    (mean masked loss of the last 10 steps), ``loss_curve`` (mean loss per 100 steps),
    ``steps``, ``tokens_seen``, ``rows``, ``data_sha256``, ``seconds`` (training time, summed
    over resumed runs), ``parameters``.
    """
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(settings.threads)
    try:
        torch.manual_seed(settings.seed)
        input_ids_NT, loss_mask_NT = packed_rows(tokenizer, settings)
        data = data_fingerprint(input_ids_NT, loss_mask_NT)
        model = LlamaForCausalLM(tiny_llama_config(tokenizer, settings))
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
        cursor, first_step, seconds_before = 0, 0, 0.0
        state = _load_checkpoint(checkpoint_dir, settings, data) if checkpoint_dir else None
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            order, cursor, losses = state["order"], state["cursor"], list(state["losses"])
            first_step, seconds_before = state["step"], state["seconds"]
            if log:
                log(f"resuming at step {first_step}/{settings.steps} from {checkpoint_dir}")
        start = time.monotonic()
        for step in range(first_step, settings.steps):
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
            elapsed = seconds_before + time.monotonic() - start
            if log and step % 25 == 0:
                log(f"step {step}/{settings.steps} loss {losses[-1]:.3f} ({elapsed:.0f}s)")
            done = step + 1
            if checkpoint_dir and (done % checkpoint_every == 0 or done == settings.steps):
                _save_checkpoint(
                    checkpoint_dir,
                    {
                        "settings": settings.to_json(),
                        "data": data,
                        "step": done,
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "order": order,
                        "cursor": cursor,
                        "losses": losses,
                        "seconds": elapsed,
                    },
                )
        model.eval()
        stats = {
            "first_loss": losses[0],
            "final_loss": sum(losses[-10:]) / len(losses[-10:]),
            "loss_curve": [
                round(sum(losses[i : i + 100]) / len(losses[i : i + 100]), 4)
                for i in range(0, len(losses), 100)
            ],
            "steps": len(losses),
            "rows": n_rows,
            "tokens_seen": len(losses) * settings.batch_rows * settings.row_tokens,
            "data_sha256": data,
            "seconds": round(seconds_before + time.monotonic() - start, 1),
            "parameters": sum(p.numel() for p in model.parameters()),
        }
        return model, stats
    finally:
        torch.set_num_threads(previous_threads)
