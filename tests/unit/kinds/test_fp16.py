"""The `fp16` kind (`gradshare.kinds.fp16`, PyTorch's own `fp16_compress_hook`), the kind added
as the proof that a new compression method is one module and one line of the table: on two real
gloo ranks, the bytes its hook hands to all-reduce in an update are those the kind counts, and the
gradient it delivers is dense's to FP16's rounding. (Its whole arm, trained, committed, scored
and analyzed in the small study: tests/e2e/test_analysis.py.)"""
from __future__ import annotations

import torch

from gradshare.contract.plan import load_plan
from tests.two_ranks import run_two_ranks

ROWS = "single:single:1,dense:dense:2,powersgd:powersgd:2,fp16:fp16:2"


def _worker(rank: int, port: int, out_dir: str) -> None:
    """One gloo rank: a small model in DDP with the `fp16` kind's hook (as the loop attaches it),
    one backward, every all-reduce the hook makes counted in bytes; and dense's gradient."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    plan = load_plan("tiny", {"arms.rows": ROWS})
    sent = []
    real = dist.all_reduce

    def counted(tensor, *args, **kwargs):
        sent.append(tensor.numel() * tensor.element_size())
        return real(tensor, *args, **kwargs)

    dist.all_reduce = counted  # the hook calls torch.distributed.all_reduce by its module's name
    out = {}
    for arm_name in ("fp16", "dense"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
        ddp = DDP(model, bucket_cap_mb=1)
        arm = plan.arm(arm_name)
        arm.method.attach(ddp, arm, plan, torch.device("cpu"), fresh=True).register()
        sent.clear()
        x = torch.randn(16, 64, generator=torch.Generator().manual_seed(rank))
        ddp(x).pow(2).sum().backward()
        out[arm_name] = {"sent": list(sent), "grads": [p.grad.clone() for p in model.parameters()],
                         "shapes": [tuple(p.shape) for p in model.parameters()]}
    torch.save(out, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


def test_the_fp16_hook_sends_the_bytes_its_kind_counts_and_dense_gradient_to_fp16_rounding(tmp_path, monkeypatch):
    # fresh interpreters: forked from a pytest-xdist worker that had run other modules, the ranks
    # hung in two fast-tier runs of two (never when the module ran alone)
    monkeypatch.setenv("GRADSHARE_TEST_START_METHOD", "spawn")
    ranks = run_two_ranks(_worker, tmp_path, 2, "fp16 hook")
    plan = load_plan("tiny", {"arms.rows": ROWS})
    shapes = ranks[0]["fp16"]["shapes"]
    plain, compressed = plan.arm("fp16").method.payload(plan.arm("fp16"), plan, shapes)
    for r in ranks:
        assert sum(r["fp16"]["sent"]) == compressed == plain  # every update: FP16 from the first
        assert r["dense"]["sent"] == []  # dense: DDP's own all-reduce, no hook in Python
    numel = sum(torch.Size(s).numel() for s in shapes)
    assert compressed == 2 * numel  # two bytes an element: half of dense's FP32
    assert compressed * 2 == plan.arm("dense").method.payload(plan.arm("dense"), plan, shapes)[1]
    for g16, g32 in zip(ranks[0]["fp16"]["grads"], ranks[0]["dense"]["grads"]):
        assert g16.dtype == torch.float32  # cast back before it reaches the optimizer
        # each rank's half rounded to FP16 (10 bits of mantissa), then their sum: at most 1.5 units in
        # the last place of the largest element, whatever an element's own size
        torch.testing.assert_close(g16, g32, rtol=0, atol=2 * 2**-10 * g32.abs().max().item())
        assert not torch.equal(g16, g32) or g32.abs().max() == 0  # it did go through FP16
    torch.testing.assert_close(ranks[0]["fp16"]["grads"][0], ranks[1]["fp16"]["grads"][0], rtol=0, atol=0)
