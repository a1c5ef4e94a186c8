"""The document schedule: 128 updates x 32 documents, each training document once.

The order is fixed by the seed. On several ranks each rank takes a fixed contiguous
share of every global batch, so that every arm sees the same documents in the same
order and only the gradient exchange differs.
"""
from __future__ import annotations

import random

from gradshare.util.hashing import sha256_text


def build_schedule(doc_ids: list[str], updates: int, docs_per_update: int, seed: int) -> list[list[str]]:
    if len(set(doc_ids)) != len(doc_ids):
        raise ValueError("training document ids are not unique")
    if len(doc_ids) != updates * docs_per_update:
        raise ValueError(f"{len(doc_ids)} documents do not fill {updates} updates x {docs_per_update}")
    order = sorted(doc_ids)  # independent of how the caller listed them
    random.Random(f"{seed}/schedule").shuffle(order)
    return [order[u * docs_per_update:(u + 1) * docs_per_update] for u in range(updates)]


def rank_share(update_docs: list[str], rank: int, world: int) -> list[str]:
    """This rank's fixed share of one global batch."""
    if len(update_docs) % world:
        raise ValueError(f"{len(update_docs)} documents cannot be split evenly over {world} ranks")
    n = len(update_docs) // world
    return update_docs[rank * n:(rank + 1) * n]


def update_sha256(update_docs: list[str]) -> str:
    """Hash of one update's document ids in order: logged per step, equal across arms."""
    return sha256_text("\n".join(update_docs))
