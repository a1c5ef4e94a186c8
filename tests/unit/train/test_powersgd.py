"""PowerSGD arm: the host-error hook against upstream, on two real gloo ranks.

The host-error variant must change *where* the error lives, never *what* is
communicated: with identical seeds and batches its averaged gradients must equal
upstream `powerSGD_hook` with device error feedback at every exchange, across the
warm-up boundary and while the error accumulates.
"""
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
    PowerSGDState,
    _should_compress,
    powerSGD_hook,
)
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.two_ranks import run_two_ranks
from gradshare.kinds.base import gradient_elements
from gradshare.kinds.powersgd import compressed_elements, should_compress
from gradshare.kinds.powersgd_hook import (
    HostErrorPowerSGDState,
    host_error_powerSGD_hook,
    hook_for,
    make_powersgd_state,
    powerSGD_hook_cpu_safe,
)


def logical_bytes_per_exchange(shapes, element_bytes, rank, rate=2.0):
    """One rank's payload as the kinds count it: the whole gradient (`rank=None`, dense) or
    PowerSGD's P, Q and uncompressed tensors at `rank`, in `element_bytes` per element."""
    return element_bytes * (gradient_elements(shapes) if rank is None else compressed_elements(shapes, rank, rate))

WORLD = 2
SEED = 1234
WARMUP = 4
EXCHANGES = 12
# (160, 96) and (256, 160) compress at rank 8, (8, 256) and biases do not; at rank 32
# only (256, 160) compresses, so both matrix ranks mix compressed and uncompressed tensors.
SIZES = (96, 160, 256, 8)
RANKS = (8, 32)
VARIANTS = ("dense", "upstream", "host", "device")


def _model() -> nn.Module:
    torch.manual_seed(SEED)  # identical weights on both ranks and in every run
    return nn.Sequential(nn.Linear(SIZES[0], SIZES[1]), nn.Tanh(),
                         nn.Linear(SIZES[1], SIZES[2]), nn.Tanh(),
                         nn.Linear(SIZES[2], SIZES[3]))


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Different data per rank and per step, so the ranks disagree and error accumulates;
    # 64 rows make each gradient's rank exceed 32, so even rank-32 compression is lossy.
    g = torch.Generator().manual_seed(SEED * 1000 + rank * 100 + step)
    return torch.randn(64, SIZES[0], generator=g), torch.randn(64, SIZES[-1], generator=g)


def _upstream_in_order(state: PowerSGDState, bucket: dist.GradBucket
                       ) -> torch.futures.Future[torch.Tensor]:
    # The reference: upstream's hook, each bucket finished before the next, since with
    # gloo upstream's callback-issued all-reduces otherwise race across buckets.
    fut = powerSGD_hook(state, bucket)
    fut.wait()
    return fut


def _run(rank: int, variant: str, matrix_rank: int) -> dict:
    """EXCHANGES DDP updates (plain SGD) with one hook variant; the communicated grads per step."""
    model = _model()
    # A small bucket cap gives several buckets, so per-bucket indexing and upstream's
    # "iter advances on the last bucket" both matter.
    ddp = DDP(model, bucket_cap_mb=0.05)
    state = None
    if variant == "upstream":
        state = PowerSGDState(None, matrix_approximation_rank=matrix_rank,
                              start_powerSGD_iter=WARMUP, use_error_feedback=True,
                              warm_start=True, random_seed=SEED)
        ddp.register_comm_hook(state, _upstream_in_order)
    elif variant in ("host", "device"):
        mode = "fp32-host" if variant == "host" else "device"
        state = make_powersgd_state(None, rank=matrix_rank, warmup_updates=WARMUP, warm_start=True,
                                    error_feedback=mode, min_compression_rate=2.0, seed=SEED)
        ddp.register_comm_hook(state, hook_for(mode))
    # variant "dense": DDP's built-in all-reduce, the reference for the warm-up.
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    grads, device_errors, host_errors = [], [], []
    for step in range(EXCHANGES):
        x, y = _batch(rank, step)
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(ddp(x), y).backward()
        grads.append([p.grad.detach().clone() for p in model.parameters()])
        if variant == "host":
            device_errors.append(len(state.error_dict))
            host_errors.append({i: (t.dtype, t.device.type, t.numel())
                                for i, t in state.host_error.items()})
        opt.step()
    return {"grads": grads, "device_errors": device_errors, "host_errors": host_errors,
            "iter": state.iter if state is not None else None}


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD, timeout=timedelta(seconds=60))
    try:
        results = {r: {v: _run(rank, v, r) for v in VARIANTS} for r in RANKS}
        torch.save(results, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory) -> list[dict]:
    out_dir = tmp_path_factory.mktemp("powersgd")
    return run_two_ranks(_worker, out_dir, WORLD, "PowerSGD")


