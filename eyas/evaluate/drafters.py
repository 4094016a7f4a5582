"""What proposes draft tokens: the EAGLE-3 drafter with its KV cache, and prompt lookup.

Every drafter follows one protocol, per generated sequence (`DraftSession`):

- ``begin(prompt, aux, first)``: the target has read the prompt (auxiliary states ``aux``
  [P, 3·H], one per prompt token) and chosen the first new token `first`;
- ``propose(k, ...)``: up to k draft tokens (target ids) continuing the sequence, with the
  drafter's distribution over the target vocabulary for each (None for a drafter that
  proposes deterministically: rejection sampling then treats it as a point mass);
- ``commit(tokens, aux)``: the verification kept `tokens` (the accepted drafts and the
  target's own next token); ``aux`` [len(tokens), 3·H] holds the target's auxiliary states of
  the positions it verified, which are the tokens *before* these: the token the verification
  started from and the accepted drafts.

EAGLE-3 drafting, as a server runs it (indexing of ``eyas.train.ttt``): the drafter cache
holds one entry per verified context position s: token ``x_{s+1}``, hidden ``fc(aux_s)``,
rotary position s. Its last entry (s = t) is draft step 0, whose output predicts ``x_{t+2}``.
Step i ≥ 1 is a temporary entry at rotary position t + i: the token step i-1 proposed and
step i-1's output as hidden. Its query sees the cache and the chain's own entries; the chain is
thrown away after the verification, and the verified positions enter the cache as step-0
entries computed from the target's states (SGLang's "draft extend"). Every entry, cached or
in the chain, is one ``Drafter.step`` on a ``eyas.train.model.KVCache`` (the chain's in a copy
of the session's cache, dropped after the proposal): the step training runs.
``eyas.train.ttt.unroll`` trains exactly this computation; a test holds a session's drafts
equal to ``eyas.train.ttt.draft_reference``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from eyas.errors import DataError
from eyas.io import read_json
from eyas.layout import VOCAB
from eyas.train.model import Drafter, DrafterConfig, KVCache
from eyas.train.vocab import DraftVocab


@dataclass
class Proposal:
    """Draft tokens (target ids) and, per token, the drafter's probabilities over the target
    vocabulary ([n, V] float64 on the CPU; None: a deterministic proposal)."""

    tokens: list[int]
    probs: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    """EAGLE-3 only: the drafter's logits over its draft vocabulary, one row per step [n, Vd]."""


class DraftSession(Protocol):
    """One sequence's drafting state (see the module docstring)."""

    def begin(self, prompt: Sequence[int], aux: torch.Tensor | None, first: int) -> None: ...

    def propose(self, k: int, temperature: float | None,
                generator: torch.Generator | None) -> Proposal: ...

    def commit(self, tokens: Sequence[int], aux: torch.Tensor | None) -> None: ...


class DraftMethod(Protocol):
    """A drafter: makes one `DraftSession` per sequence."""

    name: str
    needs_aux: bool

    def session(self) -> DraftSession: ...


# -- EAGLE-3 --------------------------------------------------------------------------------
class EagleDrafter:
    """An EAGLE-3 drafter (`eyas.train.model.Drafter`) and its draft vocabulary, ready to draft."""

    needs_aux = True

    def __init__(self, drafter: Drafter, vocab: DraftVocab, *, name: str = "eagle3") -> None:
        if vocab.size != drafter.cfg.draft_vocab_size:
            raise DataError(f"draft vocabulary of {vocab.size} tokens for a drafter with "
                            f"draft_vocab_size {drafter.cfg.draft_vocab_size}", field="d2t")
        self.drafter = drafter.eval()
        self.name = name
        self.vocab = vocab
        device = drafter.fc.weight.device
        self.draft_to_target = vocab.draft_to_target.to(device)

    @property
    def device(self) -> torch.device:
        return self.drafter.fc.weight.device

    def session(self) -> EagleSession:
        return EagleSession(self)


