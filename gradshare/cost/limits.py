"""The study's deadline and budget, enforced: before an arm starts and at every update.

    known = study_figures.read(study, prep, plan)  # driver: the study's measured figures, then
    limits = arm_limits(plan, arm, known)         # ... refuses (`deadline: ...`/`budget: ...`)
    limits.write(workdir)                         # ... and hands the figures to the workers
    limits = Limits.read(workdir)                 # worker, rank 0, after each update:
    stop = limits.check(update, now, next_update_s, cross_zone_bytes)   # None or (kind, reason)

The study's clock starts when prepare starts (`study_start_epoch_s`, a parameter of the
prepare run, read by `gradshare.tracking.figures`); its deadline is `infra.deadline_hours`
later. Spend is what the arms' hosts cost: each train attempt's hosts x its wall seconds x the
host price, plus the cross-zone bytes its hosts measured (sent and received, each direction
billed) x `infra.cross_zone_usd_per_gb`. "Faster execution with more total GPU time is not a cost
reduction" (the plan): spend counts every second a host is held, start-up and checkpoint
included, not only the active updates.

Before an arm, its duration is projected from the measured rate of a finished arm with the
same number of processes (its median seconds per update and its start-up plus checkpoint
seconds), else from the plan (`arms.expected_update_s`, `arms.expected_startup_s`); an arm
whose projected end passes the deadline, or whose projected cost passes the bound, is
refused with the figures. During the arm, after every update, rank 0 checks whether the
next update (as long as the slowest so far) would end past the deadline or push the
spend past the bound; if so every rank stops after the whole update it finished, and the
run ends FAILED with reason `deadline: ...` or `budget: ...`.
"""
from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from gradshare.contract import metrics as M
from gradshare.contract.errors import Refusal
from gradshare.contract.tags import ARM
from gradshare.cost import measured
from gradshare.cost.accounting import host_price
from gradshare.cost.volume import GB, arm_cross_zone_bytes, crosses_zones, exchange_bytes
from gradshare.model.source import parameter_shapes

FILE = "limits.json"


def _utc(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True)
class Limits:
    start_epoch: float
    deadline_epoch: float
    budget_usd: float
    spent_before_usd: float
    """What earlier attempts of every arm cost."""
    usd_per_s: float
    """This arm's hosts x price per host-hour / 3600."""
    cross_usd_per_byte: float
    """0 where this arm's hosts share a zone."""
    arm_start_epoch: float
    updates: int

    # -- during an arm -----------------------------------------------------------------
    def spend(self, now: float, cross_bytes: float) -> float:
        # never below what was spent before: a clock read earlier than the arm's start (stepped
        # back mid-arm; a step's start refuses one, `tracking.clock`) bills no negative seconds
        return (self.spent_before_usd + max(now - self.arm_start_epoch, 0.0) * self.usd_per_s
                + cross_bytes * self.cross_usd_per_byte)

    def check(self, update: int, now: float, next_s: float, cross_bytes: float,
              next_cross_bytes: float = 0.0) -> tuple[str, str] | None:
        """Whether to stop after `update`: ("deadline"|"budget", reason) or None."""
        if update >= self.updates:
            return None  # the last update is done: nothing more to start
        end = now + next_s
        left = f"stopped after update {update} of {self.updates}"
        if end > self.deadline_epoch:
            return "deadline", (
                f"deadline: the next update ({next_s:.1f} s, the slowest so far) would end at {_utc(end)}, "
                f"past the study's deadline {_utc(self.deadline_epoch)} (start {_utc(self.start_epoch)} + "
                f"{(self.deadline_epoch - self.start_epoch) / 3600:g} h); {left}")
        now_usd = self.spend(now, cross_bytes)
        next_usd = self.spend(end, cross_bytes + next_cross_bytes)
        if next_usd > self.budget_usd:
            return "budget", (
                f"budget: spend so far ${now_usd:.4f} (earlier attempts ${self.spent_before_usd:.4f}, this "
                f"arm's hosts ${max(now - self.arm_start_epoch, 0.0) * self.usd_per_s:.4f}, its cross-zone "
                f"{cross_bytes / GB:.3f} GB ${cross_bytes * self.cross_usd_per_byte:.4f}); with the next "
                f"update ${next_usd:.4f}, past the ${self.budget_usd:g} bound; {left}")
        return None

    def step_metrics(self, now: float, cross_bytes: float) -> dict:
        return {M.SPEND_USD: self.spend(now, cross_bytes), M.STUDY_HOURS: max(now - self.start_epoch, 0.0) / 3600}

    # -- hand-over from the driver to the workers ----------------------------------------
    def write(self, workdir: Path) -> None:
        (Path(workdir) / FILE).write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, workdir: Path) -> "Limits | None":
        path = Path(workdir) / FILE
        return cls(**json.loads(path.read_text())) if path.exists() else None

    def started_now(self, now: float | None = None) -> "Limits":
        return replace(self, arm_start_epoch=time.time() if now is None else now)