def _flat(grads: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in grads])


@pytest.mark.parametrize("variant", ["host", "device"])
@pytest.mark.parametrize("matrix_rank", RANKS)
def test_hook_matches_upstream(two_rank_results, matrix_rank, variant):
    for rank, results in enumerate(two_rank_results):
        up, host = results[matrix_rank]["upstream"], results[matrix_rank][variant]
        for step, (g_up, g_host) in enumerate(zip(up["grads"], host["grads"])):
            torch.testing.assert_close(_flat(g_host), _flat(g_up), rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"rank {rank} exchange {step + 1}: {m}")
        assert host["iter"] == up["iter"] == EXCHANGES
    # The exchange really averaged: both ranks hold the same gradient.
    torch.testing.assert_close(_flat(two_rank_results[0][matrix_rank][variant]["grads"][-1]),
                               _flat(two_rank_results[1][matrix_rank][variant]["grads"][-1]))


@pytest.mark.parametrize("matrix_rank", RANKS)
def test_host_error_lives_on_host_only(two_rank_results, matrix_rank):
    host = two_rank_results[0][matrix_rank]["host"]
    assert host["device_errors"] == [0] * EXCHANGES  # device copy freed after every exchange
    n_params = sum(p.numel() for p in _model().parameters())
    for step, errors in enumerate(host["host_errors"]):
        exchange = step + 1
        if exchange <= WARMUP:
            assert errors == {}, f"exchange {exchange} is plain all-reduce and keeps no error"
        else:
            assert len(errors) > 1, "expected several DDP buckets"
            assert all(d == torch.float32 and dev == "cpu" for d, dev, _ in errors.values())
            assert sum(n for _, _, n in errors.values()) == n_params


@pytest.mark.parametrize("matrix_rank", RANKS)
def test_compression_starts_after_warmup(two_rank_results, matrix_rank):
    """Exchanges 1..WARMUP equal plain DDP; exchange WARMUP + 1 is compressed."""
    res = two_rank_results[0][matrix_rank]
    # Parameters stay identical across variants until the first compressed exchange.
    for step in range(WARMUP + 1):
        same = torch.allclose(_flat(res["dense"]["grads"][step]), _flat(res["host"]["grads"][step]),
                              rtol=1e-5, atol=1e-6)
        assert same == (step + 1 <= WARMUP), f"exchange {step + 1}"


def test_make_state_modes():
    host = make_powersgd_state(None, 32, 8, True, "fp32-host", 2.0, 7)
    assert isinstance(host, HostErrorPowerSGDState) and host.use_error_feedback
    assert hook_for("fp32-host") is host_error_powerSGD_hook
    assert "host_error" in host.__getstate__()  # a saved state keeps the error
    device = make_powersgd_state(None, 32, 8, True, "device", 2.0, 7)
    assert type(device) is PowerSGDState and device.use_error_feedback
    assert hook_for("device") is powerSGD_hook_cpu_safe
    none = make_powersgd_state(None, 32, 8, False, "none", 2.0, 7)
    assert not none.use_error_feedback and not none.warm_start
    assert hook_for("none") is powerSGD_hook_cpu_safe
    assert device.matrix_approximation_rank == 32 and device.start_powerSGD_iter == 8
    with pytest.raises(ValueError, match="warmup_updates"):
        make_powersgd_state(None, 32, 1, True, "fp32-host", 2.0, 7)
    with pytest.raises(ValueError):
        make_powersgd_state(None, 32, 8, True, "bf16", 2.0, 7)


