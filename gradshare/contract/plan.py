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

from gradshare.contract.arms_plan import Arm, ArmsPlan
from gradshare.contract.errors import PlanError
from gradshare.contract.hosts_plan import InfraPlan, LinkPlan, PreflightPlan, socket_counts
from gradshare.contract.profiles import PROFILES
from gradshare.kinds import table
from gradshare.kinds.powersgd import PowerSGDPlan  # the powersgd kind's own section of the plan


@dataclass(frozen=True)
class StudyPlan:
    profile: str = "tiny"
    """`tiny` (CPU, minutes), `smoke` (CPU, about two minutes) or `full` (the 1.7B study on GPUs)."""
    seed: int = 20261202
    """The one screening seed: data generation, schedule order, model init, RNG."""

    def problems(self, plan: "Plan") -> list[str]:
        return [] if self.profile in PROFILES else [f"study.profile={self.profile!r} is not one of {sorted(PROFILES)}"]


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

    def problems(self, plan: "Plan") -> list[str]:
        return [f"data.{name} must be >= 1" for name in ("train_per_family", "test_per_family", "retention_probes")
                if getattr(self, name) < 1]


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

    def problems(self, plan: "Plan") -> list[str]:
        out, d = [], plan.data
        if self.updates < 1 or self.docs_per_update < 1 or self.micro_batch_docs < 1:
            out.append("schedule.updates, schedule.docs_per_update and schedule.micro_batch_docs must be >= 1")
        elif self.updates * self.docs_per_update != plan.train_docs:
            out.append(f"schedule.updates x schedule.docs_per_update = {self.updates} x {self.docs_per_update} = "
                       f"{self.updates * self.docs_per_update}, but the training documents number "
                       f"{len(d.families)} families x data.train_per_family {d.train_per_family} + "
                       f"data.replay_docs {d.replay_docs} = {plan.train_docs}; each document is used exactly once")
        if self.micro_batch_tokens < 0:
            out.append("schedule.micro_batch_tokens must be >= 0 (0: micro-batches of schedule.micro_batch_docs)")
        elif 0 < self.micro_batch_tokens < d.max_doc_tokens:
            out.append(f"schedule.micro_batch_tokens={self.micro_batch_tokens} holds no row of "
                       f"data.max_doc_tokens={d.max_doc_tokens}: choose at least that many")
        return out


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

    def problems(self, plan: "Plan") -> list[str]:
        if self.source == "tiny" and self.pretrain_steps < 1:
            return ["model.source=tiny needs model.pretrain_steps >= 1 so that the probes are exposed"]
        return []


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

    def problems(self, plan: "Plan") -> list[str]:
        return []  # every value of each field can be run


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

    def problems(self, plan: "Plan") -> list[str]:
        out, cuda = [], self.device == "cuda"
        if self.sockets != "auto" and socket_counts(self.sockets) is None:
            out.append(f"hardware.sockets={self.sockets!r} is not TxS with T, S >= 1 and T x S <= 64 (NCCL's "
                       f"limit), nor auto")
        if self.threads_per_process < 0:
            out.append("hardware.threads_per_process must be >= 0 (0: the launcher's and torch's defaults)")
        if self.cuda_graphs and plan.schedule.micro_batch_tokens == 0:
            out.append("hardware.cuda_graphs needs schedule.micro_batch_tokens > 0: a graph replays one "
                       "fixed shape, and only packed micro-batches come in a bounded set of shapes")
        if self.max_device_gib < 0:
            out.append("hardware.max_device_gib must be >= 0 (0: no cap)")
        if self.loss_chunk_tokens < 0:
            out.append("hardware.loss_chunk_tokens must be >= 0 (0: no chunking)")
        if (self.compile or self.fused_adamw) and not cuda:
            out.append("hardware.compile and hardware.fused_adamw are GPU levers: they need hardware.device=cuda")
        if self.rehearsal not in ("", "one-gpu"):
            out.append(f"hardware.rehearsal={self.rehearsal!r} is not one-gpu (or empty: the study itself)")
        elif self.rehearsal and not cuda:
            out.append("hardware.rehearsal=one-gpu puts both processes of a two-process arm on one CUDA GPU: "
                       "it needs hardware.device=cuda (on a CPU the two-process arms already run as two "
                       "processes, over loopback or two emulated hosts)")
        if self.device not in ("cpu", "cuda"):
            out.append(f"hardware.device={self.device!r} is not cpu or cuda")
        if self.precision not in ("fp32", "bf16-autocast"):
            out.append(f"hardware.precision={self.precision!r} is not fp32 or bf16-autocast")
        if self.precision == "bf16-autocast" and not cuda:
            out.append("hardware.precision=bf16-autocast needs hardware.device=cuda")
        return out


@dataclass(frozen=True)
class ScoringPlan:
    max_new_tokens: int = 24
    """Greedy generation budget per test case."""
    batch_size: int = 64
    """Cases per generation batch (left padding, KV cache)."""

    def problems(self, plan: "Plan") -> list[str]:
        return []  # every value of each field can be run


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

    def problems(self, plan: "Plan") -> list[str]:
        out = [] if self.speed_baseline in plan.arms.names else [
            f"screen.speed_baseline={self.speed_baseline!r} is not an arm of arms.rows ({', '.join(plan.arms.names)})"]
        return out + (["screen.z must be > 0"] if self.z <= 0 else [])


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
        """The arm `name` as this plan runs it: its row of `arms.rows`, its kind's settings filled
        in from the kind's section (`powersgd`) where the row sets none."""
        row = self.arms.row(name)
        return Arm(row.name, row.kind, row.processes, **table.of(row.kind).settings(dict(row.options), self))

    def arm_list(self) -> list[Arm]:
        """Every arm of the plan, in the order they run."""
        return [self.arm(name) for name in self.arms.names]

    def one_process_arms(self) -> list[str]:
        """The arms that train on one device alone (kind `single`), in running order: the ones whose
        update is one device's whole update, the reference the measured machine and the loss gap use."""
        return [a.name for a in self.arm_list() if not a.is_ddp]

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
    """Refuse impossible combinations with a message that names them: each concern's `problems`,
    every one listed (a user fixes a plan once, not once per message)."""
    problems = [line for f in dataclasses.fields(plan) for line in getattr(plan, f.name).problems(plan)]
    if problems:
        raise PlanError("impossible plan:\n  - " + "\n  - ".join(problems))
    return plan
