"""The plan's arms (`gradshare.contract.plan` composes them): one row each in `arms.rows`, read as
an `Arm` whose kind (`Arm.method`, from `gradshare.kinds.table`) code asks instead of testing its
name.

    plan.arm("powersgd8")   # Arm(name='powersgd8', kind='powersgd', processes=2, rank=8, warmup_updates=8)
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from gradshare.contract.errors import PlanError
from gradshare.kinds import table
from gradshare.kinds.base import ArmKind, UnknownKind


@dataclass(frozen=True)
class Arm:
    """One arm as the code asks about it (`Plan.arm(name)`, from its row of `arms.rows`): its kind,
    how many processes, and the kind's settings. Code asks its kind (`method`) instead of
    testing the arm's or the kind's name. An unknown kind is refused here, by name."""
    name: str
    kind: str
    processes: int
    rank: int = 0
    """A compressing kind's matrix approximation rank (PowerSGD's; 0 where the kind has none)."""
    warmup_updates: int = 0
    """The first updates, exchanged as a plain all-reduce before the kind compresses (0: none)."""

    def __post_init__(self):
        table.of(self.kind)  # UnknownKind, naming the known ones: never taken for another kind

    @property
    def method(self) -> ArmKind:
        """The arm's kind (`gradshare.kinds.base.ArmKind`): what it exchanges, and how."""
        return table.of(self.kind)

    @property
    def is_ddp(self) -> bool:
        """Its gradient goes through DDP (one exchange per update); else one process accumulates alone."""
        return self.method.uses_ddp

    def compresses(self, update: int) -> bool:
        """Whether update `update` (1-based) sends the kind's compressed payload, not the gradient."""
        return self.method.compresses(self, update)


@dataclass(frozen=True)
class ArmRow:
    """One row of `arms.rows` as written: `name:kind:processes[:rank=R][:warmup=W]`."""
    name: str
    kind: str
    processes: int
    options: tuple[tuple[str, int], ...]

    @classmethod
    def parse(cls, row: str) -> "ArmRow":
        """The row's fields, or a PlanError saying what is wrong with it."""
        fields = row.split(":")
        if len(fields) < 3:
            raise PlanError(f"arms.rows entry {row!r} is not name:kind:processes[:rank=R][:warmup=W]")
        name, kind, processes, *opts = (f.strip() for f in fields)
        if not name or not all(c.isalnum() or c in "-_" for c in name):
            raise PlanError(f"arms.rows entry {row!r}: the name {name!r} must be letters, digits, - or _ "
                            f"(it names runs, files and tags)")
        try:
            method = table.of(kind)
        except UnknownKind as exc:
            raise PlanError(f"arms.rows entry {row!r}: {exc}") from None
        options = []
        for opt in opts:
            key, eq, value = opt.partition("=")
            if not eq or key not in method.options or not value.strip().lstrip("-").isdigit():
                takes = ", ".join(k + "=N" for k in method.options) or "none"
                raise PlanError(f"arms.rows entry {row!r}: {opt!r} is not a setting of a {kind} arm "
                                f"(its settings: {takes})")
            options.append((key, int(value)))
        if not processes.lstrip("-").isdigit():
            raise PlanError(f"arms.rows entry {row!r}: processes {processes!r} is not a whole number")
        return cls(name, kind, int(processes), tuple(options))