def test_logical_bytes_hand_computed():
    """Hand-computed cases; 1-D tensors follow upstream's n x 1 view, not a skip rule."""
    assert logical_bytes_per_exchange([(256, 256)], 4, 32) == (256 + 256) * 32 * 4
    # (128+128)*32*2 = 16384 is not < 128*128 = 16384: sent uncompressed.
    assert logical_bytes_per_exchange([(128, 128)], 4, 32) == 128 * 128 * 4
    # A 1-D tensor is a 1024 x 1 matrix, rank 1: (1024+1)*1*2 = 2050 > 1024, uncompressed
    # at the default rate 2; at rate 0.5, 1025*0.5 < 1024: compressed into P and Q, 1025.
    assert logical_bytes_per_exchange([(1024,)], 4, 32) == 1024 * 4
    assert logical_bytes_per_exchange([(1024,)], 4, 32, 0.5) == (1024 + 1) * 4
    assert logical_bytes_per_exchange([(1,)], 4, 32, 0.5) == 1 * 4  # 2*0.5 = 1 is not < 1
    # (8, 256) at rank 32 -> r = 8: (8+256)*8 = 2112 elements; 2112*0.99 < 2048 is false.
    assert logical_bytes_per_exchange([(8, 256)], 1, 32, 0.99) == 8 * 256
    assert logical_bytes_per_exchange([(8, 256)], 1, 32, 0.5) == (8 + 256) * 8
    # Conv-like (64, 32, 3, 3) is viewed as 64 x 288: (64+288)*32*2 = 22528 > 18432, uncompressed.
    assert logical_bytes_per_exchange([(64, 32, 3, 3)], 2, 32) == 64 * 288 * 2
    # rank capped by the smaller side: (4096, 8) -> min(32, 4096, 8) = 8; (4104*8*2) > 32768.
    assert logical_bytes_per_exchange([(4096, 8)], 4, 32) == 4096 * 8 * 4
    shapes = [(256, 256), (128, 128), (1024,)]
    assert logical_bytes_per_exchange(shapes, 4, None) == (65536 + 16384 + 1024) * 4
    assert logical_bytes_per_exchange(shapes, 4, 32) == (16384 + 16384 + 1024) * 4


def test_compression_ratio_realistic():
    # One transformer block of a ~1.7B model (d=2048, MLP 8192), plus its norms.
    d, f = 2048, 8192
    shapes = [(3 * d, d), (d, d), (f, d), (d, f), (d,), (d,), (3 * d,), (f,)]
    dense = logical_bytes_per_exchange(shapes, 4, None)
    compressed = logical_bytes_per_exchange(shapes, 4, 32)
    assert dense / compressed > 10


# --- logical_bytes_per_exchange against upstream's own rule and counters -----------------

RATES = (0.5, 0.99, 1.0, 2.0, 10.0)
# Qwen-like (Qwen2.5-1.5B: d=1536, MLP 8960, 2 KV heads of 128, vocab 151936; Qwen3-style
# per-head norms of 128), tiny and degenerate matrices, 1-D, 3-D and 4-D tensors.
UPSTREAM_SHAPES = [
    (1,), (2,), (3,), (99,), (100,), (101,), (128,), (256,), (1536,), (8960,),
    (1, 1), (1, 5), (5, 1), (2, 2), (3, 7), (8, 256), (128, 128), (256, 256),
    (1536, 1536), (256, 1536), (8960, 1536), (1536, 8960), (151936, 1536),
    (2, 3, 4), (4, 2, 3), (1, 1, 1, 1), (16, 3, 5, 5), (64, 32, 3, 3), (512, 256, 1, 1),
    (3, 0), (4, 0, 2),
]


def _upstream_elements(shape: tuple[int, ...], rank: int, rate: float) -> int:
    """Elements upstream `powerSGD_hook` sends for one gradient: its own view and test."""
    tensor = torch.empty(shape, device="meta")  # no memory even for the embedding
    matrix = tensor.view(tensor.shape[0], -1)  # exactly the view upstream makes
    n, m = matrix.shape
    r = min(n, m, rank)
    compress, uncompressed, compressed = _should_compress(n, m, r, rate)
    assert should_compress(n, m, r, rate) == (compress, uncompressed, compressed)  # gradshare's copy of the rule
    if compress:
        assert compressed == n * r + m * r  # P (n x r) plus Q (m x r), as upstream allocates
    return compressed if compress else uncompressed


@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("matrix_rank", (1, 4, 32))
def test_logical_bytes_matches_upstream_should_compress(matrix_rank, rate):
    total = 0
    for shape in UPSTREAM_SHAPES:
        want = _upstream_elements(shape, matrix_rank, rate)
        got = logical_bytes_per_exchange([shape], 1, matrix_rank, rate)
        assert got == want, f"shape {shape}, rank {matrix_rank}, rate {rate}: {got} != {want}"
        assert logical_bytes_per_exchange([shape], 2, matrix_rank, rate) == 2 * want
        total += want
    assert logical_bytes_per_exchange(UPSTREAM_SHAPES, 4, matrix_rank, rate) == 4 * total
    # The old rule (1-D never compressed) is wrong exactly when the rate is below 1.
    one_d_compressed = any(len(s) == 1 and _upstream_elements(s, matrix_rank, rate) != s[0]
                           for s in UPSTREAM_SHAPES)
    assert one_d_compressed == (rate < 1)


