"""The preflight's measurements on each host, made the way the arms run: one process per GPU (or
CPU rank) under `accelerate launch`, the arms' backend (NCCL on GPUs, gloo on CPUs) and their
launch parameters. Started by `gradshare.steps.preflight`, once per socket setting:

    accelerate launch --multi_gpu --num_machines 2 --machine_rank R --main_process_ip A \\
        --main_process_port P --num_processes 2 -m gradshare.hosts.probe --workdir W

`W/probe.json` says what to measure (`Probe`); every rank writes `W/probe.rank<N>.json`, rank 0
with the link's figures. What is measured:

- **the link**: the arms' own buffers all-reduced back to back for `sustain_s` (dense's buckets,
  then PowerSGD's P and Q), each round timed; the first and the last `window_s` apart, so that a
  burst allowance that runs out shows (AWS's "up to" bandwidth); and its capacity with the
  setting's flows: dense's bytes in as many equal all-reduces at once;
- **the host link** (GPUs only): pinned copies of the whole FP32 error in the arm's pieces (a
  bucket, at most half of `powersgd.staging_mb`), host to device, device to host and both at once
  (two streams);
- **one rank's share of an update** (`compute_share`): the plan's model trained on rank 0 alone with
  an update's documents, as `single` runs, then on every rank at once with a rank's documents, as a
  two-process arm runs; the ratio of the two (CPU ranks: on emulated hosts they share one machine's
  cores). A GPU rank is not timed: its share is its documents, times the ranks on its device;
- **this host**: memory that can be pinned for the error (the host's available memory), the GPU's
  free memory against `hardware.max_device_gib`, the outbox's free disk;
- **the clock offset** of each rank against rank 0 (a round trip over the process group: the
  offset is the peer's clock minus the midpoint of the trip, good to half the round trip).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

PROBE = "probe.json"


@dataclass(frozen=True)
class Probe:
    dense_buckets: list[int]
    """Bytes of each of dense's all-reduces per update (DDP's buckets of the FP32 gradient)."""
    powersgd_buffers: list[int] = field(default_factory=list)
    """Bytes of PowerSGD's per-bucket all-reduces of a compressed update (P, then Q)."""
    sustain_s: float = 60.0
    window_s: float = 10.0
    device: str = "cpu"
    max_device_gib: float = 0.0
    error_buckets: list[int] = field(default_factory=list)
    """Bytes of the FP32 error's per-bucket copies (GPU runs)."""
    staging_bytes: int = 0
    """Device memory the error's copies may hold (`powersgd.staging_mb`); 0: a bucket each way."""
    outbox: str = ""
    label: str = ""
    """The socket setting this launch runs with, as the step names it."""
    flows: int = 1
    """Sockets (flows) the setting opens to a peer: the link's capacity is measured with dense's
    bytes in this many equal all-reduces at once, one a flow."""
    model: str = ""
    """The plan's model shape (`model.config`, or `hf:DIR`) to time an update of; "": not timed."""
    vocab_size: int = 0
    """The prepared model's vocabulary (its tokenizer's); 0: the config's."""
    docs_per_update: int = 0
    micro_batch_docs: int = 1
    doc_tokens: int = 0
    threads_alone: int = 0
    """Torch threads of a one-process arm (the arms' launch gives it these; 0: torch's default)."""
    threads_rank: int = 0
    """Torch threads of each rank of a two-process arm."""
    compute_repeats: int = 3


def result_path(workdir: Path, rank: int) -> Path:
    return Path(workdir) / f"probe.rank{rank}.json"


