"""The plan's concerns about the hosts the study rents (`gradshare.contract.plan` composes them):
their prices, zones, bound and deadline (`InfraPlan`), the link the CPU emulation shapes
(`LinkPlan`), and what the preflight measures before any arm (`PreflightPlan`), with the NCCL
socket settings both name (`socket_counts`).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InfraPlan:
    instance_type: str = "g6e.2xlarge"
    gpu: str = "NVIDIA L40S 48GB"
    hosts: tuple[str, ...] = ("host-a", "host-b")
    zones: tuple[str, ...] = ("us-east-1a", "us-east-1b")
    """Zone of each host; hosts in different zones pay cross-zone transfer."""
    usd_per_host_hour: float = 2.24208
    """On-demand price in us-east-1 as planned (declared, overridable)."""
    price_date: str = "2026-12-02"
    """Date the declared price was taken."""
    cross_zone_usd_per_gb: float = 0.01
    """Billed in each direction."""
    cpu_host: str = "m7i.large (2 vCPU, 8 GiB), us-east-1, on demand"
    """What a CPU run (the tiny profile's emulation) is priced as: a host like the one it ran on."""
    cpu_usd_per_host_hour: float = 0.1008
    """Declared price of `cpu_host` on `price_date`; the study's hosts appear beside it as a projection."""
    deadline_hours: float = 6.0
    budget_usd: float = 100.0
    # --- AWS, optional (`gradshare guard`, `gradshare server`, prepare's price refresh) ---
    aws_region: str = ""
    """Region of the study's instances; empty: no AWS calls at all."""
    instance_ids: tuple[str, ...] = ()
    """EC2 instances `gradshare guard` stops at the deadline (`study` starts a guard when set)."""
    artifact_destination: str = ""
    """Where `gradshare server` keeps artifacts (e.g. s3://bucket/prefix); empty: its local folder."""
    refresh_prices: bool = False
    """Prepare asks the AWS Price List API for `instance_type`'s on-demand price; on any
    failure the declared figure stands, with a warning."""
    # --- the study's hosts as the projection (`gradshare.cost.projection`) assumes them ---
    link_gbit: float = 20.0
    """Cross-zone bandwidth of one host, each way: AWS lists g6e.2xlarge at "up to 20 Gigabit"
    (EC2 G6e instance table), a ceiling, so projections from it are the most favourable."""
    gpu_dense_tflops: float = 362.0
    """L40S dense BF16 tensor rate, NVIDIA's L40S datasheet (733 is with sparsity)."""
    gpu_memory_gbps: float = 864.0
    """L40S device memory bandwidth, GB/s, NVIDIA's L40S datasheet: what the memory-bound parts of
    an update (gradient additions, AdamW, clip, PowerSGD's passes) scale by (`gradshare.cost.gpu_cost`)."""
    host_pinned_both_gbps: float = 47.0
    """Pinned host <-> GPU copies of the study's host, both directions at once, GB/s together: the
    L40S sits on PCIe Gen4 x16, 64 GB/s both ways (L40S datasheet); the H200 machine's Gen5 x16
    (128 GB/s) gave 93.7 of it in the 2026-12-04 benchmark, 73%, so 64 x 0.73. PowerSGD's FP32
    host error crosses it twice per compressed update. Not measured on an L40S host."""
    host_pinned_uncertainty: float = 0.3
    """The projection's verdicts are recomputed at this fraction below and above
    `host_pinned_both_gbps`; where they flip, the output says so."""

    def problems(self, plan) -> list[str]:  # plan: the whole `Plan`
        return [] if len(self.zones) == len(self.hosts) else ["infra.zones must name one zone per host in infra.hosts"]


@dataclass(frozen=True)
class LinkPlan:
    """The link between the two emulated hosts of a CPU run (`gradshare.hosts.netns`).

    Its rate is chosen so that the tiny dense exchange costs the same multiple of one
    rank's compute per update as the study's does:

    study (full profile, one L40S per host, hosts in two zones):
      exchange  6.9 GB (the FP32 gradient of 1.72e9 parameters; each of two ring all-reduce
                ranks sends and receives its logical volume once) over `infra.link_gbit`
                = 20 Gbit/s: 6.9e9 x 8 / 20e9 = 2.76 s
      compute   one rank's half of an update, 16 documents x 512 tokens = 8,192 tokens at
                6 x 1.72e9 FLOP per token = 8.45e13 FLOP, on an L40S at `infra.gpu_dense_tflops`
                = 362 TFLOP/s at an assumed 40% of it: 8.45e13 / 1.45e14 = 0.58 s
      multiple  2.76 / 0.58 = 4.7
    tiny (this profile, one CPU thread per process):
      compute   one rank's half of an update, 16 documents x 128 tokens (the truncation
                length, as 512 is the study's), forward, backward and AdamW on the
                1,443,328-parameter model: 0.44 s measured on the 2-core machine this was
                written on (torch.set_num_threads(1))
      exchange  1,443,328 x 4 = 5.77 MB = 46.2 Mbit, to take 4.7 x 0.44 = 2.1 s
      rate      46.2 / 2.1 = 22 Mbit/s
    Both sides are counted at full-length documents, as the design's anchors are. The tiny
    study's own documents are shorter (about 51 tokens on average): there one rank's half of
    an update measured 0.20 s (the single arm at one thread, median 0.40 s per update over
    128 updates), so the dense exchange is about 10x that compute; how much shorter than 512
    the study's documents are is not measured yet.
    A faster CPU makes the tiny compute shorter and the same link relatively slower: the
    multiple, not the rate, is what carries over; set the rate at prepare to keep it.
    """
    rate_mbit: float = 22.0
    """Rate of each direction of the emulated hosts' link, Mbit/s (tc tbf on both ends)."""

    def problems(self, plan) -> list[str]:  # plan: the whole `Plan`
        return [] if self.rate_mbit > 0 else ["link.rate_mbit must be > 0"]


@dataclass(frozen=True)
class PreflightPlan:
    """What `gradshare preflight` measures on the hosts before any arm (`gradshare.steps.preflight`)."""
    sustain_s: float = 60.0
    """Seconds each socket setting all-reduces the arms' buffers back to back: long enough that an
    instance's "up to" burst runs out and its baseline shows."""
    window_s: float = 10.0
    """The first and the last this many seconds are compared: a burst shows as a first window
    faster than the last."""
    sockets: tuple[str, ...] = ("1x1", "2x2", "4x4")
    """The socket settings measured (`hardware.sockets`' form)."""
    upload_mb: int = 1024
    """Megabytes uploaded to the tracking server's artifact store, timed and projected to the
    checkpoint's size."""

    def problems(self, plan) -> list[str]:  # plan: the whole `Plan`
        out = [f"preflight.sockets holds {x!r}, which is not TxS with T, S >= 1 and T x S <= 64 (NCCL's limit)"
               for x in self.sockets if x != "auto" and socket_counts(x) is None]
        if "auto" in self.sockets or not self.sockets:
            out.append("preflight.sockets lists the settings to measure: TxS each, at least one")
        if self.sustain_s <= 0 or self.window_s <= 0 or self.upload_mb < 0:
            out.append("preflight.sustain_s and preflight.window_s must be > 0, preflight.upload_mb >= 0")
        return out


def socket_counts(setting: str) -> tuple[int, int] | None:
    """`TxS` as (threads, sockets per thread), or None where it is not one NCCL accepts."""
    try:
        t, s = (int(x) for x in setting.lower().split("x"))
    except ValueError:
        return None
    return (t, s) if t >= 1 and s >= 1 and t * s <= 64 else None