def test_logical_bytes_shapes_upstream_cannot_view():
    """0-dim and leading-size-0 tensors: upstream's hook raises; counted as numel here."""
    with pytest.raises(IndexError):
        _upstream_elements((), 4, 0.5)
    with pytest.raises(RuntimeError):
        _upstream_elements((0, 4), 4, 0.5)
    for rate in RATES:
        assert logical_bytes_per_exchange([()], 4, 4, rate) == 4
        assert logical_bytes_per_exchange([(0,), (0, 4)], 4, 4, rate) == 0
        assert logical_bytes_per_exchange([(3, 0), (4, 0, 2)], 4, 4, rate) == 0


class _Mixed(nn.Module):
    """1-D (biases, norm, a length-1 scale), 2-D and 3-D parameters."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(SEED)
        self.conv = nn.Conv1d(2, 4, 3)  # weight (4, 2, 3), bias (4,)
        self.fc1 = nn.Linear(32, 16)  # (16, 32), (16,)
        self.norm = nn.LayerNorm(16)  # (16,), (16,)
        self.fc2 = nn.Linear(16, 4)  # (4, 16), (4,)
        self.scale = nn.Parameter(torch.ones(1))  # (1,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x).flatten(1)  # (B, 2, 10) -> (B, 4, 8) -> (B, 32)
        return self.fc2(torch.tanh(self.norm(self.fc1(h)))) * self.scale


@pytest.fixture(scope="module")
def single_rank_group(tmp_path_factory):
    """A real one-rank gloo process group in this process, destroyed even on failure."""
    store = tmp_path_factory.mktemp("pg1") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1,
                            timeout=timedelta(seconds=60))
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("rate", (0.5, 0.99, 2.0, 10.0))
@pytest.mark.parametrize("matrix_rank", (1, 2, 8))
def test_logical_bytes_matches_upstream_counters(single_rank_group, matrix_rank, rate):
    """Upstream's own `total_numel_after_compression` over one compressed DDP pass."""
    model = _Mixed()
    shapes = [tuple(p.shape) for p in model.parameters() if p.requires_grad]
    # A tiny bucket cap gives several buckets, so every bucket's share is counted.
    ddp = DDP(model, bucket_cap_mb=0.001)
    state = PowerSGDState(process_group=None, matrix_approximation_rank=matrix_rank,
                          start_powerSGD_iter=2, min_compression_rate=rate,
                          use_error_feedback=False, warm_start=False)
    ddp.register_comm_hook(state, _upstream_in_order)
    g = torch.Generator().manual_seed(SEED)
    counters = []  # (iter, before, after) at the end of each pass
    for _ in range(4):  # passes 1-2 plain all-reduce, 3-4 compressed
        ddp.zero_grad(set_to_none=True)
        ddp(torch.randn(5, 2, 10, generator=g)).square().mean().backward()
        counters.append((state.iter, state.total_numel_before_compression,
                         state.total_numel_after_compression))
    assert [c[0] for c in counters] == [1, 2, 3, 4], f"DDP did not run the hook every pass: {counters}"
    assert counters[1][1:] == (0, 0), "upstream counted during its plain all-reduce warm-up"
    before = counters[2][1] - counters[1][1]
    after = counters[2][2] - counters[1][2]
    if after == 0:
        pytest.fail(f"upstream's counters did not move over a compressed pass: {counters}")
    assert before == sum(p.numel() for p in model.parameters())  # every gradient went through
    assert counters[3][2] - counters[2][2] == after  # the next compressed pass sends the same
    assert logical_bytes_per_exchange(shapes, 1, matrix_rank, rate) == after
    assert logical_bytes_per_exchange(shapes, 4, matrix_rank, rate) == 4 * after
    assert logical_bytes_per_exchange(shapes, 1, None) == before
    if rate == 0.5:  # upstream compresses 1-D gradients here: (16,) as 16 x 1 into 17 elements
        # (at 0.99 only n > 99 would be, and this model's 1-D tensors are smaller)
        one_d = [s for s in shapes if len(s) == 1]
        old_rule = (logical_bytes_per_exchange([s for s in shapes if len(s) > 1], 1, matrix_rank, rate)
                    + sum(s[0] for s in one_d))
        assert after != old_rule
