"""The whole-vocabulary argmax of storage "final", computed once per sample (issue 27, point 5).

The teacher of storage "final" (`eyas.train.ttt.TargetHead.teacher`) is the draft-vocabulary
distribution (``final @ lm_head[d2t]ᵀ``, Vd rows) and the target's argmax over the whole
vocabulary (``final @ lm_headᵀ``, V rows: at Kimi-K2.5's V = 163,840 and Vd = 32,000 about
88 % of the teacher's cost, benchmarks/teacher.py). The argmax of a sample is the same in every
epoch, so `ArgmaxMemo` keeps it -- int32 on the CPU, 4 bytes a token -- and a batch whose
every row it holds runs the Vd-row matmul only; its in-vocabulary bit follows from ``t2d``.

Keys are the rows' positions in their source (``Batch.indices``: unique, where sample ids may
repeat); a memo serves one source (the trainer keeps one for training, one for evaluation).
Padding positions (outside every loss and count) get token 0, which the whole-vocabulary
argmax of their zero state gives too: on CPU the teacher is the same tensor for tensor (a test
trains with and without the memo and compares every loss and weight bit for bit). On a GPU the
bf16 argmax of a token may, at a near tie, depend on the batch's shape (its matmul's
reduction order): the memo then keeps the sample's first answer, as any epoch's would be.

Several processes: each process computes its own samples, and `share` (one all-gather of the
step's new rows, every step until the memo holds every sample) gives every process every row,
merged in rank order -- so a process's samples of a later epoch (which another process may
have had before) are found, and every process holds the same memo. Memory: 4 bytes a token of
the source (truncated to ``max_len``) per process: 351 MB for 87.8M tokens. A resumed run
starts with an empty memo, which fills again in its first epoch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from eyas.train.ttt import TargetHead, Teacher

ROW_DTYPE = torch.int32


class ArgmaxMemo:
    """Each sample's whole-vocabulary argmax, by its position in the source.

    `shared` (several processes): the rows a process computes wait in `pending` until `share`
    merges every process's; else they are kept at once."""

    def __init__(self, *, shared: bool = False) -> None:
        self.rows: dict[int, torch.Tensor] = {}
        self.pending: dict[int, torch.Tensor] = {}
        self.shared = shared
        self.tokens = 0
        self.hits = 0
        """Batches whose argmax came from the memo."""
        self.misses = 0
        """Batches whose argmax was computed."""

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def nbytes(self) -> int:
        """Bytes of the stored rows."""
        return self.tokens * ROW_DTYPE.itemsize

    def _keep(self, k: int, row: torch.Tensor) -> None:
        if k not in self.rows:  # first wins: every process merges in the same order
            self.rows[k] = row
            self.tokens += row.numel()

    def teacher(self, head: TargetHead, final_BTH: torch.Tensor, indices: Sequence[int],
                lengths: Sequence[int]) -> Teacher:
        """The teacher of a batch (rows `indices` of the source, `lengths` real tokens each):
        the stored argmax when every row has one, else computed and stored."""
        B, T, _ = final_BTH.shape
        if len(indices) != B or len(lengths) != B:
            raise ValueError(f"{len(indices)} indices and {len(lengths)} lengths for {B} rows")
        if all(k in self.rows for k in indices):
            top_BT = torch.zeros(B, T, dtype=torch.int64)
            for b, (k, n) in enumerate(zip(indices, lengths, strict=True)):
                row = self.rows[k]
                if row.numel() != n:
                    raise ValueError(f"sample {k} has {n} tokens here but {row.numel()} in the "
                                     "teacher memo (one memo serves one source and max_len)")
                top_BT[b, :n] = row
            self.hits += 1
            return head.teacher(final_BTH, top_BT.to(head.head_VH.device))
        teacher = head.teacher(final_BTH)
        self.misses += 1
        top = teacher.top_BT.to("cpu", ROW_DTYPE)
        for b, (k, n) in enumerate(zip(indices, lengths, strict=True)):
            row = top[b, :n].clone()
            if self.shared:
                self.pending.setdefault(k, row)
            else:
                self._keep(k, row)
        return teacher

    def share(self, world: int) -> None:
        """Every process's pending rows into every process's memo, in rank order (a
        collective: every process calls it at the same point)."""
        import torch.distributed as dist

        mine = [(k, row.numpy()) for k, row in self.pending.items()]
        self.pending = {}
        gathered: list = [None] * world
        dist.all_gather_object(gathered, mine)
        for rows in gathered:
            for k, row in rows:
                self._keep(int(k), torch.from_numpy(row))


def memo_bytes(lengths: Sequence[int], max_len: int | None) -> int:
    """Bytes an `ArgmaxMemo` of a whole source holds (its tokens, truncated to `max_len`)."""
    cap = max_len or 2**62
    return sum(min(n, cap) for n in lengths) * ROW_DTYPE.itemsize


__all__ = ["ArgmaxMemo", "memo_bytes"]
