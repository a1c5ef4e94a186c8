"""Packed micro-batches, their static steps and the DDP arms' exchange pass compute the same
update as the plain micro-batches of whole documents.

- a document packed into a row beside others gets exactly the token losses and gradients it
  gets alone (block-diagonal causal mask, positions restarting at 0);
- every arm (single; dense and powersgd on two real gloo ranks) trained for 4 updates on a
  schedule of tasks and conversations gives the same losses and gradient norms packed (through
  the static steps that are CUDA graphs on a GPU, and the exchange pass) as by count, and
  counts the same target tokens per update;
- packing keeps every document once, within the row width, in a bounded set of shapes;
- DDP's buckets are final before the first update (no rebuild moves the gradients later);
- an arm out of device memory fails naming the cap, the update, the phase and the allocation.
The GPU side (graph capture and replay, the allocator cap) runs in benchmarks/gpu_path.py.
"""
from __future__ import annotations

import random
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from gradshare.data.documents import conversation_document, encode, target_tokens, task_document
from gradshare.data.replay import load_conversations, render_conversation
from gradshare.data.schedule import build_schedule, update_sha256
from gradshare.data.tasks import FAMILIES, generate_splits
from gradshare.data.tokenizer import load_tokenizer, train_bpe
from gradshare.model.lm import TokenLoss, build_model, collate
from gradshare.model.source import model_config
from gradshare.contract.plan import PlanError, load_plan
from gradshare.model import batching
from gradshare.train.loop import train
from gradshare.train.memory import DeviceMemoryError, out_of_memory_reason
from tests.two_ranks import run_two_ranks

SEED = 20261204
UPDATES = 4
WIDTH = 64  # data.max_doc_tokens: conversations are cut here, tasks are 10-30 tokens
SMALL = {"schedule.updates": str(UPDATES), "data.train_per_family": "24", "data.replay_docs": "32",
         "powersgd.warmup_updates": "2", "data.max_doc_tokens": str(WIDTH), "optim.warmup_updates": "1"}
PACKED = {"schedule.micro_batch_tokens": str(4 * WIDTH), "hardware.cuda_graphs": "true"}


def _inputs(root):
    """A small study's training documents (96 tasks, 32 real conversations), its tokenizer and
    schedule, written under `root` once and read back by every process."""
    tok_dir = root / "tokenizer"
    train, _ = generate_splits(FAMILIES, 24, 1, SEED)
    convs = load_conversations("chitchat")[:32]
    docs = [task_document(c) for c in train] + [
        conversation_document({"id": f"conv/{k:03d}", "text": render_conversation(c)}, "replay")
        for k, c in enumerate(convs)]
    if not tok_dir.exists():
        train_bpe([d["prompt"] + d["target"] for d in docs], 512, tok_dir)
    tok = load_tokenizer(tok_dir)
    by_id = {d["id"]: d for d in docs}
    updates = build_schedule(sorted(by_id), UPDATES, 32, SEED)
    schedule = {"updates": updates, "max_doc_tokens": WIDTH, "update_sha256": [update_sha256(u) for u in updates],
                "target_tokens": [sum(target_tokens(tok, by_id[i], WIDTH) for i in u) for u in updates]}
    return by_id, tok, schedule


def _train(arm: str, extra: dict, root, rank: int = 0, world: int = 1) -> dict:
    docs, tok, schedule = _inputs(root)
    procs = {"arms.dense_processes": str(world), "arms.powersgd_processes": str(world)}
    plan = load_plan("tiny", {**SMALL, **procs, **extra})
    model = build_model(model_config(plan.model.config, len(tok)), plan.study.seed)
    norms = []
    res = train(plan, arm, model, tok, docs, schedule, torch.device("cpu"), rank, world,
                on_step=lambda u, m, sha: norms.append(m["train/grad_norm"]), log=lambda *a: None)
    return {"losses": res.losses, "grad_norms": norms, "tokens": res.tokens, "hook_passes": res.hook_passes,
            "graphs": res.graphs}


