"""The study plan: every number of `STUDY.md`, in one frozen, typed object.

Nothing else in gradshare holds a study number. Each concern is one frozen
dataclass; the whole plan is `Plan`. Three profiles exist: `tiny` (the embedded
default, a CPU laptop in minutes), `smoke` (the whole study in about two minutes, the
test suite's) and `full` (the 1.7B study on GPUs).

    from gradshare.contract.plan import load_plan
    plan = load_plan("tiny", {"schedule.updates": "8", ...})
    plan.sha256()                    # plan_sha256, over canonical JSON

Overrides come as MLflow parameters named `concern.field` (strings, as MLflow
stores them); they are parsed to the field's type and the resulting plan is
validated: impossible combinations raise `PlanError` naming the fields.
"""
from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import typing
from dataclasses import dataclass, field

# The three kinds of arm the study knows; a plan runs some or all of them (`arms.names`).
ARM_KINDS = ("single", "dense", "powersgd")


class PlanError(ValueError):
    """A plan that cannot be run as written; the message names the fields."""


@dataclass(frozen=True)
class Arm:
    """One arm as the code asks about it (`Plan.arm(name)`): how many processes, whether they
    exchange gradients through DDP, and at which updates PowerSGD compresses. Code asks these
    questions instead of testing the arm's name."""
    name: str
    processes: int
    warmup_updates: int = 0
    """PowerSGD's first updates, exchanged as a plain all-reduce (0 for the other arms)."""

    @property
    def is_ddp(self) -> bool:
        """Its gradient goes through DDP (one exchange per update); `single` accumulates alone."""
        return self.name != "single"

    @property
    def has_powersgd(self) -> bool:
        """A PowerSGD state and communication hook sit on its DDP."""
        return self.name == "powersgd"

    def compresses(self, update: int) -> bool:
        """Whether update `update` (1-based) exchanges PowerSGD's P and Q instead of the gradient."""
        return self.has_powersgd and update > self.warmup_updates


@dataclass(frozen=True)
class StudyPlan:
    profile: str = "tiny"
    """`tiny` (CPU, minutes), `smoke` (CPU, about two minutes) or `full` (the 1.7B study on GPUs)."""
    seed: int = 20261202
    """The one screening seed: data generation, schedule order, model init, RNG."""


@dataclass(frozen=True)
class ArmsPlan:
    names: tuple[str, ...] = ("single", "dense", "powersgd")
    """The arms, in the order they run (never overlapping)."""
    candidate: str = "powersgd"
    """The arm the screens judge."""
    controls: tuple[str, ...] = ("single", "dense")
    """Arms the candidate must not be inferior to."""
    single_processes: int = 1
    """Processes (GPUs) of the `single` arm: gradient accumulation on one device."""
    dense_processes: int = 2
    """Processes (GPUs) of the `dense` arm: plain DDP all-reduce."""
    powersgd_processes: int = 2
    """Processes (GPUs) of the `powersgd` arm: DDP with the PowerSGD hook."""
    max_attempts: int = 1
    """Attempts an arm may make; 1: an arm that failed is never re-run. Every attempt is recorded."""
    expected_update_s: float = 2.5
    """Expected seconds per update of the slowest arm on the planned hardware: here the tiny dense
    arm across the emulated hosts, a 5.77 MB exchange over the 22 Mbit/s link (`LinkPlan`, 2.2 s
    with headers) plus one rank's compute (0.2 s), on a 2-core CPU."""
    startup_s: float = 180.0
    """Seconds allowed for an arm's start-up (model load, process group) and its checkpoint."""
    expected_startup_s: float = 30.0
    """Expected seconds of an arm besides its updates (start-up, checkpoint, upload): with
    `expected_update_s`, what the deadline and budget checks project before the first arm."""
    timeout_margin: float = 4.0
    """An arm is stopped as `timeout` after startup_s + updates x expected_update_s x this margin."""
    tracking_grace_s: float = 300.0
    """Seconds an arm trains on while the tracking server does not answer (its records wait on
    local disk, `gradshare.tracking.outbox`); past them it stops after a whole update, records kept."""
    stall_s: float = 30.0
    """A rank whose process has not run for this long (SIGSTOP, a frozen host) ends the arm, named
    (`gradshare.train.heartbeat`); its heartbeat thread writes every second."""
    hang_updates: float = 10.0
    """Every rank alive but none completing an update for this many expected updates
    (`expected_update_s`; the first also gets `expected_startup_s`) ends the arm as hung."""

    def hang_s(self) -> float:
        """Seconds without a completed update on any rank before the arm counts as hung: never
        shorter than `stall_s` (a plan that declares a fast update is not a hang at every pause)."""
        return max(self.hang_updates * self.expected_update_s, self.stall_s)

    def timeout_s(self, updates: int) -> float:
        """Wall-clock limit of one arm: the launcher's wait and every collective's timeout."""
        return self.startup_s + updates * self.expected_update_s * self.timeout_margin

    def processes(self, arm: str) -> int:
        return {"single": self.single_processes, "dense": self.dense_processes,
                "powersgd": self.powersgd_processes}[arm]


