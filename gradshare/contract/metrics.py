"""Every metric name gradshare logs, and the dicts of them that the steps log.

One place, so that the writer (train, score, prepare, analyze) and the readers (cost,
collect, report, verdicts) cannot drift apart. A name is `namespace/what_unit`:
  train/     the optimisation (loss in nats per target token, globally normalised)
  perf/      seconds, rates, device-seconds
  comm/      bytes: logical (tensors exchanged, per rank) and wire (interface counters, per host)
  ckpt/      the final checkpoint
  score/ accuracy/ retention/   a scored model
  seed/      the seed model prepare built
  paired/    analyze's paired changes (fractions of test cases, not percentage points)
DESIGN.md's contract names (train/loss, perf/step_s, ..., ckpt/bytes) are read by other
tools: they never change.

Wire bytes are summed over phases of the arm (see `gradshare.hosts.metering`); a phase's
name is the suffix of its summary metrics, `total` being worker start to end.

A new per-update metric is one `PerUpdate` entry in `PER_UPDATE` (its name, unit, how it is
computed from the loop's values, its plot if any) and, where the loop does not measure it yet, one
key in the values the loop hands to `step_metrics`: the train step logs it, `analysis.collect`
reads its history and `analysis.report` draws it, without a list elsewhere to edit.
"""
from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from collections.abc import Callable, Mapping

# --- per update (MLflow step = update number, 1-based) ---
TRAIN_LOSS = "train/loss"
TRAIN_GRAD_NORM = "train/grad_norm"  # before clipping
TRAIN_LR = "train/lr"
TRAIN_TARGET_TOKENS = "train/target_tokens"
STEP_S = "perf/step_s"
TOKENS_PER_S = "perf/tokens_per_s"
GPU_S = "perf/gpu_s"  # step seconds x processes
LOGICAL_BYTES = "comm/logical_bytes"
WIRE_TX_BYTES = "comm/wire_tx_bytes"  # all hosts, non-loopback
WIRE_RX_BYTES = "comm/wire_rx_bytes"
LOOPBACK_BYTES = "comm/loopback_bytes"
SPEND_USD = "spend/usd"  # the study's spend so far, this arm's hosts until now included
STUDY_HOURS = "spend/study_hours"  # hours since the study started (prepare)
SPEND_CROSS_BYTES = "spend/cross_zone_bytes"  # this arm's cross-zone bytes so far, sent + received


@dataclass(frozen=True)
class Plot:
    """How the report draws a per-update metric: one line per arm against the update number."""
    title: str
    file: str  # the PNG's name, which the report's Markdown and the analyze run's artifacts carry
    cumulative: bool = False  # the running sum over updates (bytes sent so far), not each update's own
    beside: str | None = None  # another per-update metric, drawn dashed on the same axes for multi-process arms


@dataclass(frozen=True)
class PerUpdate:
    """One per-update metric: its name, its unit (the plot's y axis), how `step_metrics` computes it
    from the loop's values, and the report's plot of it, if any. `analysis.collect` reads every
    entry's history back."""
    name: str
    unit: str
    of: Callable[[Mapping], float]
    plot: Plot | None = None


def _over_hosts(counter: str) -> Callable[[Mapping], float]:
    """A wire counter's update delta summed over the hosts (`values["hosts"]`, see metering)."""
    return lambda values: sum(d[counter] for d in values["hosts"].values())


PER_UPDATE = (
    PerUpdate(TRAIN_LOSS, "nats per target token", itemgetter("loss"),
              Plot("Training loss (globally normalised)", "loss_curves.png")),
    PerUpdate(TRAIN_GRAD_NORM, "L2 norm", itemgetter("grad_norm")),
    PerUpdate(TRAIN_LR, "learning rate", itemgetter("lr")),
    PerUpdate(TRAIN_TARGET_TOKENS, "target tokens, all ranks", itemgetter("target_tokens")),
    PerUpdate(STEP_S, "s", itemgetter("step_s")),
    PerUpdate(TOKENS_PER_S, "tokens/s", lambda v: v["tokens"] / v["step_s"],
              Plot("Throughput per update (tokens/s)", "throughput.png")),
    PerUpdate(GPU_S, "device-s", lambda v: v["step_s"] * v["world"]),
    PerUpdate(LOGICAL_BYTES, "bytes per rank", itemgetter("logical_bytes"),
              Plot("Cumulative logical bytes (per rank)", "cumulative_logical_bytes.png", cumulative=True)),
    # loopback beside the wire: two ranks on one host talk over lo, and no byte of it crosses a link
    PerUpdate(WIRE_TX_BYTES, "bytes, all hosts", _over_hosts("wire_tx"),
              Plot("Cumulative wire bytes sent (non-loopback, all hosts)", "cumulative_wire_bytes.png",
                   cumulative=True, beside=LOOPBACK_BYTES)),
    PerUpdate(WIRE_RX_BYTES, "bytes, all hosts", _over_hosts("wire_rx")),
    PerUpdate(LOOPBACK_BYTES, "bytes, all hosts", _over_hosts("lo_tx")),
)
"""Every metric `step_metrics` logs under a fixed name, in the report's order of plots. The per-host
wire bytes (`host_wire_tx`, `host_wire_rx`) are one per host, beside these; the limits' spend
metrics above are logged by `gradshare.cost.limits` where an arm runs under limits."""


