"""Block ids of the sequences that hold KV blocks, one row of a growable 2D array each.

``KVCacheManager`` owns the tables (as ``Block`` objects, for references and hashing) and keeps
this id view of them in step. It has the layout the attention kernels take, so a step's
``[rows, max_blocks]`` table is one numpy gather instead of a Python loop over rows. Entries
past a table's length are zero, the padding the kernels get.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class BlockTables:
    """Id view of the block tables: ``ids[row, :lengths[row]]`` are the block ids of the
    sequence that holds ``row``; rows are reused after ``remove``."""

    def __init__(self, num_rows: int = 64, width: int = 64):
        self.ids = np.zeros((num_rows, width), dtype=np.int32)
        self.lengths = np.zeros(num_rows, dtype=np.int64)
        self._rows: dict[str, int] = {}
        self._unused = list(range(num_rows - 1, -1, -1))

    def __contains__(self, seq_id: str) -> bool:
        return seq_id in self._rows

    def get(self, seq_id: str) -> list[int]:
        row = self._rows.get(seq_id)
        return [] if row is None else self.ids[row, :self.lengths[row]].tolist()

    def extend(self, seq_id: str, block_ids: list[int]) -> None:
        """Append ``block_ids`` to the table of ``seq_id`` (created empty if absent)."""
        row = self._rows.get(seq_id)
        if row is None:
            if not self._unused:
                self._grow(rows=2 * len(self.lengths))
            row = self._rows[seq_id] = self._unused.pop()
        start = int(self.lengths[row])
        end = start + len(block_ids)
        if end > self.ids.shape[1]:
            self._grow(width=max(end, 2 * self.ids.shape[1]))
        self.ids[row, start:end] = block_ids
        self.lengths[row] = end

    def remove(self, seq_id: str) -> None:
        row = self._rows.pop(seq_id, None)
        if row is not None:
            self.ids[row, :self.lengths[row]] = 0
            self.lengths[row] = 0
            self._unused.append(row)

    def gather(self, seq_ids: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
        """Tables of ``seq_ids`` (each must hold blocks): ids ``[n, longest]`` zero-padded,
        and lengths ``[n]``."""
        rows = np.fromiter(map(self._rows.__getitem__, seq_ids), dtype=np.int64)
        lengths = self.lengths[rows]
        width = int(lengths.max()) if len(rows) else 0
        return self.ids[rows, :width], lengths

    def _grow(self, *, rows: int | None = None, width: int | None = None) -> None:
        old_rows, old_width = self.ids.shape
        rows, width = rows or old_rows, width or old_width
        ids = np.zeros((rows, width), dtype=np.int32)
        ids[:old_rows, :old_width] = self.ids
        self.ids = ids
        self.lengths = np.concatenate([self.lengths, np.zeros(rows - old_rows, dtype=np.int64)])
        self._unused = list(range(rows - 1, old_rows - 1, -1)) + self._unused
