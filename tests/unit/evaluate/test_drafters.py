"""The EAGLE-3 session drafts exactly what training's reference drafts (cache kept across
verifications), prompt lookup finds the latest match, and drafters load from both folders."""

from __future__ import annotations

import pytest
import torch
from train.helpers import YARN, small_drafter, small_mla_drafter, small_vocab

from eyas.errors import DataError
from eyas.evaluate.drafters import (
    EagleDrafter,
    exported_metrics,
    load_drafter,
    lookup,
    untrained_like,
)
from eyas.train.ttt import draft_reference


def _setup(seed: int = 0, kind: str = "llama"):
    drafter = (small_mla_drafter(seed, fc_norm=True, norm_output=True, rope_scaling=YARN)
               if kind == "mla" else small_drafter(seed)).double()
    vocab = small_vocab(drafter.cfg)
    g = torch.Generator().manual_seed(seed + 100)
    width = 3 * drafter.cfg.target_hidden_size
    return drafter, vocab, g, width


@pytest.mark.parametrize("kind", ["llama", "mla"])
def test_session_drafts_equal_the_training_reference_across_verifications(kind):
    """The MLA kind with EAGLE-3.1's options and YaRN: what SGLang's Eagle3DeepseekV2 serves."""
    drafter, vocab, g, width = _setup(kind=kind)
    method = EagleDrafter(drafter, vocab)
    s = method.session()
    prompt = torch.randint(0, 50, (9,), generator=g).tolist()
    aux = torch.randn(9, width, generator=g, dtype=torch.float64)
    first = 7
    s.begin(prompt, aux, first)
    k = 4
    prop = s.propose(k, None, None)
    ids = torch.tensor(prompt + [first] + prop.tokens[:-1])
    ref = draft_reference(drafter, ids, aux, origin=len(prompt) - 1, steps=k)
    torch.testing.assert_close(prop.logits.double(), torch.stack(ref).double(), atol=1e-9, rtol=0)
    d2t = vocab.draft_to_target
    assert prop.tokens == [int(d2t[int(r.argmax())]) for r in ref]

    # A verification kept 3 tokens; their positions' states enter the cache.
    kept = [prop.tokens[0], 11, 3]
    more = torch.randn(3, width, generator=g, dtype=torch.float64)
    s.commit(kept, more)
    prop2 = s.propose(k, None, None)
    ids2 = torch.tensor(prompt + [first] + kept + prop2.tokens[:-1])
    ref2 = draft_reference(drafter, ids2, torch.cat([aux, more]), origin=len(prompt) + 2, steps=k)
    torch.testing.assert_close(prop2.logits.double(), torch.stack(ref2).double(), atol=1e-9, rtol=0)


def test_sampled_proposals_carry_the_drafters_distribution_over_the_target_vocabulary():
    drafter, vocab, g, width = _setup(1)
    s = EagleDrafter(drafter, vocab).session()
    s.begin([1, 2, 3], torch.randn(3, width, generator=g, dtype=torch.float64), 4)
    prop = s.propose(3, 0.7, torch.Generator().manual_seed(0))
    assert prop.probs.shape == (3, 50)
    outside = torch.ones(50, dtype=torch.bool)
    outside[vocab.draft_to_target] = False
    assert float(prop.probs[:, outside].abs().sum()) == 0.0
    torch.testing.assert_close(prop.probs.sum(-1), torch.ones(3, dtype=torch.float64))
    expected = torch.softmax(prop.logits[0].double() / 0.7, -1)
    torch.testing.assert_close(prop.probs[0, vocab.draft_to_target], expected)
    assert all(prop.probs[i, t] > 0 for i, t in enumerate(prop.tokens))


def test_prompt_lookup_proposes_what_followed_the_latest_longest_match():
    ctx = [5, 6, 7, 8, 1, 5, 6, 9, 2, 5, 6]
    assert lookup(ctx, 3, 2) == [9, 2, 5]  # latest "5 6" is followed by 9 2 5
    assert lookup([1, 2, 3, 9, 2, 3, 4, 2, 3], 2, 3) == [4, 2]  # 3-gram "4 2 3" absent; "2 3"
    assert lookup([4, 1, 2, 3], 2, 3) == []
    assert lookup([1, 1], 3, 3) == [1]
    assert lookup([7], 3, 3) == []


