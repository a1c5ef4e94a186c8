"""Replicas agree, checked (`gradshare.train.replicas`): a tensor's fingerprint is exact for its
bits; two real gloo ranks with equal weights pass, and one changed element on rank 1 fails on
both ranks naming that tensor. (Through the train entry point, a perturbed rank 1:
tests/e2e/test_replicas_arm.py.)"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gradshare.train.replicas import ReplicaMismatch, check_agree, fingerprint
from tests.two_ranks import run_two_ranks


def test_a_fingerprint_changes_with_any_bit_order_or_shape():
    a = torch.randn(1000)
    assert fingerprint(a) == fingerprint(a.clone())
    one_ulp = a.clone()
    one_ulp[500] = torch.nextafter(one_ulp[500], torch.tensor(float("inf")))
    swapped = a.clone()
    swapped[[3, 4]] = a[[4, 3]]
    assert fingerprint(one_ulp) != fingerprint(a)
    assert fingerprint(swapped) != fingerprint(a)  # the same values elsewhere: the weighted sum sees it
    assert fingerprint(a.reshape(10, 100)) != fingerprint(a)
    assert fingerprint(a.to(torch.bfloat16)) == fingerprint(a.to(torch.bfloat16).clone())


def _worker(rank: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
        same = check_agree(model, rank, 2)
        if rank == 1:
            with torch.no_grad():
                model[1].bias[1] += 1e-6
        try:
            check_agree(model, rank, 2)
            differ = ""
        except ReplicaMismatch as exc:
            differ = str(exc)
        torch.save({"same": same, "differ": differ}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_ranks_agree_until_one_weight_moves_and_then_both_name_it(tmp_path):
    results = run_two_ranks(_worker, tmp_path, 2, "replica check")
    for r in results:
        assert r["same"] == 4  # two weights, two biases
        assert r["differ"].startswith("replicas disagree: rank 1's weights differ from rank 0's at tensor 1.bias")
        assert "the first of 1 of 4 tensors" in r["differ"]


def test_a_fingerprint_summed_chunk_by_chunk_equals_the_whole_tensors():
    """The chunked sums (bounded device memory) equal the formula over the whole tensor, computed
    here independently in Python integers, for chunks that do and do not divide the length."""
    g = torch.Generator().manual_seed(3)
    for t in (torch.randn(1001, generator=g), torch.randn(7, 13, generator=g).to(torch.bfloat16),
              torch.randint(-2**31, 2**31 - 1, (257,), generator=g, dtype=torch.int64).to(torch.int32)):
        raw = [int(x) for x in t.contiguous().reshape(-1).view({1: torch.uint8, 2: torch.int16, 4: torch.int32,
                                                                 8: torch.int64}[t.element_size()])]
        p = 2147483647
        expected = (tuple(t.shape), sum(raw), sum((x % p) * (i + 1) % p for i, x in enumerate(raw)))
        for chunk in (1, 10, 256, 10_000):
            assert fingerprint(t, chunk=chunk) == expected


def test_one_rank_has_nothing_to_compare_and_reads_no_weight(monkeypatch):
    import gradshare.train.replicas as replicas

    monkeypatch.setattr(replicas, "fingerprint", lambda *a, **k: pytest.fail("fingerprinted at world 1"))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    assert check_agree(model, 0, 1) == 4