@dataclass(frozen=True)
class DataPlan:
    families: tuple[str, ...] = ("boolean_expressions", "multistep_arithmetic",
                                 "word_sorting", "dyck_languages")
    """Public BIG-Bench Hard task families, generated procedurally."""
    train_per_family: int = 768
    """Generated training tasks per family (4 x 768 = 3,072)."""
    test_per_family: int = 256
    """Final-test cases per family (4 x 256 = 1,024), disjoint from training."""
    replay_docs: int = 1024
    """Public conversation-replay documents in the training schedule."""
    retention_probes: int = 128
    """Conversations the seed model has seen; their NLL change is retention."""
    pretrain_docs: int = 1024
    """Tiny profile: conversations (besides the probes) the seed model is pre-trained on."""
    replay_source: str = "chitchat"
    """`chitchat` (the chitchat-dataset package), `file:/path.jsonl|.parquet`, or `datasets:NAME`."""
    max_doc_tokens: int = 128
    """Documents are truncated to this many tokens (prompt + target)."""


@dataclass(frozen=True)
class SchedulePlan:
    updates: int = 128
    """Optimizer updates; every final model is fixed at this step."""
    docs_per_update: int = 32
    """Documents in one global batch."""
    micro_batch_docs: int = 4
    """Documents per forward/backward on one rank, where `micro_batch_tokens` is 0."""
    micro_batch_tokens: int = 0
    """0: micro-batches of `micro_batch_docs` documents, each padded to its longest. > 0: a rank's
    documents are packed into rows of `data.max_doc_tokens` tokens (several documents per row,
    each attending only to itself, positions restarting at 0: the same function), and rows into
    micro-batches of at most this many tokens; row counts are padded to powers of two, so that
    compilation and CUDA graphs see a small fixed set of shapes (`gradshare.model.batching`)."""


@dataclass(frozen=True)
class ModelPlan:
    source: str = "tiny"
    """`tiny` (built from `config` and pre-trained by prepare), `hf:/local/dir`, or `random-qwen3-1.7b` (throughput only)."""
    config: str = "tiny_qwen3.json"
    """Qwen3-style config file in gradshare/model/configs for `tiny` and `random-*` sources."""
    vocab_size: int = 1024
    """Byte-level BPE vocabulary trained by prepare (tiny profile)."""
    pretrain_steps: int = 120
    """Deterministic pre-training updates of the tiny seed model."""
    pretrain_batch_docs: int = 16
    """Documents per pre-training update."""
    pretrain_lr: float = 3e-3
    """Pre-training AdamW learning rate."""