class EagleSession:
    """The drafter's KV cache of one sequence (step-0 entries only) and its last output."""

    def __init__(self, method: EagleDrafter) -> None:
        self.m = method
        self.dtype = method.drafter.fc.weight.dtype
        self.cache = KVCache()  # its length: the next entry's rotary position
        self.last_out: torch.Tensor | None = None  # [1, 1, H]: step 0's output

    @torch.inference_mode()
    def _extend(self, tokens: Sequence[int], aux: torch.Tensor) -> None:
        """Append step-0 entries (token, fc(aux)) at the next positions; keep the last output.
        Entry j (position start + j) sees every cached entry and the new ones up to itself."""
        d, dev = self.m.drafter, self.m.device
        start = self.cache.length
        ids_1n = torch.tensor([list(tokens)], dtype=torch.long, device=dev)
        pos_1n = torch.arange(start, start + len(tokens), device=dev)[None]
        out_1nH, self.cache = d.step(ids_1n, d.project(aux.to(dev, self.dtype)[None]), pos_1n,
                                     self.cache)
        self.last_out = out_1nH[:, -1:]

    def begin(self, prompt: Sequence[int], aux: torch.Tensor | None, first: int) -> None:
        if aux is None or aux.shape[0] != len(prompt):
            raise ValueError("EAGLE-3 drafting needs the target's auxiliary states of the prompt")
        # Entry s holds token x_{s+1}: the prompt shifted by one, then the first new token.
        self._extend([*list(prompt)[1:], first], aux)

    def commit(self, tokens: Sequence[int], aux: torch.Tensor | None) -> None:
        if aux is None or aux.shape[0] != len(tokens):
            raise ValueError("EAGLE-3 drafting needs the verified positions' auxiliary states")
        self._extend(tokens, aux)

    @torch.inference_mode()
    def propose(self, k: int, temperature: float | None,
                generator: torch.Generator | None) -> Proposal:
        """k chain steps from the cache's last entry. `temperature` None: greedy (argmax);
        else sample each step from softmax(logits / temperature) with `generator`."""
        assert self.last_out is not None, "begin() first"
        d, dev = self.m.drafter, self.m.device
        out = self.last_out
        chain = self.cache  # grows by the chain's entries; self.cache stays as it was
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        rows: list[torch.Tensor] = []
        t = self.cache.length - 1  # the origin: position of the cache's last entry
        for i in range(k):
            logits = d.logits(out)[0, 0]
            rows.append(logits)
            if temperature is None:
                draft_id = int(logits.argmax())
            else:
                p_Vd = torch.softmax(logits.double() / temperature, dim=-1).cpu()
                draft_id = int(torch.multinomial(p_Vd, 1, generator=generator))
                full = torch.zeros(self.m.vocab.vocab_size, dtype=torch.float64)
                full[self.m.vocab.draft_to_target] = p_Vd
                probs.append(full)
            token = int(self.m.draft_to_target[draft_id])
            tokens.append(token)
            if i == k - 1:
                break
            # Step i + 1: the token just proposed, step i's output as hidden, position t + i + 1;
            # its query sees the cache and the chain's entries so far.
            ids_11 = torch.tensor([[token]], dtype=torch.long, device=dev)
            pos_11 = torch.tensor([[t + i + 1]], device=dev)
            out, chain = d.step(ids_11, d.feedback(out), pos_11, chain)
        return Proposal(tokens, torch.stack(probs) if probs else None, torch.stack(rows))