def test_drafter_loads_from_the_export_and_from_best(tmp_path):
    from safetensors.torch import save_file

    from eyas.io import write_json
    from eyas.train.export import export_drafter

    drafter = small_drafter(0)
    vocab = small_vocab(drafter.cfg)
    export_drafter(tmp_path / "export", drafter, vocab, [0, 1, 2], dtype="float32",
                   metrics={"acc": [0.5, 0.25], "step": 3})
    got, got_vocab, layers = load_drafter(tmp_path / "export", drafter.embed_VH)
    assert layers == [0, 1, 2] and torch.equal(got_vocab.draft_to_target, vocab.draft_to_target)
    for name, value in drafter.state_dict().items():
        assert torch.equal(got.state_dict()[name], value), name
    assert exported_metrics(tmp_path / "export")["acc"] == [0.5, 0.25]

    best = tmp_path / "drafter" / "best"
    best.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in drafter.state_dict().items()},
              str(best / "drafter.safetensors"))
    write_json(best / "metrics.json", {"acc": [0.1], "step": 9})
    target_config = {"hidden_size": 32, "intermediate_size": 999, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "vocab_size": 50}
    with pytest.raises(DataError, match="vocab"):
        load_drafter(best, drafter.embed_VH, target_config=target_config)
    (tmp_path / "drafter" / "vocab").mkdir()
    save_file({"draft_to_target": vocab.draft_to_target},
              str(tmp_path / "drafter" / "vocab" / "vocab-0123.safetensors"))
    got, got_vocab, layers = load_drafter(best, drafter.embed_VH, target_config=target_config)
    assert layers is None and got.cfg.intermediate_size == drafter.cfg.intermediate_size
    assert torch.equal(got.lm_head.weight, drafter.lm_head.weight)
    assert exported_metrics(best)["step"] == 9
    with pytest.raises(DataError, match="no drafter here"):
        load_drafter(tmp_path, drafter.embed_VH)


def test_untrained_baseline_has_the_same_shape_and_seeded_weights():
    drafter = small_drafter(0)
    a, b, c = untrained_like(drafter, 1), untrained_like(drafter, 1), untrained_like(drafter, 2)
    assert a.cfg == drafter.cfg and torch.equal(a.embed_VH, drafter.embed_VH)
    assert torch.equal(a.fc.weight, b.fc.weight) and not torch.equal(a.fc.weight, c.fc.weight)
    assert not torch.equal(a.fc.weight, drafter.fc.weight)


def test_mla_drafter_loads_from_the_export_and_from_best(tmp_path):
    from safetensors.torch import save_file

    from eyas.io import write_json
    from eyas.train.export import export_drafter

    drafter = small_mla_drafter(0, fc_norm=True, norm_output=True, rope_scaling=YARN)
    vocab = small_vocab(drafter.cfg)
    export_drafter(tmp_path / "export", drafter, vocab, [1, 2, 3], dtype="float32",
                   architecture="DeepseekV3ForCausalLM")
    got, _, layers = load_drafter(tmp_path / "export", drafter.embed_VH)
    assert got.cfg == drafter.cfg and layers == [1, 2, 3]
    # best/ records the drafter's shape and kind (the target's config does not say "mla")
    best = tmp_path / "drafter" / "best"
    best.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in drafter.state_dict().items()},
              str(best / "drafter.safetensors"))
    write_json(best / "drafter.json", drafter.cfg.model_dump())
    (tmp_path / "drafter" / "vocab").mkdir()
    save_file({"draft_to_target": vocab.draft_to_target},
              str(tmp_path / "drafter" / "vocab" / "vocab-0123.safetensors"))
    got, _, _ = load_drafter(best, drafter.embed_VH, target_config={"hidden_size": 32})
    assert got.cfg == drafter.cfg
    for name, value in drafter.state_dict().items():
        assert torch.equal(got.state_dict()[name], value), name