@dataclass(frozen=True)
class OptimPlan:
    lr: float = 1e-3
    """AdamW learning rate (constant after warm-up), identical in every arm."""
    warmup_updates: int = 8
    """Linear learning-rate warm-up, in updates."""
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    clip_norm: float = 1.0
    """Global gradient-norm clip, applied to the communicated (decompressed) gradient."""


@dataclass(frozen=True)
class PowerSGDPlan:
    rank: int = 32
    """Matrix approximation rank."""
    warmup_updates: int = 8
    """Plain all-reduce for updates 1..8; compression from update 9."""
    warm_start: bool = True
    """Reuse Q between updates."""
    error_feedback: str = "fp32-host"
    """`fp32-host`: FP32 error in (pinned) host memory, moved per bucket; `device`: upstream behaviour."""
    min_compression_rate: float = 2.0
    """Upstream rule: compress a matrix only if (rows+cols) x rank x rate < rows x cols."""
    bucket_cap_mb: int = 25
    """DDP bucket size."""
    hook: str = "upstream"
    """`upstream`: PyTorch's powerSGD_hook with the error staged around it; `fast`: gradshare's
    hook on the same PowerSGDState (one inline pass per bucket, orthogonalisation batched over
    same-shaped matrices, no device-wide sync, FP32 error moved on side streams)."""
    orthogonalization: str = "qr"
    """`qr` (upstream: Householder QR per matrix) or `cholesky-qr2` (batched Gram + Cholesky,
    twice; equals QR up to column signs for full-rank P, which P Q^T does not see). `fast` hook only."""
    staging_mb: int = 1024
    """`fast` hook: device memory the FP32 error may hold in flight to and from the host."""


@dataclass(frozen=True)
class HardwarePlan:
    device: str = "cpu"
    """`cpu` (gloo) or `cuda` (NCCL)."""
    precision: str = "fp32"
    """`fp32` or `bf16-autocast` (FP32 master weights)."""
    deterministic: bool = True
    """torch.use_deterministic_algorithms where supported."""
    compile: bool = False
    """torch.compile each decoder layer and the chunked loss (the same function; full profile)."""
    fused_adamw: bool = False
    """AdamW's fused CUDA kernel instead of the for-each one (full profile)."""
    gradient_as_bucket_view: bool = False
    """DDP gradients are views of its buckets (one copy of the gradient instead of two)."""
    loss_chunk_tokens: int = 0
    """Cross-entropy over the vocabulary in chunks of this many tokens, logits recomputed in
    backward; 0: all logits materialised at once (FP32, tokens x vocabulary)."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward (less memory, about 1/3 more compute)."""
    cuda_graphs: bool = False
    """Each micro-batch shape's forward and backward is captured once as a CUDA graph and replayed
    (the host launches one graph instead of thousands of kernels); the DDP arms then exchange in
    one pass of their own after the micro-batches. Needs `schedule.micro_batch_tokens` > 0 (a
    bounded set of shapes). On a CPU the same static-shape path runs without capture (what the
    CPU tests check)."""
    max_device_gib: float = 0.0
    """Cap of PyTorch's allocator per process, GiB (`torch.cuda.set_per_process_memory_fraction`);
    0: no cap. The full profile's 44 is an L40S's 48 GB less the CUDA context, so an arm that
    would not fit the study's hosts fails on a larger card too, naming the cap and the update."""
    threads_per_process: int = 1
    """CPU threads of every process of every arm (torch intra-op threads, OMP/MKL): the same in
    each arm, so that on CPU `single` is one device and a two-process arm two; 0: torch's and
    accelerate's defaults (a GPU run, where threads only feed the devices)."""
    rehearsal: str = ""
    """`one-gpu`: the study rehearsed on one GPU before any host is rented. The two-process arms
    start both processes on the one visible GPU, over gloo (NCCL refuses two ranks on one
    device), through the same `accelerate launch`; single runs as always. Speed and cost are
    then not the study's. "": the study itself."""
    sockets: str = "auto"
    """The arms' sockets between hosts, `TxS`: NCCL's socket transport with T threads of S sockets
    each (`NCCL_SOCKET_NTHREADS`, `NCCL_NSOCKS_PERTHREAD`; T x S <= 64), gloo with T x S devices
    on the link's interface. `auto`: the setting the study's preflight measured fastest
    (`gradshare preflight`), the libraries' own where none ran. A cloud caps each flow (AWS: 5 Gbit/s between
    instances outside a placement group): several sockets are several flows."""
    socket_ifname: str = ""
    """The network interface the arms' sockets use (`NCCL_SOCKET_IFNAME`, `GLOO_SOCKET_IFNAME`);
    "": the libraries' own choice, or the environment's."""


