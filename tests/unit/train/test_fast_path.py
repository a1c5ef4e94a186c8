"""The full profile's fast path computes the same function as the plain one.

- gradshare's fast PowerSGD hook (one inline pass per bucket, batched orthogonalisation,
  host-resident FP32 error) gives the gradients of upstream `powerSGD_hook` with device
  error at every exchange, on two real gloo ranks, across the warm-up boundary, with
  Householder QR and with CholeskyQR2;
- the chunked cross-entropy gives the plain token losses and their gradients.
The GPU side of the same checks (CUDA streams, pinned copies) runs in
`benchmarks/gpu_configs.py` (calibrate) and is recorded in BENCHMARKS.md.
"""
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from gradshare.contract.plan import PlanError, load_plan
from tests.two_ranks import run_two_ranks
from gradshare.kinds.powersgd_hook import (
    FastHostErrorPowerSGDState,
    fast_host_error_powerSGD_hook,
    fold_errors,
    hook_for,
    make_powersgd_state,
    prefetch_errors,
)

WORLD = 2
SEED = 4321
WARMUP = 3
EXCHANGES = 9
WIDTH = 160  # (160, 160) compresses at ranks 8 and 32; several of them share a bucket
VARIANTS = ("upstream", "qr", "cholesky-qr2", "qr-pool", "qr-fold", "qr-fold-none")
RANKS = (8, 32)


def _model() -> nn.Module:
    torch.manual_seed(SEED)
    layers = [nn.Linear(64, WIDTH)]
    for _ in range(6):
        layers += [nn.Tanh(), nn.Linear(WIDTH, WIDTH)]
    layers += [nn.Tanh(), nn.Linear(WIDTH, 8)]
    return nn.Sequential(*layers)


def _batch(rank: int, step: int):
    g = torch.Generator().manual_seed(SEED * 1000 + rank * 100 + step)
    return torch.randn(96, 64, generator=g), torch.randn(96, 8, generator=g)


def _upstream_in_order(state, bucket):
    fut = powerSGD_hook(state, bucket)
    fut.wait()
    return fut


