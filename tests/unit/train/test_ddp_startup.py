"""A DDP arm's start-up holds one FP32 gradient, never two.

DDP copies the gradients that exist when it is built into its buckets, and copies them again
into new buckets when it rebuilds them (at the forward after its first exchanging backward):
each time the old storage stays alive beside the new, a second full FP32 gradient (6.9 GB at
1.7B) at the arm's reserved peak. Where the buckets are prebuilt (GPU, or graphs), no gradient
exists when DDP is built, and none when it rebuilds: every gradient ends a view of its final
bucket, where the static steps write. (That the same updates' losses follow: the two-rank
packed-vs-by-count test in tests/unit/train/test_micro_batches.py.)
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import gradshare.train.loop as loop
from gradshare.contract.plan import load_plan
from gradshare.model.lm import build_model
from gradshare.model.source import model_config
from tests.unit.train.test_micro_batches import PACKED, SMALL, _inputs


def test_no_gradient_exists_when_ddp_builds_or_rebuilds_its_buckets(tmp_path, monkeypatch):
    seen = {}

    class Watched(DistributedDataParallel):
        def __init__(self, module, *args, **kwargs):
            seen["at_construction"] = sum(p.grad is not None for p in module.parameters())
            super().__init__(module, *args, **kwargs)

            def before_forward(mod, args, kwargs):
                if kwargs.get("ids", args[0] if args else None) is None and "at_rebuild" not in seen:
                    seen["at_rebuild"] = sum(p.grad is not None for p in mod.parameters())
            self.register_forward_pre_hook(before_forward, with_kwargs=True)

    monkeypatch.setattr(loop, "DDP", Watched)
    docs, tok, schedule = _inputs(tmp_path)
    plan = load_plan("tiny", {**SMALL, **PACKED, "arms.rows": "single:single:1,dense:dense:1,powersgd:powersgd:2",
                              "hardware.gradient_as_bucket_view": "true"})
    assert loop.prebuilds_buckets(plan)
    model = build_model(model_config(plan.model.config, len(tok)), plan.study.seed)
    grads_at_update = []
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        loop.train(loop.TrainJob(plan, "dense", model, tok, docs, schedule, torch.device("cpu"), 0, 1,
                   on_step=lambda u, m, s: grads_at_update.append(
                       {p.grad.untyped_storage().data_ptr() for p in model.parameters()}),
                   log=lambda *a: None))
    finally:
        dist.destroy_process_group()
    assert seen == {"at_construction": 0, "at_rebuild": 0}
    # every gradient is a view of a bucket: a few storages, the same at every update
    n_params = sum(1 for _ in model.parameters())
    assert len(grads_at_update[0]) < n_params
    assert all(s == grads_at_update[0] for s in grads_at_update)