@dataclass(frozen=True)
class ScoringPlan:
    max_new_tokens: int = 24
    """Greedy generation budget per test case."""
    batch_size: int = 64
    """Cases per generation batch (left padding, KV cache)."""


@dataclass(frozen=True)
class ScreenPlan:
    z: float = 1.96
    """Declared normal multiplier for every interval."""
    task_gain_pp: float = 10.0
    """Quality 1: candidate minus seed, overall accuracy, at least this (percentage points)."""
    retention_upper_nats: float = 0.02
    """Quality 2: upper bound of the retention NLL change at most this."""
    noninferiority_pp: float = -3.0
    """Quality 3: lower bound of candidate minus each control at least this."""
    speed_ratio: float = 1.10
    """Speed: candidate active tokens/s at least this times the baseline arm's."""
    speed_baseline: str = "single"
    """The arm whose active throughput the speed screen compares the candidate with."""


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


@dataclass(frozen=True)
class Plan:
    study: StudyPlan = field(default_factory=StudyPlan)
    arms: ArmsPlan = field(default_factory=ArmsPlan)
    data: DataPlan = field(default_factory=DataPlan)
    schedule: SchedulePlan = field(default_factory=SchedulePlan)
    model: ModelPlan = field(default_factory=ModelPlan)
    optim: OptimPlan = field(default_factory=OptimPlan)
    powersgd: PowerSGDPlan = field(default_factory=PowerSGDPlan)
    hardware: HardwarePlan = field(default_factory=HardwarePlan)
    scoring: ScoringPlan = field(default_factory=ScoringPlan)
    screen: ScreenPlan = field(default_factory=ScreenPlan)
    infra: InfraPlan = field(default_factory=InfraPlan)
    link: LinkPlan = field(default_factory=LinkPlan)
    preflight: PreflightPlan = field(default_factory=PreflightPlan)

    # -- views ---------------------------------------------------------------
    def arm(self, name: str) -> Arm:
        """The arm `name` (one of ARM_KINDS) as this plan runs it."""
        if name not in ARM_KINDS:
            raise PlanError(f"arm {name!r} is not one of {', '.join(ARM_KINDS)}")
        return Arm(name, self.arms.processes(name), self.powersgd.warmup_updates if name == "powersgd" else 0)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def canonical_json(self) -> str:
        return canonical_json(self.to_dict())

    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def flat(self) -> dict[str, str]:
        """Every field as `concern.field` -> string, as MLflow parameters hold them."""
        out = {}
        for concern, values in self.to_dict().items():
            for name, value in values.items():
                out[f"{concern}.{name}"] = _to_param(value)
        return out

    @property
    def emulated(self) -> bool:
        """True where the arms run on CPUs: speed and dollars are then not the study's hosts'."""
        return self.hardware.device == "cpu"

    @property
    def rehearsal_note(self) -> str | None:
        """What runs, report and commitment say of a study rehearsed on one GPU, or None."""
        if self.hardware.rehearsal == "one-gpu":
            return "rehearsal on one GPU: speed and cost are not the study's"
        return None

    @property
    def train_docs(self) -> int:
        return len(self.data.families) * self.data.train_per_family + self.data.replay_docs

    @property
    def test_cases(self) -> int:
        return len(self.data.families) * self.data.test_per_family


