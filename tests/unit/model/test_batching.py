"""The layout of an update's documents (`gradshare.model.batching`): a document packed into a row
beside others gets exactly the token losses and gradients it gets alone (block-diagonal causal
mask, positions restarting at 0); packing keeps every document once, within the row width, in a
bounded set of shapes. (The loop over these micro-batches: tests/unit/train/test_micro_batches.py.)"""
from __future__ import annotations

import random

import pytest
import torch

from gradshare.data.documents import encode
from gradshare.model import batching
from gradshare.model.lm import TokenLoss, build_model, collate
from gradshare.model.source import model_config
from tests.unit.train.test_micro_batches import WIDTH, _inputs


@pytest.fixture(scope="module")
def inputs_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("batching")
    _inputs(root)  # the tokenizer, once
    return root


def test_a_document_packed_beside_others_gets_the_losses_and_gradients_it_gets_alone(inputs_dir):
    docs, tok, schedule = _inputs(inputs_dir)
    ids = schedule["updates"][0]
    encoded = {i: encode(tok, docs[i], WIDTH) for i in ids}
    lengths = {i: len(e[0]) for i, e in encoded.items()}
    model = build_model(model_config("tiny_qwen3.json", len(tok)), 3)
    net = TokenLoss(model)

    def grads_of(fn):
        model.zero_grad(set_to_none=True)
        total = fn()
        total.backward()
        return total.detach(), [p.grad.clone() for p in model.parameters()]

    def plain():  # every document alone, one row each, padded to the longest
        x, att, tgt = collate([encoded[i] for i in ids], tok.pad_token_id)
        return net(x, att, tgt).sum()

    mbs = batching.packed(ids, lengths, WIDTH, 4 * WIDTH)
    assert sum(len(mb.rows) for mb in mbs) < len(ids)  # several documents share rows

    def packed():
        total = 0
        for mb in mbs:
            x = batching.collate(mb, encoded, tok.pad_token_id)
            total = total + net(x["ids"], tgt=x["tgt"], seg=x["seg"], pos=x["pos"]).sum()
        return total

    want, want_grads = grads_of(plain)
    got, got_grads = grads_of(packed)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    for g, w in zip(got_grads, want_grads):  # FP32 summation order: far under 1e-5 relative
        assert float((g - w).norm() / w.norm()) < 1e-5


def test_packing_keeps_every_document_once_within_the_row_in_a_few_shapes():
    rng = random.Random(5)
    # the study's mix: three quarters ~30-token tasks, the rest conversations up to the cut
    lengths = {f"d{k:03d}": (rng.randint(12, 63) if k % 4 else rng.choice([512, rng.randint(10, 512)]))
               for k in range(400)}
    ids = list(lengths)
    for budget in (512, 2048, 4096, 1536):
        mbs = batching.packed(ids, lengths, 512, budget)
        assert sorted(d for mb in mbs for d in mb.docs) == sorted(ids)
        assert all(sum(lengths[d] for d in row) <= 512 for mb in mbs for row in mb.rows)
        assert {mb.shape for mb in mbs} <= set(batching.shapes(512, budget))
        assert all(len(mb.rows) <= mb.shape[0] <= budget // 512 for mb in mbs)
        used = sum(lengths.values()) / sum(mb.shape[0] * mb.shape[1] for mb in mbs)
        assert used > 0.8  # rows full to within a few documents
    assert batching.shapes(512, 2048) == [(2, 512), (4, 512)]
    assert batching.shapes(512, 1536) == [(2, 512), (3, 512)]
    with pytest.raises(ValueError, match="more than a row"):
        batching.pack_rows(["long"], {"long": 600}, 512)