@dataclass(frozen=True)
class ArmsPlan:
    rows: tuple[str, ...] = ("single:single:1", "dense:dense:2", "powersgd:powersgd:2")
    """The arms, one row each, in the order they run (never overlapping):
    `name:kind:processes`, the kind one of `gradshare.kinds.table`; a row may add its kind's own
    settings (a `powersgd` row `:rank=R` and `:warmup=W`, default `powersgd.rank`, `powersgd.warmup_updates`).
    A fourth arm, PowerSGD at rank 8: `...,powersgd8:powersgd:2:rank=8`."""
    candidate: str = "powersgd"
    """The arm the screens judge."""
    controls: tuple[str, ...] = ("single", "dense")
    """Arms the candidate must not be inferior to."""
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

    link_silence_s: float = 120.0
    """A two-host arm whose peer host sends nothing for this long while data waits for it, or while
    the ranks wait on it and it answers no connection (a link down or partitioned;
    `gradshare.hosts.silence`) ends, "no traffic from host N"; a link that
    returns sooner lets the arm go on, and the update bound counts again from its return. TCP
    retries with backoff: a link down for 30 s is heard again up to ~30 s after it returns."""

    def hang_s(self) -> float:
        """Seconds without a completed update on any rank before the arm counts as hung: never
        shorter than `stall_s` (a plan that declares a fast update is not a hang at every pause)."""
        return max(self.hang_updates * self.expected_update_s, self.stall_s)

    def timeout_s(self, updates: int) -> float:
        """Wall-clock limit of one arm: the launcher's wait and every collective's timeout."""
        return self.startup_s + updates * self.expected_update_s * self.timeout_margin

    def parsed(self) -> tuple[ArmRow, ...]:
        """Every row's fields (a PlanError for the first row that cannot be read)."""
        return _parsed(self.rows)

    @property
    def names(self) -> tuple[str, ...]:
        """The arms' names, in the order they run."""
        return tuple(row.split(":", 1)[0].strip() for row in self.rows)

    def row(self, arm: str) -> ArmRow:
        """The row of the arm named `arm`; a PlanError naming the plan's arms where none is."""
        for row in self.parsed():
            if row.name == arm:
                return row
        raise PlanError(f"arm {arm!r} is not in the plan's arms.rows ({', '.join(self.names)})")

    def processes(self, arm: str) -> int:
        return self.row(arm).processes

    def problems(self, plan) -> list[str]:
        out, s = [], plan.schedule
        try:
            rows = self.parsed()
        except PlanError as e:
            return [str(e)]
        if not rows:
            out.append("arms.rows holds no arm")
        if len(set(self.names)) != len(self.names):
            out.append(f"arms.rows names an arm twice: {', '.join(self.names)}")
        for row in rows:
            world, opts = row.processes, dict(row.options)
            kind = table.of(row.kind)
            if world < 1:
                out.append(f"arms.rows: {row.name} has {world} processes; an arm needs >= 1")
            elif kind.processes_problem(row.name, world):
                out.append(kind.processes_problem(row.name, world))
            elif s.docs_per_update >= 1 and s.micro_batch_docs >= 1 and \
                    s.docs_per_update % (world * s.micro_batch_docs) != 0:
                out.append(f"schedule.docs_per_update={s.docs_per_update} cannot be split over "
                           f"{row.name}'s {world} processes (arms.rows) in micro-batches of "
                           f"schedule.micro_batch_docs={s.micro_batch_docs}: {s.docs_per_update} is not a "
                           f"multiple of {world} x {s.micro_batch_docs}; choose a micro-batch that fits")
            out += kind.option_problems(row.name, opts, plan)
        if self.max_attempts < 1:
            out.append("arms.max_attempts must be >= 1 (1: a failed arm is never re-run)")
        if self.expected_update_s <= 0 or self.startup_s <= 0 or self.timeout_margin < 1:
            out.append("arms.expected_update_s and arms.startup_s must be > 0 and arms.timeout_margin >= 1")
        if self.stall_s <= 0 or self.hang_updates <= 0:
            out.append(f"arms.stall_s={self.stall_s:g} and arms.hang_updates={self.hang_updates:g} must be > 0 "
                       f"(the bounds within which a stopped or hung rank ends the arm)")
        if not self.link_silence_s > 0:
            out.append(f"arms.link_silence_s={self.link_silence_s:g} must be > 0 (how long a two-host arm's "
                       f"link may be silent before the arm ends)")
        if self.candidate not in self.names:
            out.append(f"arms.candidate={self.candidate!r} is not an arm of arms.rows ({', '.join(self.names)})")
        out += [f"arms.controls holds {c!r}, which is not an arm of arms.rows ({', '.join(self.names)})"
                for c in self.controls if c not in self.names]
        return out


@functools.lru_cache(maxsize=64)
def _parsed(rows: tuple[str, ...]) -> tuple[ArmRow, ...]:
    """The rows parsed once per distinct `arms.rows`: `Plan.arm` is asked per update in the
    projection's solvers (tens of thousands of times), where re-parsing was most of their time."""
    return tuple(ArmRow.parse(row) for row in rows)

