"""The training loop (`gradshare.train.loop`) computes the same update however its documents are
laid out, and the same update in every arm: packed micro-batches, their static steps and the DDP
arms' exchange pass against the plain micro-batches of whole documents. (The layout itself, a
packed document's losses and gradients against its own: tests/unit/model/test_batching.py.)

- single's losses and gradient norms equal dense's on two real gloo ranks, update by update,
  on the same schedule (a loss scale off by the world size changes every one of them);
- every arm (single; dense and powersgd on two real gloo ranks) trained for 4 updates on a
  schedule of tasks and conversations gives the same losses and gradient norms packed (through
  the static steps that are CUDA graphs on a GPU, and the exchange pass) as by count, and
  counts the same target tokens per update;
- DDP's buckets are final before the first update (no rebuild moves the gradients later);
- an arm out of device memory fails naming the cap, the update, the phase and the allocation.
The GPU side (graph capture and replay, the allocator cap) runs in benchmarks/gpu_path.py.
"""
from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from gradshare.data.documents import conversation_document, target_tokens, task_document
from gradshare.data.replay import load_conversations, render_conversation
from gradshare.data.schedule import build_schedule, update_sha256
from gradshare.data.tasks import FAMILIES, generate_splits
from gradshare.data.tokenizer import load_tokenizer, train_bpe
from gradshare.model.lm import TokenLoss, build_model
from gradshare.model.source import model_config
from gradshare.contract.plan import PlanError, load_plan
from gradshare.train.loop import TrainJob, train
from gradshare.train.memory import DeviceMemoryError, out_of_memory_reason
from tests.two_ranks import run_two_ranks

SEED = 20261204
UPDATES = 4
WIDTH = 64  # data.max_doc_tokens: conversations are cut here, tasks are 10-30 tokens
# 8 documents an update (24 tasks, 8 conversations): two micro-batches of 4 on each of two ranks,
# several packed rows; every property below holds at any size, and 32 cost four times the CPU
PER_FAMILY, CONVERSATIONS, DOCS_PER_UPDATE = 6, 8, 8
SMALL = {"schedule.updates": str(UPDATES), "data.train_per_family": str(PER_FAMILY),
         "data.replay_docs": str(CONVERSATIONS), "schedule.docs_per_update": str(DOCS_PER_UPDATE),
         "powersgd.warmup_updates": "2", "data.max_doc_tokens": str(WIDTH), "optim.warmup_updates": "1"}
PACKED = {"schedule.micro_batch_tokens": str(4 * WIDTH), "hardware.cuda_graphs": "true"}


def _inputs(root):
    """A small study's training documents (24 tasks, 8 real conversations), its tokenizer and
    schedule, written under `root` once and read back by every process."""
    tok_dir = root / "tokenizer"
    train, _ = generate_splits(FAMILIES, PER_FAMILY, 1, SEED)
    convs = load_conversations("chitchat")[:CONVERSATIONS]
    docs = [task_document(c) for c in train] + [
        conversation_document({"id": f"conv/{k:03d}", "text": render_conversation(c)}, "replay")
        for k, c in enumerate(convs)]
    if not tok_dir.exists():
        train_bpe([d["prompt"] + d["target"] for d in docs], 512, tok_dir)
    tok = load_tokenizer(tok_dir)
    by_id = {d["id"]: d for d in docs}
    updates = build_schedule(sorted(by_id), UPDATES, DOCS_PER_UPDATE, SEED)
    schedule = {"updates": updates, "max_doc_tokens": WIDTH, "update_sha256": [update_sha256(u) for u in updates],
                "target_tokens": [sum(target_tokens(tok, by_id[i], WIDTH) for i in u) for u in updates]}
    return by_id, tok, schedule


def _train(arm: str, extra: dict, root, rank: int = 0, world: int = 1) -> dict:
    docs, tok, schedule = _inputs(root)
    procs = {"arms.rows": f"single:single:1,dense:dense:{world},powersgd:powersgd:{world}"}
    plan = load_plan("tiny", {**SMALL, **procs, **extra})
    model = build_model(model_config(plan.model.config, len(tok)), plan.study.seed)
    norms = []
    res = train(TrainJob(plan, arm, model, tok, docs, schedule, torch.device("cpu"), rank, world,
                on_step=lambda u, m, sha: norms.append(m["train/grad_norm"]), log=lambda *a: None))
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


def test_single_trains_the_same_updates_packed_as_by_count(inputs_dir):
    by_count = _train("single", {}, inputs_dir)
    packed = _train("single", PACKED, inputs_dir)
    _same_updates(packed, by_count)
    assert packed["graphs"] == {"shapes": 2, "captured": 0, "failed": None}  # a CPU: no capture


def test_single_and_dense_on_two_ranks_train_the_same_updates(two_rank_runs, inputs_dir):
    """The same schedule, one process against two gloo ranks: every update's loss and gradient
    norm agree to FP32 summation order. Each rank scales its loss by world / the update's target
    tokens so that DDP's average is the update's sum; a slip to 1 / tokens halves dense's
    gradient (its norm) but not the logged loss, and one that forgets DDP's average doubles it."""
    single = _train("single", {}, inputs_dir)
    for rank_out in two_rank_runs:  # every rank logs the update's loss
        torch.testing.assert_close(torch.tensor(rank_out[("dense", "by-count")]["losses"]),
                                   torch.tensor(single["losses"]), rtol=1e-5, atol=0)
    dense = two_rank_runs[0][("dense", "by-count")]  # rank 0 reports the update's metrics
    assert len(dense["grad_norms"]) == len(single["grad_norms"]) == UPDATES
    torch.testing.assert_close(torch.tensor(dense["grad_norms"]), torch.tensor(single["grad_norms"]), rtol=1e-4, atol=0)
    assert all(r[("dense", "by-count")]["tokens"] == single["tokens"] for r in two_rank_runs)  # the update's, summed


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
            plan = load_plan("tiny", {**SMALL, "arms.rows": "single:single:1,dense:dense:1,powersgd:powersgd:2",
                                      "hardware.gradient_as_bucket_view": "true", **extra})
            model = build_model(model_config(plan.model.config, len(tok)), plan.study.seed)
            loop.train(loop.TrainJob(plan, "dense", model, tok, docs, schedule, torch.device("cpu"), 0, 1,
                       on_step=lambda u, m, s: ptrs.append([p.grad.data_ptr() for p in model.parameters()]),
                       log=lambda *a: None))
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
        train(TrainJob(plan, "single", model, tok, docs, schedule, torch.device("cpu"), 0, 1,
              on_step=lambda u, m, sha: armed.append(u), log=lambda *a: None))
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
    plan = load_plan("tiny", {**SMALL, **PACKED, "arms.rows": "single:single:1,dense:dense:2,powersgd:powersgd:1"})
    saved = {}
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        def run(full):
            model = build_model(model_config(plan.model.config, len(tok)), plan.study.seed)
            res = train(TrainJob(plan, arm, model, tok, docs, schedule, torch.device("cpu"), 0, 1, log=lambda *a: None,
                        full_state=full))
            return res, {k: v.clone() for k, v in model.state_dict().items()}

        straight, want = run(FullStatePolicy(every=2, root=tmp_path / "fs", on_saved=lambda p, m: saved.update(path=p)))
        resumed, got = run(FullStatePolicy(resume=fullstate.load(saved["path"], 1)))
    finally:
        dist.destroy_process_group()
    assert resumed.losses == straight.losses
    assert all(torch.equal(got[k], want[k]) for k in want)