def _run(variant: str, matrix_rank: int) -> dict:
    model = _model()
    # two micro-batches, the error folded into the gradients between them; -none: the gradients set
    # to None between updates, so that the micro-batches accumulate outside the buckets
    fold = variant.startswith("qr-fold")
    none = variant == "qr-fold-none"
    ddp = DDP(model, bucket_cap_mb=0.25, gradient_as_bucket_view=fold)
    if variant == "upstream":
        state = PowerSGDState(None, matrix_approximation_rank=matrix_rank, start_powerSGD_iter=WARMUP,
                              use_error_feedback=True, warm_start=True, random_seed=SEED)
        ddp.register_comm_hook(state, _upstream_in_order)
    else:
        pool = sum(p.numel() for p in model.parameters()) if variant == "qr-pool" else 0
        state = make_powersgd_state(None, matrix_rank, WARMUP, True, "fp32-host", 2.0, SEED,
                                    hook="fast", orthogonalization=variant.split("-")[0] if fold else variant.removesuffix("-pool"),
                                    host_error_numel=pool)
        ddp.register_comm_hook(state, hook_for("fp32-host", "fast"))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    grads, device_errors, host_buckets, folded = [], [], [], []
    for step in range(EXCHANGES):
        x, y = _batch(dist.get_rank(), step)
        opt.zero_grad(set_to_none=none or not fold)  # bucket views stay, unless -none
        if fold:
            prefetch_errors(state)
            half = len(x) // 2  # two halves of the mean: the same loss as one pass
            with ddp.no_sync():
                (0.5 * nn.functional.mse_loss(ddp(x[:half]), y[:half])).backward()
            fold_errors(state)
            folded.append(len(state.folded))
            (0.5 * nn.functional.mse_loss(ddp(x[half:]), y[half:])).backward()
        else:
            nn.functional.mse_loss(ddp(x), y).backward()
        grads.append(torch.cat([p.grad.detach().reshape(-1).clone() for p in model.parameters()]))
        device_errors.append(len(state.error_dict))
        host_buckets.append(len(getattr(state, "host_error", {})))
        opt.step()
    return {"grads": grads, "iter": state.iter, "device_errors": device_errors, "folded": folded,
            "host_buckets": host_buckets, "q_at_first_bucket": sorted(getattr(state, "q_done", ())),
            "numel": (state.total_numel_before_compression, state.total_numel_after_compression),
            "in_pool": [getattr(state, "_host_pool", None) is not None
                        and t.untyped_storage().data_ptr() == state._host_pool.untyped_storage().data_ptr()
                        for _, t in sorted(getattr(state, "host_error", {}).items())]}


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD, timeout=timedelta(seconds=60))
    try:
        torch.save({r: {v: _run(v, r) for v in VARIANTS} for r in RANKS}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("fastpath")
    return run_two_ranks(_worker, out_dir, WORLD, "fast-path")


@pytest.mark.parametrize("variant", ["qr", "cholesky-qr2", "qr-pool", "qr-fold", "qr-fold-none"])
@pytest.mark.parametrize("matrix_rank", RANKS)
def test_fast_hook_gives_upstreams_gradients_at_every_exchange(two_ranks, matrix_rank, variant):
    for rank, res in enumerate(two_ranks):
        up, fast = res[matrix_rank]["upstream"], res[matrix_rank][variant]
        # QR: the same per-matrix Householder QR, batched; CholeskyQR2: the same Q up to
        # column signs and FP32 rounding, which P Q^T does not see; fold: the same sums in
        # another order (two micro-batches, the error added between them).
        tol = dict(rtol=1e-5, atol=1e-6) if variant != "cholesky-qr2" else dict(rtol=1e-4, atol=1e-5)
        for step, (g_up, g_fast) in enumerate(zip(up["grads"], fast["grads"])):
            torch.testing.assert_close(g_fast, g_up, **tol,
                                       msg=lambda m: f"rank {rank} exchange {step + 1}: {m}")
        assert fast["iter"] == up["iter"] == EXCHANGES
        assert fast["numel"] == up["numel"]  # upstream's own compression counters agree
    # the exchange really averaged, and really compressed (it differs from the rank's own mean)
    torch.testing.assert_close(two_ranks[0][matrix_rank][variant]["grads"][-1],
                               two_ranks[1][matrix_rank][variant]["grads"][-1])


@pytest.mark.parametrize("matrix_rank", RANKS)
def test_the_error_is_folded_into_the_gradients_between_micro_batches(two_ranks, matrix_rank):
    """From the second compressed update on (the first one has no error yet, and makes the host
    error the hook's buckets record), every bucket's error goes into its gradients between the
    micro-batches; the gradients are upstream's (the test above)."""
    fold = two_ranks[0][matrix_rank]["qr-fold"]
    buckets = fold["host_buckets"][-1]
    assert buckets > 1
    assert fold["folded"][:WARMUP + 1] == [0] * (WARMUP + 1)
    assert fold["folded"][WARMUP + 1:] == [buckets] * (EXCHANGES - WARMUP - 1)
    # gradients set to None accumulate outside the buckets: nothing is folded (the hook adds the
    # error, and the gradients are still upstream's, the test above)
    assert two_ranks[0][matrix_rank]["qr-fold-none"]["folded"] == [0] * EXCHANGES


@pytest.mark.parametrize("matrix_rank", RANKS)
def test_the_host_error_allocated_at_start_up_holds_every_bucket(two_ranks, matrix_rank):
    """qr-pool: the whole error allocated with the state (pinned on a GPU, at start-up, not in
    the first compressed update); every bucket's error is a piece of it, and the gradients are
    upstream's (the test above)."""
    pooled, plain = two_ranks[0][matrix_rank]["qr-pool"], two_ranks[0][matrix_rank]["qr"]
    assert len(pooled["in_pool"]) > 1 and all(pooled["in_pool"])
    assert not any(plain["in_pool"])


@pytest.mark.parametrize("matrix_rank", RANKS)
def test_fast_hook_keeps_the_error_on_the_host_in_several_buckets(two_ranks, matrix_rank):
    fast = two_ranks[0][matrix_rank]["qr"]
    assert fast["device_errors"] == [0] * EXCHANGES
    assert fast["host_buckets"][WARMUP - 1] == 0  # warm-up exchanges keep no error
    assert fast["host_buckets"][-1] > 1, "expected several DDP buckets"
    # warm start: the last pass orthogonalised every bucket's Q in its first bucket's call
    assert fast["q_at_first_bucket"] == list(range(fast["host_buckets"][-1]))


def test_same_shaped_matrices_at_equal_distances_multiply_as_one_batch_without_a_copy():
    from gradshare.kinds.powersgd_hook import _as_batch, _product

    buffer = torch.randn(200, dtype=torch.float64)
    spaced = [buffer[s:s + 12].view(3, 4) for s in (10, 40, 70)]  # 30 apart: a 12-element matrix and a gap
    batch = _as_batch(spaced, buffer)
    assert batch is not None and batch.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
    q = torch.randn(3, 4, 2, dtype=torch.float64)
    p = torch.empty(3, 3, 2, dtype=torch.float64)
    _product(spaced, batch, q, p)
    for i, mat in enumerate(spaced):
        torch.testing.assert_close(p[i], mat @ q[i])
    back = torch.empty(3, 4, 2, dtype=torch.float64)
    _product(spaced, batch, p, back, transpose=True)
    for i, mat in enumerate(spaced):
        torch.testing.assert_close(back[i], mat.t() @ p[i])
    uneven = [buffer[s:s + 12].view(3, 4) for s in (10, 40, 80)]
    assert _as_batch(uneven, buffer) is None
    overlapping = [buffer[s:s + 12].view(3, 4) for s in (10, 16)]  # closer than a matrix: never a batch
    assert _as_batch(overlapping, buffer) is None
    by_columns = [buffer[s:s + 12].view(4, 3).t() for s in (10, 40)]  # stored column by column
    assert _as_batch(by_columns, buffer) is None
    elsewhere = [buffer[10:22].view(3, 4), torch.randn(3, 4, dtype=torch.float64)]
    assert _as_batch(elsewhere, buffer) is None
    _product(uneven, None, q, p)
    for i, mat in enumerate(uneven):
        torch.testing.assert_close(p[i], mat @ q[i])


def test_fast_state_keeps_its_error_and_settings_when_saved():
    state = make_powersgd_state(None, 32, 8, True, "fp32-host", 2.0, 7, hook="fast",
                                orthogonalization="cholesky-qr2", staging_mb=64)
    assert isinstance(state, FastHostErrorPowerSGDState)
    assert hook_for("fp32-host", "fast") is fast_host_error_powerSGD_hook
    saved = state.__getstate__()
    assert {"host_error", "orthogonalization", "staging_bytes"} <= set(saved)
    with pytest.raises(ValueError, match="host"):
        make_powersgd_state(None, 32, 8, True, "device", 2.0, 7, hook="fast")


def test_the_plan_refuses_fast_levers_where_they_do_not_apply():
    with pytest.raises(PlanError, match="powersgd.hook=fast"):
        load_plan("full", {"powersgd.error_feedback": "device"})
    with pytest.raises(PlanError, match="hardware.compile"):
        load_plan("tiny", {"hardware.compile": "true"})
    with pytest.raises(PlanError, match="cholesky-qr2"):
        load_plan("tiny", {"powersgd.orthogonalization": "cholesky-qr2"})
    with pytest.raises(PlanError, match="powersgd.fold_errors=true needs powersgd.hook=fast"):
        load_plan("tiny", {"powersgd.fold_errors": "true"})
    assert not load_plan("full").powersgd.fold_errors  # off until a GPU measurement decides it
    tiny = load_plan("tiny")  # the tiny study keeps the plain path: the same numbers as before
    assert (tiny.powersgd.hook, tiny.hardware.loss_chunk_tokens, tiny.hardware.compile) == ("upstream", 0, False)


def test_chunked_cross_entropy_gives_the_plain_token_losses_and_gradients():
    from gradshare.model.lm import TokenLoss, build_model
    from gradshare.model.source import model_config

    model = build_model(model_config("tiny_qwen3.json", 1024), 3)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 1024, (3, 40), generator=g)
    att = torch.ones_like(ids)
    att[1, 30:] = 0  # a padded row
    tgt = att.bool() & (torch.rand(3, 40, generator=g) > 0.3)
    out = {}
    for chunk in (0, 7, 1000):  # no chunks, uneven chunks, one chunk
        model.zero_grad(set_to_none=True)
        nll = TokenLoss(model, chunk)(ids, att, tgt)
        nll.sum().backward()
        out[chunk] = (nll.detach(), [p.grad.clone() for p in model.parameters()])
    for chunk in (7, 1000):
        torch.testing.assert_close(out[chunk][0], out[0][0], rtol=1e-5, atol=1e-6)
        for a, b in zip(out[chunk][1], out[0][1]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # FP32 summation order


def test_a_world_one_powersgd_run_exchanges_once_per_update(tmp_path):
    """The benchmark runs the DDP arms at world size 1: each update must still be ONE exchange
    (micro-batches under no_sync until the last), as at world size 2, or PowerSGD would
    compress every micro-batch's partial sum (4 compressions and error trips per update)."""
    import sys

    from tests.conftest import REPO

    sys.path.insert(0, str(REPO))
    from benchmarks.workloads import DOCS_PER_UPDATE, bench_plan, schedule_for
    from benchmarks.workloads import stand_in_documents as documents
    from gradshare.data.tokenizer import load_tokenizer, train_bpe
    from gradshare.model.lm import build_model
    from gradshare.model.source import model_config
    from gradshare.train.loop import TrainJob, train

    # two micro-batches of 16 documents cut at 64 tokens: their count, not their size, is what matters
    updates, tokens = 3, 64
    docs = documents(updates * DOCS_PER_UPDATE, 7)
    train_bpe([d["target"] for d in docs], 512, tmp_path / "tok")
    tok = load_tokenizer(tmp_path / "tok")
    plan = bench_plan("tiny", {"data.max_doc_tokens": str(tokens), "schedule.micro_batch_docs": "16"}, updates)  # warm-up 2: the third is compressed
    assert DOCS_PER_UPDATE // plan.schedule.micro_batch_docs > 1  # several micro-batches an update
    by_id = {d["id"]: d for d in docs}
    schedule = schedule_for(tok, by_id, updates, plan.study.seed, max_tokens=tokens)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        model = build_model(model_config(plan.model.config, len(tok)), plan.study.seed)
        res = train(TrainJob(plan, "powersgd", model, tok, by_id, schedule, torch.device("cpu"), 0, 1,
                    log=lambda *a: None))
    finally:
        dist.destroy_process_group()
    assert res.hook_passes == updates