def _rounds(buffers, device, stop) -> list[tuple[float, float, int]]:
    """(start, seconds, bytes) of each round: every buffer all-reduced, issued at once as DDP
    issues its buckets, then waited for; until `stop()` (the same answer on every rank)."""
    import torch
    import torch.distributed as dist

    tensors = [torch.ones(max(1, n // 4), dtype=torch.float32, device=device) for n in buffers]
    total = sum(t.numel() * 4 for t in tensors)
    out = []
    while True:
        t0 = time.perf_counter()
        works = [dist.all_reduce(t, async_op=True) for t in tensors]
        for w in works:
            w.wait()
        if device != "cpu":
            torch.cuda.synchronize()
        out.append((t0, time.perf_counter() - t0, total))
        if stop():
            return out


def _stop_after(seconds: float, device: str):
    """A `stop` for `_rounds`: true on every rank once any rank has run `seconds` (a one-element
    all-reduce after each round; clocks and rounds differ slightly between ranks)."""
    import torch
    import torch.distributed as dist

    until = time.perf_counter() + seconds

    def stop() -> bool:
        flag = torch.tensor([1.0 if time.perf_counter() >= until else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())
    return stop


def link(p: Probe, device: str) -> dict:
    """The dense buckets' and PowerSGD's all-reduce rates (logical bytes per second), whole and
    in the first and last `window_s`."""
    _rounds(p.dense_buckets, device, lambda: True)  # warm-up: connections, buffers
    out = {"dense": _rates(_rounds(p.dense_buckets, device, _stop_after(p.sustain_s, device)), p.window_s)}
    total = sum(p.dense_buckets)
    pieces = [total // p.flows] * p.flows
    out["capacity"] = _rates(_rounds(pieces, device, _stop_after(min(p.window_s, p.sustain_s), device)),
                             p.window_s)
    if p.powersgd_buffers:
        out["powersgd"] = _rates(_rounds(p.powersgd_buffers, device,
                                         _stop_after(min(p.window_s, p.sustain_s), device)), p.window_s)
    return out


def _rates(rounds, window_s: float) -> dict:
    seconds = sum(s for _, s, _ in rounds)
    moved = sum(b for _, _, b in rounds)
    t0, t1 = rounds[0][0], rounds[-1][0] + rounds[-1][1]
    first = [r for r in rounds if r[0] < t0 + window_s] or rounds[:1]
    last = [r for r in rounds if r[0] + r[1] > t1 - window_s] or rounds[-1:]

    def rate(rs):
        return sum(b for _, _, b in rs) / sum(s for _, s, _ in rs)

    return {"rounds": len(rounds), "seconds": seconds, "bytes_per_round": rounds[0][2],
            "round_s_median": statistics.median(s for _, s, _ in rounds),
            "logical_Bps": moved / seconds, "first_window_Bps": rate(first), "last_window_Bps": rate(last)}


def torch_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def clock_offset_s(rank: int, world: int) -> list[float]:
    """Each rank's clock minus rank 0's, seconds (rank 0's list; others get an empty one)."""
    import torch
    import torch.distributed as dist

    offsets = [0.0] * world
    for peer in range(1, world):
        t = torch.zeros(1, dtype=torch.float64)
        if rank == 0:
            sent = time.time()
            dist.send(torch.tensor([sent], dtype=torch.float64), peer)
            dist.recv(t, peer)
            back = time.time()
            offsets[peer] = float(t) - (sent + back) / 2
        elif rank == peer:
            dist.recv(t, 0)
            dist.send(torch.tensor([time.time()], dtype=torch.float64), 0)
    return offsets if rank == 0 else []


def host_link(p: Probe) -> dict:
    """Pinned host <-> device copies of the whole FP32 error, GB/s, as the arm moves it: in pieces
    of a bucket, at most half the staging each (two in flight: one landing while the other is
    used), host to device, device to host, and both at once (two streams); empty on a CPU."""
    if p.device == "cpu" or not p.error_buckets:
        return {}
    import torch

    dev = torch.device("cuda", torch_local_rank())
    size = max(p.error_buckets)
    if p.staging_bytes:
        size = max(4, min(size, p.staging_bytes // 2))
    n = size // 4
    host = [torch.empty(n, pin_memory=True).fill_(1.0) for _ in range(2)]
    gpu = [torch.empty(n, device=dev).fill_(2.0) for _ in range(2)]
    streams = [torch.cuda.Stream(dev) for _ in range(2)]
    reps = max(1, -(-sum(p.error_buckets) // size))  # the whole error, each way

    def timed(copy) -> float:
        copy()
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(reps):
            copy()
        torch.cuda.synchronize(dev)
        return time.perf_counter() - t0

    def both():
        with torch.cuda.stream(streams[0]):
            gpu[0].copy_(host[0], non_blocking=True)
        with torch.cuda.stream(streams[1]):
            host[1].copy_(gpu[1], non_blocking=True)

    return {"h2d_GBps": reps * size / timed(lambda: gpu[0].copy_(host[0], non_blocking=True)) / 1e9,
            "d2h_GBps": reps * size / timed(lambda: host[1].copy_(gpu[1], non_blocking=True)) / 1e9,
            "both_GBps": 2 * reps * size / timed(both) / 1e9, "bucket_bytes": size,
            "staging_bytes": p.staging_bytes}


def compute_share(p: Probe, rank: int, world: int) -> dict:
    """One rank's share of an update's compute on these hosts (rank 0's figures; {} on the others,
    or where the probe times no model): `share` = the slowest rank's update with a rank's documents,
    all ranks at once / rank 0's update with all of an update's documents, alone. Each figure the
    median of `compute_repeats` after one untimed update."""
    if not p.model or world < 2 or p.docs_per_update < world:
        return {}
    import torch
    import torch.distributed as dist

    if p.device != "cpu":  # a device a rank: its documents, times the ranks that share its device
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        on_device = math.ceil(local / max(1, torch.cuda.device_count()))
        return {"share": on_device / world, "source": f"not timed: {local} rank(s) on "
                f"{torch.cuda.device_count()} device(s) of this host, a rank's documents 1/{world}"} if rank == 0 else {}
    # torch and transformers: the probe's processes build the model, the preflight step does not
    from gradshare.model.update_cost import UpdateBench

    bench = UpdateBench(p.model, p.micro_batch_docs, p.doc_tokens, vocab_size=p.vocab_size or None)
    launched = torch.get_num_threads()  # what the launch gave every rank, as it gives the arms' ranks
    dist.barrier()  # every rank's model built: none still busy beside rank 0's alone timing
    alone = []
    if rank == 0:  # as `single` runs: one process, its threads, every document; the others wait
        if p.threads_alone > 0:
            torch.set_num_threads(p.threads_alone)
        bench.update_s(p.docs_per_update)
        alone = [bench.update_s(p.docs_per_update) for _ in range(p.compute_repeats)]
    torch.set_num_threads(p.threads_rank if p.threads_rank > 0 else launched)
    mine = p.docs_per_update // world
    dist.barrier()
    bench.update_s(mine)
    together = []
    for _ in range(p.compute_repeats):
        dist.barrier()  # every rank starts its update at once, as the arm's ranks do
        slowest = torch.tensor([bench.update_s(mine)], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        together.append(float(slowest))
    if rank != 0:
        return {}
    a, t = statistics.median(alone), statistics.median(together)
    return {"share": t / a, "alone_s": a, "rank_s": t, "alone_runs_s": alone, "rank_runs_s": together,
            "source": f"timed: the plan's model, {p.docs_per_update} documents on one process against "
                      f"{mine} on each of {world} at once"}


def resources(p: Probe) -> dict:
    """What this host can give the arm: memory for the pinned error, GPU memory under the cap,
    disk for the checkpoint and the outbox."""
    out = {"host": socket.gethostname(), "host_available_bytes": psutil.virtual_memory().available}
    folder = Path(p.outbox or ".")
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    out["outbox_free_bytes"] = shutil.disk_usage(folder).free
    if p.device != "cpu":
        import torch

        free, total = torch.cuda.mem_get_info(torch_local_rank())
        out |= {"gpu_free_bytes": free, "gpu_total_bytes": total,
                "gpu_cap_bytes": int(min(p.max_device_gib * 2**30, total)) if p.max_device_gib else total}
    return out


def run(workdir: Path) -> None:
    import torch.distributed as dist

    p = Probe(**json.loads((workdir / PROBE).read_text()))
    backend = "gloo" if p.device == "cpu" else "nccl"
    if p.device != "cpu":
        import torch

        torch.cuda.set_device(torch_local_rank())
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        mine = {"rank": rank, "label": p.label, "resources": resources(p), "host_link": host_link(p)}
        offsets = clock_offset_s(rank, world)
        share = compute_share(p, rank, world)  # before the link: the model's memory is freed by then
        figures = link(p, "cpu" if p.device == "cpu" else f"cuda:{torch_local_rank()}")
        everyone = [None] * world
        dist.all_gather_object(everyone, mine)
        out = mine | ({"link": figures, "clock_offset_s": offsets, "ranks": everyone, "world": world,
                       "backend": backend, "compute": share} if rank == 0 else {})
        result_path(workdir, rank).write_text(json.dumps(out, indent=1))
    finally:
        dist.destroy_process_group()


def write_probe(workdir: Path, p: Probe) -> None:
    (Path(workdir) / PROBE).write_text(json.dumps(asdict(p)))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True)
    run(Path(ap.parse_args(argv).workdir))
    # The result is on disk and the group destroyed: leave without the interpreter's teardown,
    # where torch's and gloo's threads can still abort a finished probe (both ranks SIGABRT,
    # "terminate called without an active exception", 30 s into the preflight's first setting in
    # CI at 09dcc45), failing a preflight whose measurement was whole.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