# The full profile differs only where a 1.7B model on GPUs needs it to.
PROFILES: dict[str, dict[str, str]] = {
    "tiny": {},
    # The study's shape (four families, three arms, warm-up before compression, rank 32, global
    # normalisation) at the smallest counts that still exercise every step: 4 x 12 + 16 = 64
    # documents = 8 updates x 8, compression from update 3, a 512-token vocabulary. The whole
    # study in about two minutes on 2 cores; the test suite's small studies are this profile.
    "smoke": {
        "study.profile": "smoke",
        "data.train_per_family": "12", "data.test_per_family": "8", "data.replay_docs": "16",
        "data.retention_probes": "8", "data.pretrain_docs": "32", "schedule.updates": "8",
        "schedule.docs_per_update": "8", "schedule.micro_batch_docs": "2", "model.pretrain_steps": "12",
        "model.vocab_size": "512", "powersgd.warmup_updates": "2", "scoring.max_new_tokens": "8",
    },
    "full": {
        "study.profile": "full",
        "model.source": "random-qwen3-1.7b",
        "model.config": "qwen3_1p7b.json",
        "model.pretrain_steps": "0",
        "data.pretrain_docs": "0",
        "data.max_doc_tokens": "512",
        "optim.lr": "2e-5",
        "hardware.device": "cuda",
        "hardware.precision": "bf16-autocast",
        "hardware.deterministic": "false",
        "hardware.threads_per_process": "0",
        # An L40S update at 32 x 512 tokens plus a 6.9 GB cross-zone exchange is seconds, and
        # loading or initialising 1.7B parameters and writing 3.4 GB of weights is minutes.
        "arms.expected_update_s": "8",
        "arms.startup_s": "1200",
        "arms.expected_startup_s": "300",
        "scoring.batch_size": "128",
        # Where documents are not packed (micro_batch_tokens=0): 8 per micro-batch.
        "schedule.micro_batch_docs": "8",
        # The study's documents (median ~3,400 tokens per update: ~30-token tasks, conversations
        # up to 512) packed into rows of 512, at most 4 rows per micro-batch, each shape captured
        # as a CUDA graph: single 0.136 s/update on an H200 (0.512 s with 8 whole documents per
        # micro-batch, 0.168 s packed without graphs), 35.3 GiB reserved under the 44 GiB cap.
        # 4,096 tokens: 0.122 s but 42.1 GiB, no room for PowerSGD's arm (BENCHMARKS.md, 2026-12-04).
        "schedule.micro_batch_tokens": "2048",
        "hardware.cuda_graphs": "true",
        "hardware.max_device_gib": "44",
        # Speed levers measured in benchmarks/gpu_path.py (BENCHMARKS.md); each computes the
        # same function as the plain path, so the tiny profile keeps the plain one.
        # CholeskyQR2 and 2 GB of error staging measured slower than QR and 512 MB (2026-12-04).
        "hardware.compile": "true",
        "hardware.fused_adamw": "true",
        "hardware.gradient_as_bucket_view": "true",
        "hardware.loss_chunk_tokens": "2048",
        "powersgd.hook": "fast",
        "powersgd.bucket_cap_mb": "200",
        "powersgd.staging_mb": "512",
    },
}


def socket_counts(setting: str) -> tuple[int, int] | None:
    """`TxS` as (threads, sockets per thread), or None where it is not one NCCL accepts."""
    try:
        t, s = (int(x) for x in setting.lower().split("x"))
    except ValueError:
        return None
    return (t, s) if t >= 1 and s >= 1 and t * s <= 64 else None