def host_wire_tx(j: int) -> str:
    """Per-update wire bytes sent by host `j` (hosts ordered by their id, see metering)."""
    return f"comm/host{j}/wire_tx_bytes"


def host_wire_rx(j: int) -> str:
    return f"comm/host{j}/wire_rx_bytes"


# --- summaries of a train run (no step) ---
ACTIVE_S = "perf/active_s"  # sum of update seconds
ACTIVE_TOKENS_PER_S = "perf/active_tokens_per_s"
GPU_S_ACTIVE = "perf/gpu_s_active"
GPU_S_TOTAL = "perf/gpu_s_total"  # worker wall seconds x processes
WALL_S = "perf/wall_s"
TOKENS_TOTAL = "perf/tokens_total"
CKPT_SAVE_S = "ckpt/save_s"
CKPT_BYTES = "ckpt/bytes"
FULL_STATE_BYTES = "ckpt/full_state_bytes"  # step: the update it was saved after
FULL_STATE_SAVE_S = "ckpt/full_state_save_s"
FULL_STATE_LOAD_S = "ckpt/full_state_load_s"  # step: the update a resumed run continued after
LOGICAL_BYTES_TOTAL = "comm/logical_bytes_total"
LOGICAL_BYTES_POST_WARMUP = "comm/logical_bytes_post_warmup"
FINAL_LOSS = "train/final_loss"
WORLD_SIZE = "train/world_size"  # processes
REPLICA_TENSORS = "train/replica_tensors_checked"  # every rank's weights equal to rank 0's, tensor by tensor

# An arm's phases, in seconds (rank 0): what the limits read instead of declared start-up figures.
PHASES = ("launch", "setup", "first_update", "updates", "replica_check", "checkpoint_write", "checkpoint_upload")
"""launch: from the launcher's start to the worker's first line (interpreter, torch); setup: the
process group, the model's init or load, tokenizer and documents; first_update: update 1 (with
compilation and graph capture); updates: every update (`perf/active_s`); replica_check: the
replicas compared; checkpoint_write: the final checkpoint to local disk; checkpoint_upload: its
transfer to the artifact store."""


def peak_reserved_gib(rank: int) -> str:
    """The rank's peak of PyTorch's reserved device memory over the arm, GiB (GPU arms)."""
    return f"gpu/rank{rank}/peak_reserved_gib"


def peak_allocated_gib(rank: int) -> str:
    return f"gpu/rank{rank}/peak_allocated_gib"


def phase_s(name: str) -> str:
    if name not in PHASES:
        raise KeyError(f"unknown phase {name!r}: one of {PHASES}")
    return f"phase/{name}_s"


def wire_tx_bytes(phase: str) -> str:
    """Wire bytes sent by all hosts in `phase` (startup, steps, checkpoint, total), or by the
    driver's host in `upload` (the checkpoint's transfer to the artifact store)."""
    return f"comm/wire_tx_bytes_{phase}"


def wire_rx_bytes(phase: str) -> str:
    return f"comm/wire_rx_bytes_{phase}"


def loopback_bytes(phase: str) -> str:
    return f"comm/loopback_bytes_{phase}"


def host_wire_tx_bytes(j: int, phase: str) -> str:
    return f"comm/host{j}/wire_tx_bytes_{phase}"


def host_wire_rx_bytes(j: int, phase: str) -> str:
    return f"comm/host{j}/wire_rx_bytes_{phase}"


def host_loopback_bytes(j: int, phase: str) -> str:
    return f"comm/host{j}/loopback_bytes_{phase}"


def host_wire_tx_total(j: int) -> str:
    return host_wire_tx_bytes(j, "total")


def host_wire_rx_total(j: int) -> str:
    return host_wire_rx_bytes(j, "total")


def host_loopback_total(j: int) -> str:
    return host_loopback_bytes(j, "total")


WIRE_TX_BYTES_TOTAL = wire_tx_bytes("total")
WIRE_RX_BYTES_TOTAL = wire_rx_bytes("total")

# --- score step, one nested run per model ---
ACCURACY_OVERALL = "accuracy/overall"  # fraction of test cases
RETENTION_NLL_NATS = "retention/nll_nats"  # mean over probes of the per-token mean
SCORE_TEST_S = "score/test_s"
SCORE_RETENTION_S = "score/retention_s"
SCORE_LOAD_S = "score/load_s"  # the model loaded (and verified) onto the scoring device


def accuracy(family: str) -> str:
    return f"accuracy/{family}"


# --- prepare: the seed model (keys of the manifest's seed_model entry) ---
SEED_PROBE_NLL_UNTRAINED = "seed/probe_nll_untrained"  # nats per target token
SEED_PROBE_NLL_SEED = "seed/probe_nll_seed"
SEED_PRETRAIN_FINAL_LOSS = "seed/pretrain_final_loss"
SEED_PARAMETERS = "seed/parameters"
_SEED = {"probe_nll_untrained": SEED_PROBE_NLL_UNTRAINED, "probe_nll_seed": SEED_PROBE_NLL_SEED,
         "pretrain_final_loss": SEED_PRETRAIN_FINAL_LOSS, "parameters": SEED_PARAMETERS}