def load_drafter(folder: Path, embed_VH: torch.Tensor, *, target_config: dict | None = None,
                 architecture: str | None = None) -> tuple[Drafter, DraftVocab, list[int] | None]:
    """A trained drafter from an exported SGLang folder (``config.json`` +
    ``model.safetensors``) or a training ``best/`` folder (``drafter.safetensors``; its
    vocabulary from the sibling ``vocab/`` folder, its shape from `target_config` and the
    weights). Returns the drafter (float32, CPU), its vocabulary and its auxiliary layers in
    eyas numbering (an export's SGLang ids read back for the target's `architecture`; None for
    ``best/``, which does not record them).

    Raises DataError naming the folder when neither layout is there.
    """
    from eyas.train.export import WEIGHTS, load_exported

    folder = Path(folder)
    if (folder / "config.json").is_file() and (folder / WEIGHTS).is_file():
        drafter, vocab, layers = load_exported(folder, embed_VH, architecture=architecture)
        return drafter, vocab, layers
    weights = folder / "drafter.safetensors"
    if not weights.is_file():
        raise DataError(f"no drafter here: expected an exported folder (config.json + {WEIGHTS}) "
                        "or a training best/ folder (drafter.safetensors)", path=folder)
    from safetensors.torch import load_file

    vocab_files = sorted((folder.parent / VOCAB).glob("vocab-*.safetensors"))
    if len(vocab_files) != 1:
        raise DataError(f"expected exactly one cached draft vocabulary, found {len(vocab_files)}",
                        path=folder.parent / VOCAB)
    if target_config is None:
        raise DataError("loading best/ needs the target's config.json", path=folder)
    tensors = load_file(str(weights))
    vocab = DraftVocab(load_file(str(vocab_files[0]))["draft_to_target"], embed_VH.shape[0])
    if (folder / "drafter.json").is_file():  # written since the MLA kind: its shape and kind
        cfg = DrafterConfig(**read_json(folder / "drafter.json"))
    else:
        cfg = DrafterConfig.from_target(target_config, vocab.size).model_copy(
            update={"intermediate_size": int(tensors["midlayer.mlp.gate_proj.weight"].shape[0])})
    drafter = Drafter(cfg, embed_VH.float())
    drafter.load_state_dict({k: v.float() for k, v in tensors.items()})
    return drafter, vocab, None


def untrained_like(drafter: Drafter, seed: int) -> Drafter:
    """A drafter of the same shape and embedding with seeded initial weights (the baseline)."""
    torch.manual_seed(seed)
    return Drafter(drafter.cfg, drafter.embed_VH.cpu())


def exported_metrics(folder: Path) -> dict | None:
    """The training evaluation a drafter was exported with (the export manifest's
    ``counts.metrics``, or ``best/metrics.json``); None when neither is there."""
    folder = Path(folder)
    if (folder / "metrics.json").is_file():
        return read_json(folder / "metrics.json")
    manifest = folder / "manifest.json"
    if manifest.is_file():
        metrics = (read_json(manifest).get("counts") or {}).get("metrics")
        return metrics or None
    return None


# -- prompt lookup --------------------------------------------------------------------------
class NgramDrafter:
    """Prompt-lookup drafting: find the most recent earlier occurrence of the context's last n
    tokens (n = `ngram_max` down to 1) and propose the tokens that followed it."""

    needs_aux = False

    def __init__(self, ngram_max: int = 3, *, name: str = "ngram") -> None:
        self.ngram_max = ngram_max
        self.name = name

    def session(self) -> NgramSession:
        return NgramSession(self.ngram_max)


class NgramSession:
    def __init__(self, ngram_max: int) -> None:
        self.ngram_max = ngram_max
        self.context: list[int] = []

    def begin(self, prompt: Sequence[int], aux: torch.Tensor | None, first: int) -> None:
        self.context = [*prompt, first]

    def commit(self, tokens: Sequence[int], aux: torch.Tensor | None) -> None:
        self.context.extend(tokens)

    def propose(self, k: int, temperature: float | None,
                generator: torch.Generator | None) -> Proposal:
        return Proposal(lookup(self.context, k, self.ngram_max))


def lookup(context: Sequence[int], k: int, ngram_max: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest matching
    suffix n-gram of `context` (n from `ngram_max` down to 1); [] when nothing matches."""
    ctx = list(context)
    L = len(ctx)
    for n in range(min(ngram_max, L - 1), 0, -1):
        tail = ctx[L - n:]
        for start in range(L - n - 1, -1, -1):
            if ctx[start:start + n] == tail:
                follow = ctx[start + n:start + n + k]
                if follow:
                    return follow
    return []