def canonical_json(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _to_param(value) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _parse(key: str, raw, typ):
    if not isinstance(raw, str):
        return raw
    try:
        if typ is bool:
            if raw.lower() in ("true", "1", "yes"):
                return True
            if raw.lower() in ("false", "0", "no"):
                return False
            raise ValueError(raw)
        if typ is int:
            return int(raw)
        if typ is float:
            return float(raw)
        if typing.get_origin(typ) is tuple:
            return tuple(s.strip() for s in raw.split(",") if s.strip())
        return raw
    except ValueError:
        raise PlanError(f"plan parameter {key}={raw!r} is not a valid {getattr(typ, '__name__', typ)}") from None


def plan_keys() -> list[str]:
    return sorted(Plan().flat())


def load_plan(profile: str = "tiny", overrides: dict[str, str] | None = None) -> Plan:
    """The profile's plan with `overrides` (`concern.field` -> value) applied and validated."""
    if profile not in PROFILES:
        raise PlanError(f"unknown profile {profile!r}: choose one of {sorted(PROFILES)}")
    merged = {**PROFILES[profile], **(overrides or {})}
    return validate(_apply(Plan(), merged))


PLAN_FILE = "plan.json"
"""The plan as it crosses between steps and processes: the prepare run's artifact, and the
file the train driver hands its workers. Written by `plan_json` and read by `plan_from_json`
only, so every reader verifies the hash it carries."""


def plan_json(plan: Plan) -> str:
    """The plan's fields and its `plan_sha256`, as the text of `plan.json`."""
    return json.dumps(plan.to_dict() | {"plan_sha256": plan.sha256()}, indent=1, sort_keys=True) + "\n"


def plan_from_json(text: str, where: str = PLAN_FILE) -> Plan:
    """The plan of a `plan.json` text (`where` names it in the error), validated, after checking
    that its fields hash to the `plan_sha256` it carries: a changed byte is a PlanError."""
    raw = json.loads(text)
    registered = raw.pop("plan_sha256", None)
    actual = hashlib.sha256(canonical_json(raw).encode()).hexdigest()  # as Plan.sha256 hashes its fields
    if registered != actual:  # before validation: a changed file is named as changed, not as a bad plan
        raise PlanError(f"{where} does not hash to the plan_sha256 it carries ({str(registered)[:16]}…, its fields "
                        f"hash to {actual[:16]}…): it was changed after it was written")
    return plan_from_dict(raw)


def plan_from_dict(d: dict) -> Plan:
    """Rebuild a plan from `plan.json` (as logged by prepare); validated."""
    flat = {f"{c}.{k}": v for c, vals in d.items() for k, v in vals.items()}
    return validate(_apply(Plan(), {k: (tuple(v) if isinstance(v, list) else v) for k, v in flat.items()}))


def _apply(plan: Plan, overrides: dict) -> Plan:
    by_concern: dict[str, dict] = {}
    hints = {name: typing.get_type_hints(cls) for name, cls in typing.get_type_hints(Plan).items()}
    for key, raw in overrides.items():
        concern, _, name = key.partition(".")
        if concern not in hints or name not in hints[concern]:
            near = difflib.get_close_matches(key, plan_keys(), n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise PlanError(f"unknown plan parameter {key!r}; {hint}known: {', '.join(plan_keys())}")
        by_concern.setdefault(concern, {})[name] = _parse(key, raw, hints[concern][name])
    return dataclasses.replace(plan, **{
        c: dataclasses.replace(getattr(plan, c), **vals) for c, vals in by_concern.items()})


def validate(plan: Plan) -> Plan:
    """Refuse impossible combinations with a message that names them."""
    problems = []
    s, d, a, p = plan.schedule, plan.data, plan.arms, plan.powersgd
    if plan.study.profile not in PROFILES:
        problems.append(f"study.profile={plan.study.profile!r} is not one of {sorted(PROFILES)}")
    if s.updates < 1 or s.docs_per_update < 1 or s.micro_batch_docs < 1:
        problems.append("schedule.updates, schedule.docs_per_update and schedule.micro_batch_docs must be >= 1")
    elif s.updates * s.docs_per_update != plan.train_docs:
        problems.append(
            f"schedule.updates x schedule.docs_per_update = {s.updates} x {s.docs_per_update} = "
            f"{s.updates * s.docs_per_update}, but the training documents number "
            f"{len(d.families)} families x data.train_per_family {d.train_per_family} + "
            f"data.replay_docs {d.replay_docs} = {plan.train_docs}; each document is used exactly once")
    for arm in a.names:
        if arm not in ARM_KINDS:
            problems.append(f"arms.names holds unknown arm {arm!r}")
            continue
        world = a.processes(arm)
        if world < 1:
            problems.append(f"arms.{arm}_processes must be >= 1")
        elif s.docs_per_update >= 1 and s.micro_batch_docs >= 1 and \
                s.docs_per_update % (world * s.micro_batch_docs) != 0:
            problems.append(
                f"schedule.docs_per_update={s.docs_per_update} cannot be split over "
                f"arms.{arm}_processes={world} ranks in micro-batches of "
                f"schedule.micro_batch_docs={s.micro_batch_docs}: {s.docs_per_update} is not a "
                f"multiple of {world} x {s.micro_batch_docs}; choose a micro-batch that fits")
    if a.max_attempts < 1:
        problems.append("arms.max_attempts must be >= 1 (1: a failed arm is never re-run)")
    if a.expected_update_s <= 0 or a.startup_s <= 0 or a.timeout_margin < 1:
        problems.append("arms.expected_update_s and arms.startup_s must be > 0 and "
                        "arms.timeout_margin >= 1")
    for setting in (plan.hardware.sockets, *plan.preflight.sockets):
        if setting != "auto" and socket_counts(setting) is None:
            problems.append(f"socket setting {setting!r} (hardware.sockets, preflight.sockets) is not TxS with T, S >= 1 "
                            f"and T x S <= 64 (NCCL's limit), nor auto")
    if "auto" in plan.preflight.sockets or not plan.preflight.sockets:
        problems.append("preflight.sockets lists the settings to measure: TxS each, at least one")
    if plan.preflight.sustain_s <= 0 or plan.preflight.window_s <= 0 or plan.preflight.upload_mb < 0:
        problems.append("preflight.sustain_s and preflight.window_s must be > 0, preflight.upload_mb >= 0")
    if a.stall_s <= 0 or a.hang_updates <= 0:
        problems.append(f"arms.stall_s={a.stall_s:g} and arms.hang_updates={a.hang_updates:g} must be > 0 (the bounds "
                        f"within which a stopped or hung rank ends the arm)")
    if plan.screen.speed_baseline not in a.names:
        problems.append(f"screen.speed_baseline={plan.screen.speed_baseline!r} is not in arms.names")
    if a.candidate not in a.names:
        problems.append(f"arms.candidate={a.candidate!r} is not in arms.names")
    for c in a.controls:
        if c not in a.names:
            problems.append(f"arms.controls holds {c!r}, which is not in arms.names")
    if p.rank < 1:
        problems.append("powersgd.rank must be >= 1")
    if (p.warm_start or p.error_feedback != "none") and p.warmup_updates < 2:
        # Upstream: start_powerSGD_iter must be > 1 with error feedback or warm start, since
        # DDP rebuilds its buckets after the first exchange.
        problems.append("powersgd.warmup_updates must be >= 2 when warm start or error feedback is on")
    if p.warmup_updates >= s.updates:
        problems.append(f"powersgd.warmup_updates={p.warmup_updates} leaves no compressed update "
                        f"within schedule.updates={s.updates}")
    if p.error_feedback not in ("fp32-host", "device", "none"):
        problems.append(f"powersgd.error_feedback={p.error_feedback!r} is not fp32-host, device or none")
    if p.hook not in ("upstream", "fast"):
        problems.append(f"powersgd.hook={p.hook!r} is not upstream or fast")
    elif p.hook == "fast" and p.error_feedback != "fp32-host":
        problems.append(f"powersgd.hook=fast keeps the error on the host: it needs "
                        f"powersgd.error_feedback=fp32-host, not {p.error_feedback!r}")
    if p.orthogonalization not in ("qr", "cholesky-qr2"):
        problems.append(f"powersgd.orthogonalization={p.orthogonalization!r} is not qr or cholesky-qr2")
    elif p.orthogonalization != "qr" and p.hook != "fast":
        problems.append("powersgd.orthogonalization=cholesky-qr2 needs powersgd.hook=fast")
    if p.staging_mb < 1 or p.bucket_cap_mb < 1:
        problems.append("powersgd.staging_mb and powersgd.bucket_cap_mb must be >= 1")
    if plan.hardware.threads_per_process < 0:
        problems.append("hardware.threads_per_process must be >= 0 (0: the launcher's and torch's defaults)")
    if s.micro_batch_tokens < 0:
        problems.append("schedule.micro_batch_tokens must be >= 0 (0: micro-batches of schedule.micro_batch_docs)")
    elif 0 < s.micro_batch_tokens < d.max_doc_tokens:
        problems.append(f"schedule.micro_batch_tokens={s.micro_batch_tokens} holds no row of "
                        f"data.max_doc_tokens={d.max_doc_tokens}: choose at least that many")
    if plan.hardware.cuda_graphs and s.micro_batch_tokens == 0:
        problems.append("hardware.cuda_graphs needs schedule.micro_batch_tokens > 0: a graph replays one "
                        "fixed shape, and only packed micro-batches come in a bounded set of shapes")
    if plan.hardware.max_device_gib < 0:
        problems.append("hardware.max_device_gib must be >= 0 (0: no cap)")
    if plan.hardware.loss_chunk_tokens < 0:
        problems.append("hardware.loss_chunk_tokens must be >= 0 (0: no chunking)")
    if (plan.hardware.compile or plan.hardware.fused_adamw) and plan.hardware.device != "cuda":
        problems.append("hardware.compile and hardware.fused_adamw are GPU levers: they need hardware.device=cuda")
    if plan.hardware.rehearsal not in ("", "one-gpu"):
        problems.append(f"hardware.rehearsal={plan.hardware.rehearsal!r} is not one-gpu (or empty: the study itself)")
    elif plan.hardware.rehearsal and plan.hardware.device != "cuda":
        problems.append("hardware.rehearsal=one-gpu puts both processes of a two-process arm on one CUDA GPU: "
                        "it needs hardware.device=cuda (on a CPU the two-process arms already run as two "
                        "processes, over loopback or two emulated hosts)")
    if plan.hardware.device not in ("cpu", "cuda"):
        problems.append(f"hardware.device={plan.hardware.device!r} is not cpu or cuda")
    if plan.hardware.precision not in ("fp32", "bf16-autocast"):
        problems.append(f"hardware.precision={plan.hardware.precision!r} is not fp32 or bf16-autocast")
    if plan.hardware.precision == "bf16-autocast" and plan.hardware.device != "cuda":
        problems.append("hardware.precision=bf16-autocast needs hardware.device=cuda")
    for name in ("train_per_family", "test_per_family", "retention_probes"):
        if getattr(d, name) < 1:
            problems.append(f"data.{name} must be >= 1")
    if plan.model.source == "tiny" and plan.model.pretrain_steps < 1:
        problems.append("model.source=tiny needs model.pretrain_steps >= 1 so that the probes are exposed")
    if len(plan.infra.zones) != len(plan.infra.hosts):
        problems.append("infra.zones must name one zone per host in infra.hosts")
    if plan.link.rate_mbit <= 0:
        problems.append("link.rate_mbit must be > 0")
    if plan.screen.z <= 0:
        problems.append("screen.z must be > 0")
    if problems:
        raise PlanError("impossible plan:\n  - " + "\n  - ".join(problems))
    return plan