# --- analyze ---
def paired_mean(pair: str) -> str:
    """Mean paired change of `pair` (e.g. powersgd-seed), a fraction of test cases."""
    return f"paired/{pair}/mean"


def paired_lo(pair: str) -> str:
    return f"paired/{pair}/lo"


# --- the dicts the steps log ---
def step_metrics(values: Mapping) -> dict[str, float]:
    """One update's metrics: every `PER_UPDATE` entry computed from the loop's `values` (loss,
    grad_norm, lr, target_tokens, step_s, tokens, world, logical_bytes, and hosts: host id ->
    this update's wire deltas, metering), then each host's wire bytes in host id order."""
    out = {m.name: m.of(values) for m in PER_UPDATE}
    hosts = values["hosts"]
    for j, h in enumerate(sorted(hosts)):
        out[host_wire_tx(j)] = hosts[h]["wire_tx"]
        out[host_wire_rx(j)] = hosts[h]["wire_rx"]
    return out


def summary_metrics(*, active_s: float, tokens: int, world: int, wall_s: float, save_s: float,
                    ckpt_bytes: int, logical_bytes: int, logical_bytes_post_warmup: int,
                    final_loss: float, wire: dict[str, dict[str, dict]]) -> dict[str, float]:
    """A train run's summary; `wire` maps phase -> host id -> summed deltas. Host `j` is the
    j-th host id in sorted order, as in `step_metrics`."""
    out = {
        ACTIVE_S: active_s, ACTIVE_TOKENS_PER_S: tokens / active_s, GPU_S_ACTIVE: active_s * world,
        GPU_S_TOTAL: wall_s * world, WALL_S: wall_s, TOKENS_TOTAL: tokens,
        CKPT_SAVE_S: save_s, CKPT_BYTES: ckpt_bytes,
        LOGICAL_BYTES_TOTAL: logical_bytes, LOGICAL_BYTES_POST_WARMUP: logical_bytes_post_warmup,
        FINAL_LOSS: final_loss, WORLD_SIZE: world,
    }
    order = sorted({h for hosts in wire.values() for h in hosts})
    for phase, hosts in wire.items():
        for j, h in enumerate(order):
            d = hosts.get(h, {"wire_tx": 0, "wire_rx": 0, "lo_tx": 0})
            out[host_wire_tx_bytes(j, phase)] = d["wire_tx"]
            out[host_wire_rx_bytes(j, phase)] = d["wire_rx"]
            out[host_loopback_bytes(j, phase)] = d["lo_tx"]
        out[wire_tx_bytes(phase)] = sum(d["wire_tx"] for d in hosts.values())
        out[wire_rx_bytes(phase)] = sum(d["wire_rx"] for d in hosts.values())
        out[loopback_bytes(phase)] = sum(d["lo_tx"] for d in hosts.values())
    return out


def score_metrics(test_rows: list[dict], retention_rows: list[dict]) -> dict[str, float]:
    """Accuracy by family and overall, mean retention NLL, from the per-case rows."""
    out = {}
    for f in sorted({r["family"] for r in test_rows}):
        sel = [r["correct"] for r in test_rows if r["family"] == f]
        out[accuracy(f)] = sum(sel) / len(sel)
    out[ACCURACY_OVERALL] = sum(r["correct"] for r in test_rows) / len(test_rows)
    out[RETENTION_NLL_NATS] = sum(r["nll_nats"] for r in retention_rows) / len(retention_rows)
    return out


def seed_metrics(seed_info: dict) -> dict[str, float]:
    """The seed model's figures that prepare measured (the tiny profile's pre-training)."""
    return {name: seed_info[k] for k, name in _SEED.items() if k in seed_info}


def paired_metrics(v: dict) -> dict[str, float]:
    """Mean and lower bound of every decided paired change in a verdicts dict."""
    out = {}
    for k in v["pairs"]:
        if v[k]["mean"] is not None:
            out[paired_mean(k)] = v[k]["mean"]
            out[paired_lo(k)] = v[k]["lo"]
    return out


# --- benchmarks/gpu_path.py: one MLflow run per benchmark call ---
BENCH_MATMUL_TFLOPS = "perf/bench_bf16_matmul_tflops"  # the bf16 matrix rate measured in the same call
BENCH_FIGURES = ("step_s", "tokens_per_s", "mfu", "peak_gib", "peak_reserved_gib", "extra_over_dense_s",
                 "compiles_after_3", "startup_s")


def bench(config: str, figure: str) -> str:
    """One figure (of BENCH_FIGURES) of one benchmarked configuration, e.g. perf/bench/single/step_s."""
    if figure not in BENCH_FIGURES:
        raise ValueError(f"unknown benchmark figure {figure!r}; known: {BENCH_FIGURES}")
    return f"perf/bench/{config}/{figure}"
