"""What the tiny target says to the demo prompts, and how varied it is.

``answer_stats(model_dir)`` answers a fixed set of demo prompts greedily (the held-out
``eval_prompts`` and the first ``demo_chat`` prompts, the ones the demo asks) and returns
`eyas.diversity.answer_diversity` of the answers, plus the share that ended with the
end-of-turn token. The build records it and ``python -m eyas.tiny`` prints it.
"""

from __future__ import annotations

from pathlib import Path

PROBE_EVAL = 60
"""Held-out ``eval_prompts`` in the probe (all of them)."""
PROBE_CHAT = 60
"""Leading ``demo_chat`` prompts in the probe."""
MAX_NEW_TOKENS = 96
"""Answer length cap, as the demo recipe's ``generation.max_tokens``."""


def probe_conversations() -> list[list[dict]]:
    """The probe's prompts: conversations ending with a user turn, in a fixed order."""
    from eyas.tiny.demo_data import build_demo_records

    records = build_demo_records()
    return [r["messages"] for r in records["eval_prompts"][:PROBE_EVAL]] + [
        r["messages"] for r in records["demo_chat"][:PROBE_CHAT]
    ]


def asked_name(conversation: list[dict]) -> str:
    """The object a demo prompt asks about: the first `backticked` name of its last turn."""
    parts = conversation[-1]["content"].split("`")
    return parts[1] if len(parts) > 2 else ""


def generate_answers(
    model_dir: Path,
    conversations: list[list[dict]],
    *,
    max_new_tokens: int = MAX_NEW_TOKENS,
    batch_size: int = 20,
) -> tuple[list[str], int]:
    """Greedy answers of the model in `model_dir` (CPU, float32), and how many ended.

    Returns ``(answers, ended)``: the decoded answers without special tokens, and the number
    that stopped at the end-of-turn token within `max_new_tokens`.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    answers: list[str] = []
    ended = 0
    for start in range(0, len(conversations), batch_size):
        texts = [
            tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
            for c in conversations[start : start + batch_size]
        ]
        batch = tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
        with torch.no_grad():
            out_BT = model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
        for row in out_BT[:, batch["input_ids"].shape[1] :].tolist():
            if tokenizer.eos_token_id in row:
                ended += 1
                row = row[: row.index(tokenizer.eos_token_id)]
            answers.append(tokenizer.decode(row, skip_special_tokens=True).strip())
    return answers, ended


def answer_stats(model_dir: Path) -> dict:
    """Diversity of the model's greedy answers to the probe prompts (see the module doc).

    Keys: those of `answer_diversity` plus ``ended_share``, ``on_topic_share`` (answers that
    name the object asked about: the last part of its dotted name), ``max_new_tokens`` and
    ``examples`` (the first three answers to held-out prompts).
    """
    from eyas.diversity import answer_diversity

    conversations = probe_conversations()
    answers, ended = generate_answers(model_dir, conversations)
    stats = answer_diversity(answers)
    stats["ended_share"] = round(ended / len(answers), 4)
    named = [asked_name(c) for c in conversations]
    stats["on_topic_share"] = round(
        sum(bool(n) and n.rpartition(".")[2] in a for n, a in zip(named, answers, strict=True))
        / len(answers),
        4,
    )
    stats["max_new_tokens"] = MAX_NEW_TOKENS
    stats["examples"] = [
        {"prompt": c[-1]["content"], "answer": a}
        for c, a in zip(conversations[:3], answers[:3], strict=True)
    ]
    return stats