# --- before an arm --------------------------------------------------------------------------

def run_spend(plan, run) -> float:
    """What one train attempt cost: its hosts over its wall time, and its measured cross-zone bytes."""
    arm = run.data.tags.get(ARM, "")
    hosts = plan.arms.processes(arm) if arm in plan.arms.names else 1
    end = (run.info.end_time or time.time() * 1000) / 1000
    seconds = max(end - run.info.start_time / 1000, 0.0)
    m = run.data.metrics
    cross = 0.0
    if crosses_zones(plan, arm):
        for j in range(hosts):
            if M.host_wire_tx_total(j) in m:
                cross += m[M.host_wire_tx_total(j)] + m[M.host_wire_rx_total(j)]
        if not cross and M.SPEND_CROSS_BYTES in m:  # stopped before its summary: the last running figure
            cross = m[M.SPEND_CROSS_BYTES]
    return seconds * hosts * host_price(plan) / 3600 + cross / GB * plan.infra.cross_zone_usd_per_gb


def spent(plan, attempts, exclude_run_id: str | None = None) -> float:
    """Spend of every train attempt so far (`StudyFigures.attempts`: refusals cost nothing, they
    never held a host), but the run `exclude_run_id`."""
    return sum((run_spend(plan, run) for run in attempts if run.info.run_id != exclude_run_id), 0.0)


def measured_startup_s(run) -> float | None:
    """A finished arm's (`FinishedRun`) seconds beyond its updates, as measured: the worker's wall
    time less its updates (process group, model init or load, compile, checkpoint write), plus the
    launch and the checkpoint's upload where its phases were recorded (`metrics.PHASES`)."""
    m = run.metrics
    if M.WALL_S not in m:
        return None
    extra = sum(m.get(M.phase_s(p), 0.0) for p in ("launch", "checkpoint_upload"))
    return max(m[M.WALL_S] - m.get(M.ACTIVE_S, 0.0), 0.0) + extra


def expected_arm(plan, arm: str, known) -> dict:
    """Projected seconds of the arm, from the study's figures `known` (`StudyFigures`): a finished
    arm's measured rate where one with as many processes exists; else the plan's update seconds,
    with the start-up measured on any finished arm of the study (a model's init, compile and
    checkpoint do not depend on the number of processes) or, before any, the plan's."""
    n = plan.arms.processes(arm)
    startup = None
    for other in plan.arms.names:
        for run in known.finished[other]:
            run_startup = measured_startup_s(run)
            if run_startup is None:
                continue
            if plan.arms.processes(other) == n and run.median_step_s is not None:
                return {"update_s": run.median_step_s, "startup_s": run_startup,
                        "source": f"measured on arm {other}"}
            startup = startup or (run_startup, other)
    start_s, start_source = (startup[0], f"start-up and checkpoint measured on arm {startup[1]}") if startup \
        else (plan.arms.expected_startup_s, "the plan's arms.expected_startup_s")
    figures = known.preflight if n > 1 else None
    if figures is not None:  # the hosts' own link, measured before any arm spent on it
        c, c_source = measured.compute_s(plan, known.finished)
        per = measured.arm_seconds(plan, arm, c, figures) / plan.schedule.updates
        return {"update_s": per, "startup_s": start_s,
                "source": f"{c_source} x 1/2 + the exchange {measured.provenance(figures)}; {start_source}"}
    return {"update_s": plan.arms.expected_update_s, "startup_s": start_s,
            "source": f"the plan's arms.expected_update_s; {start_source}"}


