"""What an arm kind is: the one interface every kind of arm answers (`ArmKind`), and the live hook
an arm's DDP carries while it trains (`ExchangeHook`).

A kind is the whole of one way to exchange the gradient: its row options and their checks, its
hook's set-up, save and restore, its bytes per update, its part of an update's compute cost, and
its words in STUDY.md and the report. Code outside `gradshare.kinds` asks an arm's kind
(`Plan.arm(name).method`) and never tests a kind's name. The kinds live in `gradshare.kinds.table`.

Kinds sit on the lowest floor: the plan composes them, and everything above asks them. So they
import nothing else of gradshare, take the plan as it is passed (`plan.powersgd`,
`plan.schedule`), and load torch only inside the methods a training process calls.
"""
from __future__ import annotations

GRADIENT_BYTES = 4
"""Bytes of one gradient element: every arm's gradient is FP32 (and PowerSGD's P and Q are)."""


class UnknownKind(ValueError):
    """A kind the table does not hold; its message names the known ones."""


def gradient_elements(shapes) -> int:
    """Elements of the whole gradient of a model of `shapes` (parameter shapes)."""
    total = 0
    for shape in shapes:
        numel = 1
        for size in shape:
            numel *= size
        total += numel
    return total


class ExchangeHook:
    """What one training process's DDP carries for its kind's exchange, made by `ArmKind.attach`.

    This base is DDP's own all-reduce: nothing to register, no state to keep. A kind with a
    communication hook subclasses it. The loop calls, in this order: `register` once DDP's buckets
    are final, `before_micro_batches` and `between_micro_batches` in every update (bytes the hook
    moved beside the micro-batches: a host-resident error sent up), `saved` at a full-state save
    and `restore` at a resume (before `register`), and `passes` at the end."""

    def register(self) -> None:
        """Put the hook on DDP (DDP's default all-reduce: nothing)."""

    def saved(self) -> dict | None:
        """The hook's state, picklable, for a full state (None: it keeps none)."""
        return None

    def restore(self, saved: dict | None, device) -> None:
        """Put a state that `saved` returned back into this fresh hook (before `register`)."""

    def before_micro_batches(self) -> int:
        """At the start of an update: bytes the hook sends ahead of its exchange."""
        return 0

    def between_micro_batches(self) -> int:
        """After each micro-batch but the last: bytes the hook sends beside them."""
        return 0

    def passes(self) -> int | None:
        """Exchanges the hook counted (one per update); None where it counts none."""
        return None


class ArmKind:
    """One kind of arm. Subclasses set the attributes and override what differs; this base is a
    DDP arm whose one exchange per update is a plain FP32 all-reduce of the whole gradient."""

    name: str = ""
    """The kind as written in a row of `arms.rows` (`name:kind:processes`)."""
    uses_ddp: bool = True
    """Its processes exchange gradients through DDP, one exchange per update; False: one process
    that accumulates its micro-batches alone."""
    compresses_gradient: bool = False
    """Its exchange sends less than the FP32 gradient (plots draw it as a compressed arm)."""
    options: dict[str, str] = {}
    """Row options (`:key=N`) it takes, each with the plan field it defaults to."""
    words: str = ""
    """Its gradient exchange in a few words (STUDY.md's arms table, the report)."""

    # -- the plan ----------------------------------------------------------
    def settings(self, options: dict[str, int], plan) -> dict[str, int]:
        """The `Arm` fields (`rank`, `warmup_updates`) of a row with these options under `plan`."""
        return {}

    def processes_problem(self, name: str, processes: int) -> str | None:
        """What is wrong with arm `name` running on `processes` (>= 1) processes; None: nothing."""
        return None

    def option_problems(self, name: str, options: dict[str, int], plan) -> list[str]:
        """What is wrong with the settings of arm `name`'s row, under `plan` (empty: nothing)."""
        return []

    def describe(self, arm) -> str:
        """Its gradient exchange, for STUDY.md and the report."""
        return self.words

    def run_params(self, arm) -> dict:
        """The arm's own settings, logged as parameters of its train runs."""
        return {}

    # -- an update ---------------------------------------------------------
    def compresses(self, arm, update: int) -> bool:
        """Whether update `update` (1-based) sends the kind's compressed payload rather than the
        plain gradient (a warm-up of plain all-reduces before it, where the kind has one)."""
        return False

    def payload(self, arm, plan, shapes) -> tuple[int, int]:
        """One rank's logical bytes per update, (plain, compressed): what it hands to all-reduce in
        an update that does not compress and in one that does (`compresses`)."""
        dense = gradient_elements(shapes) * GRADIENT_BYTES if self.uses_ddp else 0
        return dense, dense

    def cost_parts(self, cost, arm, plan, padded_tokens: float, micro_batches: float,
                   update: int | None) -> dict[str, float]:
        """The kind's seconds on top of an update's compute (`gradshare.cost.gpu_cost.Calibration`'s
        matrix, micro-batch and fixed parts): DDP's bucketing and all-reduce bookkeeping. `update`
        None: a compressed update, where the kind compresses."""
        return {"dense_extra": cost.dense_extra_s} if self.uses_ddp else {}

    def cost_details(self, cost, arm, plan, padded_tokens: float, micro_batches: float) -> dict | None:
        """Figures of its cost the projection shows beside the parts (None: none)."""
        return None

    def link_round_s(self, arm, update: int, dense_round_s: float, compressed_round_s: float | None) -> float:
        """Seconds of its exchange at `update` on the measured link, from the preflight's round of
        the dense buckets and of the compressed buffers (`probe_buffers`)."""
        plain, packed = self._bytes_ratio()
        return dense_round_s * (packed if self.compresses(arm, update) else plain)

    def _bytes_ratio(self) -> tuple[float, float]:
        """Its (plain, compressed) payload over the FP32 gradient's, where that ratio is fixed."""
        return 1.0, 1.0

    def probe_buffers(self, arm, plan, buckets: list[list[tuple[int, ...]]]) -> list[int] | None:
        """Bytes of each all-reduce of a compressed update, bucket by bucket (DDP's `buckets`, lists
        of parameter shapes), for the preflight to time; None: it sends the dense buckets."""
        return None

    # -- a training process ------------------------------------------------
    def attach(self, ddp, arm, plan, device, fresh: bool) -> ExchangeHook:
        """The hook for `ddp` (a DDP arm's model), not yet registered. `fresh`: a run from the
        start (a resumed one restores the saved state first)."""
        return ExchangeHook()