def _two_rank_worker(rank: int, port: int, out_dir: str) -> None:
    from pathlib import Path

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    try:
        out = {(arm, layout): _train(arm, extra, Path(out_dir), rank, 2)
               for arm in ("dense", "powersgd") for layout, extra in (("by-count", {}), ("packed", PACKED))}
        torch.save(out, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def inputs_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("micro_batches")
    _inputs(root)  # the tokenizer, once
    return root


@pytest.fixture(scope="module")
def two_rank_runs(inputs_dir):
    return run_two_ranks(_two_rank_worker, inputs_dir, 2, "packed micro-batches", limit_s=240)


def _same_updates(a: dict, b: dict) -> None:
    assert a["tokens"] == b["tokens"]  # the same documents' tokens, however laid out
    torch.testing.assert_close(torch.tensor(a["losses"]), torch.tensor(b["losses"]), rtol=1e-5, atol=0)
    torch.testing.assert_close(torch.tensor(a["grad_norms"]), torch.tensor(b["grad_norms"]), rtol=1e-4, atol=0)


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


def test_single_trains_the_same_updates_packed_as_by_count(inputs_dir):
    by_count = _train("single", {}, inputs_dir)
    packed = _train("single", PACKED, inputs_dir)
    _same_updates(packed, by_count)
    assert packed["graphs"] == {"shapes": 2, "captured": 0, "failed": None}  # a CPU: no capture


@pytest.mark.parametrize("arm", ["dense", "powersgd"])
def test_a_two_rank_arm_trains_the_same_updates_packed_as_by_count(two_rank_runs, arm):
    for rank_out in two_rank_runs:
        _same_updates(rank_out[(arm, "packed")], rank_out[(arm, "by-count")])
    assert two_rank_runs[0][(arm, "packed")]["losses"] == two_rank_runs[1][(arm, "packed")]["losses"]
    if arm == "powersgd":  # the exchange pass is the update's one exchange: one hook pass each
        assert [r[(arm, layout)]["hook_passes"] for r in two_rank_runs for layout in ("packed", "by-count")] \
               == [UPDATES] * 4


def test_ddp_buckets_are_final_before_the_first_update(inputs_dir):
    """A rebuild after training began moves the gradients (bucket views) and, on a GPU, holds two
    full gradients at once beside AdamW's state; packed, the buckets are built at start-up."""
    import gradshare.train.loop as loop

    moved = {}
    dist.init_process_group("gloo", init_method=f"file://{inputs_dir / 'pg'}", rank=0, world_size=1)
    try:
        for layout, extra in (("by-count", {}), ("packed", PACKED)):
            ptrs = []
            docs, tok, schedule = _inputs(inputs_dir)
            plan = load_plan("tiny", {**SMALL, "arms.dense_processes": "1",
                                      "hardware.gradient_as_bucket_view": "true", **extra})
            model = build_model(model_config(plan.model.config, len(tok)), plan.study.seed)
            loop.train(plan, "dense", model, tok, docs, schedule, torch.device("cpu"), 0, 1,
                       on_step=lambda u, m, s: ptrs.append([p.grad.data_ptr() for p in model.parameters()]),
                       log=lambda *a: None)
            moved[layout] = any(p != ptrs[0] for p in ptrs[1:])
    finally:
        dist.destroy_process_group()
    assert moved == {"by-count": True, "packed": False}


def test_an_arm_out_of_device_memory_names_the_cap_the_update_and_the_allocation(inputs_dir, monkeypatch):
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total "
                                 "capacity of 139.81 GiB of which 12.00 GiB is free.")
    reason = out_of_memory_reason(oom, 44.0, "update 3 of 16, micro-batch 2 of 3 (4 rows x 512 tokens)",
                                  torch.device("cpu"))
    for part in ("update 3 of 16", "micro-batch 2 of 3", "tried to allocate 2.50 GiB",
                 "hardware.max_device_gib=44", "schedule.micro_batch_tokens"):
        assert part in reason

    # the loop tracks where it is: an allocation failing in update 2's first micro-batch
    armed = []
    real_forward = TokenLoss.forward

    def failing(self, *a, **k):
        if armed:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 96.00 MiB.")
        return real_forward(self, *a, **k)

    monkeypatch.setattr(TokenLoss, "forward", failing)
    docs, tok, schedule = _inputs(inputs_dir)
    plan = load_plan("tiny", {**SMALL, **PACKED, "hardware.max_device_gib": "44"})
    model = build_model(model_config(plan.model.config, len(tok)), plan.study.seed)
    with pytest.raises(DeviceMemoryError) as err:
        train(plan, "single", model, tok, docs, schedule, torch.device("cpu"), 0, 1,
              on_step=lambda u, m, sha: armed.append(u), log=lambda *a: None)
    assert str(err.value).startswith("out of device memory in update 2 of 4, micro-batch 1 of ")
    assert "tried to allocate 96.00 MiB" in str(err.value)


def test_the_plan_refuses_graphs_without_packing_and_rows_wider_than_the_budget():
    with pytest.raises(PlanError, match="hardware.cuda_graphs needs schedule.micro_batch_tokens"):
        load_plan("tiny", {"hardware.cuda_graphs": "true"})
    with pytest.raises(PlanError, match="holds no row"):
        load_plan("tiny", {"schedule.micro_batch_tokens": "64"})  # rows of 128
    with pytest.raises(PlanError, match="max_device_gib"):
        load_plan("tiny", {"hardware.max_device_gib": "-1"})
    full = load_plan("full")
    assert (full.schedule.micro_batch_tokens, full.hardware.cuda_graphs, full.hardware.max_device_gib) == \
           (2048, True, 44.0)
    tiny = load_plan("tiny")  # the tiny study keeps whole-document micro-batches: its numbers stand
    assert (tiny.schedule.micro_batch_tokens, tiny.hardware.cuda_graphs) == (0, False)


@pytest.mark.parametrize("arm", ["single", "powersgd"])
def test_a_packed_arm_resumed_from_its_full_state_continues_exactly(inputs_dir, tmp_path, arm):
    """Packed, with DDP's buckets built at start-up: a run resumed after update 2 from its full
    state (weights, AdamW, PowerSGD's error and memories, RNG) ends with the straight run's
    weights, bit for bit on a CPU, and the restored error fits the prebuilt buckets."""
    from gradshare.train import fullstate
    from gradshare.train.loop import FullStatePolicy

    docs, tok, schedule = _inputs(inputs_dir)
    plan = load_plan("tiny", {**SMALL, **PACKED, "arms.powersgd_processes": "1"})
    saved = {}
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        def run(full):
            model = build_model(model_config(plan.model.config, len(tok)), plan.study.seed)
            res = train(plan, arm, model, tok, docs, schedule, torch.device("cpu"), 0, 1, log=lambda *a: None,
                        full_state=full)
            return res, {k: v.clone() for k, v in model.state_dict().items()}

        straight, want = run(FullStatePolicy(every=2, root=tmp_path / "fs", on_saved=lambda p, m: saved.update(path=p)))
        resumed, got = run(FullStatePolicy(resume=fullstate.load(saved["path"], 1)))
    finally:
        dist.destroy_process_group()
    assert resumed.losses == straight.losses
    assert all(torch.equal(got[k], want[k]) for k in want)
