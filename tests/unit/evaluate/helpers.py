"""Small real targets and drafters for the evaluator's tests, built in memory (no tiny target)."""

from __future__ import annotations

import torch

from eyas.evaluate.drafters import EagleDrafter
from eyas.evaluate.target import Target
from eyas.train.model import Drafter, DrafterConfig
from eyas.train.vocab import DraftVocab

AUX = [0, 1, 2]


def small_target(vocab: int = 8, *, layers: int = 3, width: int = 32, seed: int = 0,
                 init: float = 0.3, dtype: torch.dtype = torch.float64) -> Target:
    """A random Llama over `vocab` tokens whose next-token distributions are far from uniform
    (weights drawn with std `init`), as a `Target` reading aux layers [0, 1, 2]."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=2 * width,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, initializer_range=init,
                      tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(dtype).eval()
    return Target(model, AUX)


def small_eagle(target: Target, draft_ids: list[int] | None = None, *, seed: int = 0,
                std: float = 0.3, name: str = "eagle3") -> EagleDrafter:
    """A random EAGLE-3 drafter for `target` drafting `draft_ids` (default: every token)."""
    model = target.model
    V, H = model.get_input_embeddings().weight.shape
    ids = draft_ids if draft_ids is not None else list(range(V))
    cfg = DrafterConfig(hidden_size=H, target_hidden_size=H, intermediate_size=2 * H,
                        num_attention_heads=4, num_key_value_heads=2, vocab_size=V,
                        draft_vocab_size=len(ids))
    torch.manual_seed(seed)
    drafter = Drafter(cfg, model.get_input_embeddings().weight.detach())
    drafter.reset_parameters(std=std)
    drafter = drafter.to(model.dtype)
    return EagleDrafter(drafter, DraftVocab(torch.tensor(ids, dtype=torch.int64), V), name=name)
