"""A rank's documents of one update, as the micro-batches its forward and backward passes see.

Two layouts, the same function (the sum of token losses over the same documents):

- by count (`schedule.micro_batch_tokens` = 0, the tiny profile): micro-batches of
  `micro_batch_docs` documents, grouped by length, each row one document padded to the
  micro-batch's longest;
- packed (`micro_batch_tokens` > 0, the full profile): documents are packed, longest first,
  into rows of `width` (= data.max_doc_tokens) tokens. Within a row each document attends only
  to itself (a block-diagonal causal mask) and its positions restart at 0, so every document
  sees exactly what it would see alone; the first token of a document is never a target, so
  nothing is predicted across a document boundary. Rows go into micro-batches of at most
  `micro_batch_tokens // width` rows, and a micro-batch's row count is padded with empty rows
  to a power of two: shapes come from a small fixed set (`row_counts`), so compiled layers and
  CUDA graphs are made once per shape, at start-up.

The study's documents (median 3,400 tokens per update: ~30-token tasks and conversations of up
to 512) fill rows of 512 to within a few per cent, where padding each document to its
micro-batch's longest padded ~45% (measured on the full profile's schedule).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PAD_SEGMENT = -1  # the segment id of padding in packed rows


@dataclass(frozen=True)
class MicroBatch:
    """One forward/backward: `rows` lists, per row, the document ids it holds (by count: one
    document per row); `shape` is the padded (rows, tokens) the step runs."""
    rows: tuple[tuple[str, ...], ...]
    shape: tuple[int, int]

    @property
    def docs(self) -> list[str]:
        return [d for row in self.rows for d in row]


def by_count(doc_ids: list[str], lengths: dict[str, int], size: int) -> list[MicroBatch]:
    """Micro-batches of `size` documents, grouped by length to waste little padding."""
    ordered = sorted(doc_ids, key=lambda i: (lengths[i], i))
    out = []
    for k in range(0, len(ordered), size):
        chunk = ordered[k:k + size]
        out.append(MicroBatch(tuple((i,) for i in chunk), (len(chunk), max(lengths[i] for i in chunk))))
    return out


def row_counts(max_rows: int) -> tuple[int, ...]:
    """The row counts a packed micro-batch may have: powers of two from 2 (a one-row batch would
    be compiled as a special case of its own) up to `max_rows`, and `max_rows` itself."""
    if max_rows < 2:
        return (1,)
    counts, n = [], 2
    while n < max_rows:
        counts.append(n)
        n *= 2
    return tuple(counts) + (max_rows,)


def pack_rows(doc_ids: list[str], lengths: dict[str, int], width: int) -> list[list[str]]:
    """First-fit decreasing: each document, longest first, into the first row it fits."""
    rows: list[list[str]] = []
    room: list[int] = []
    for i in sorted(doc_ids, key=lambda i: (-lengths[i], i)):
        n = lengths[i]
        if n > width:
            raise ValueError(f"document {i} has {n} tokens, more than a row of {width}")
        for r, free in enumerate(room):
            if n <= free:
                rows[r].append(i)
                room[r] -= n
                break
        else:
            rows.append([i])
            room.append(width - n)
    return rows


def packed(doc_ids: list[str], lengths: dict[str, int], width: int, budget_tokens: int) -> list[MicroBatch]:
    """This rank's documents packed into rows of `width`, rows into micro-batches of at most
    `budget_tokens // width` rows; the last micro-batch's row count is padded up to the
    nearest of `row_counts`."""
    max_rows = budget_tokens // width
    if max_rows < 1:
        raise ValueError(f"a micro-batch of {budget_tokens} tokens holds no row of {width}")
    counts = row_counts(max_rows)
    rows = pack_rows(doc_ids, lengths, width)
    out = []
    for k in range(0, len(rows), max_rows):
        chunk = rows[k:k + max_rows]
        n = min(c for c in counts if c >= len(chunk))
        out.append(MicroBatch(tuple(tuple(r) for r in chunk), (n, width)))
    return out


def shapes(width: int, budget_tokens: int) -> list[tuple[int, int]]:
    """Every shape `packed` can give: what start-up compiles and captures."""
    return [(n, width) for n in row_counts(budget_tokens // width)]


def for_plan(plan, doc_ids: list[str], lengths: dict[str, int]) -> list[MicroBatch]:
    """This rank's share of one update as the plan lays it out: by count, or packed by its token
    budget. The update's gradient is a sum over its documents, so the layout changes rounding
    only, never the function being computed."""
    s = plan.schedule
    if s.micro_batch_tokens:
        return packed(doc_ids, lengths, plan.data.max_doc_tokens, s.micro_batch_tokens)
    return by_count(doc_ids, lengths, s.micro_batch_docs)


def collate(mb: MicroBatch, encoded: dict[str, tuple[list[int], list[bool]]], pad_id: int,
            pin: bool = False) -> dict[str, torch.Tensor]:
    """Host tensors of one micro-batch, each of its shape:
    `ids` token ids (pad_id where empty), `tgt` target mask, `seg` the document number within
    its row (PAD_SEGMENT where empty), `pos` each token's position within its own document.
    By count, each row is one document and `seg` is 0 on its tokens: the plain causal mask."""
    import torch  # deferred: the layout alone (`for_plan`) is the projection's and prepare's, torch-free

    n, width = mb.shape
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    tgt = torch.zeros((n, width), dtype=torch.bool)
    seg = torch.full((n, width), PAD_SEGMENT, dtype=torch.long)
    pos = torch.zeros((n, width), dtype=torch.long)
    for r, row in enumerate(mb.rows):
        at = 0
        for k, doc in enumerate(row):
            tokens, mask = encoded[doc]
            end = at + len(tokens)
            ids[r, at:end] = torch.tensor(tokens)
            tgt[r, at:end] = torch.tensor(mask)
            seg[r, at:end] = k
            pos[r, at:end] = torch.arange(len(tokens))
            at = end
    out = {"ids": ids, "tgt": tgt, "seg": seg, "pos": pos}
    return {k: v.pin_memory() for k, v in out.items()} if pin else out