def expected_startup_s(plan, known) -> float:
    """An arm's expected seconds besides its updates (`expected_arm`'s; they do not depend on the arm)."""
    return expected_arm(plan, plan.arms.names[0], known)["startup_s"]


def expected_cross_bytes(plan, arm: str, shapes: list[tuple[int, ...]] | None = None) -> float:
    """Cross-zone bytes of the arm's hosts, sent plus received, from its logical volume (the
    model's parameter `shapes`, built from the plan where not given)."""
    if not crosses_zones(plan, arm):
        return 0.0  # no shapes built for nothing
    return arm_cross_zone_bytes(plan, arm, exchange_bytes(plan, parameter_shapes(plan) if shapes is None else shapes))


def study_left(plan, known, now: float, spent_usd: float) -> None:
    """Where the study's preflight measured its hosts (`known.preflight`): the arms not yet
    finished, together, on those hosts (`measured.go_no_go`); a Refusal naming the measured
    figure where they cannot all end within the deadline and the budget, so that no arm spends
    on a study that cannot end."""
    figures = known.preflight
    if figures is None:
        return
    verdict = measured.go_no_go(plan, figures, known, expected_startup_s(plan, known), now, spent_usd)
    if verdict["go"] != "go":
        word = "deadline" if any("deadline" in w for w in verdict["why"]) else "budget"
        rows = ", ".join(f"{r['arm']} {r['seconds']:.0f} s ${r['usd']:.2f}" for r in verdict["arms"])
        raise Refusal(f"{word}: the study's remaining arms ({rows}) on the hosts {verdict['provenance']} (link "
                      f"{measured.link_gbit(figures):.3g} Gbit/s each way with sockets {figures['best']}): "
                      f"{'; '.join(verdict['why'])}; not started")


def arm_limits(plan, arm: str, known, own_run_id: str | None = None, now: float | None = None,
               updates_left: int | None = None, extra_spent: float = 0.0) -> Limits:
    """Refuse an arm that would pass the deadline or the bound, by the study's figures `known`
    (`StudyFigures`, its own run `own_run_id` not yet spent); else the figures for its workers. A
    resumed arm projects only its `updates_left`, and its earlier part is `extra_spent`."""
    now = time.time() if now is None else now
    start = known.start_epoch
    deadline = start + plan.infra.deadline_hours * 3600
    hosts = plan.arms.processes(arm)
    usd_per_s = hosts * host_price(plan) / 3600
    cross_rate = plan.infra.cross_zone_usd_per_gb / GB if crosses_zones(plan, arm) else 0.0
    before = spent(plan, known.attempts, exclude_run_id=own_run_id) + extra_spent
    exp = expected_arm(plan, arm, known)
    left = plan.schedule.updates if updates_left is None else updates_left
    seconds = exp["startup_s"] + left * exp["update_s"]
    cross = expected_cross_bytes(plan, arm, known.shapes) * left / plan.schedule.updates
    cost = seconds * usd_per_s + cross * cross_rate
    how = (f"projected {seconds:.0f} s ({exp['startup_s']:.0f} s start-up and checkpoint + "
           f"{left} updates x {exp['update_s']:.2f} s, {exp['source']})")
    study_left(plan, known, now, before)
    if now + seconds > deadline:
        raise Refusal(f"deadline: arm {arm} would end at {_utc(now + seconds)}, past the study's deadline "
                        f"{_utc(deadline)} (start {_utc(start)} + {plan.infra.deadline_hours:g} h): {how}; "
                        f"not started")
    if before + cost > plan.infra.budget_usd:
        raise Refusal(f"budget: arm {arm} would cost ${cost:.4f} ({hosts} host(s) x {seconds:.0f} s x "
                        f"${host_price(plan):g}/h + {cross / GB:.3f} GB cross-zone x "
                        f"${plan.infra.cross_zone_usd_per_gb:g}/GB; {how}) on top of ${before:.4f} spent: "
                        f"${before + cost:.4f}, past the ${plan.infra.budget_usd:g} bound; not started")
    return Limits(start_epoch=start, deadline_epoch=deadline, budget_usd=plan.infra.budget_usd,
                  spent_before_usd=before, usd_per_s=usd_per_s, cross_usd_per_byte=cross_rate,
                  arm_start_epoch=now, updates=plan.schedule.updates)

