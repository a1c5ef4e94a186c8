"""Rewrite the plan's numbers in STUDY.md from `gradshare/contract/plan.py`, the only place they live.

    python scripts/study_md.py            # rewrite every generated block of STUDY.md in place
    python scripts/study_md.py --check    # exit 1, naming each stale block; nothing is written

STUDY.md is prose written by hand plus blocks written by this script, each between
`<!-- plan:NAME -->` and `<!-- /plan -->`. A block shows the `tiny` profile (the embedded CPU
default) and the `full` profile (the study on GPUs) side by side, both as `load_plan` builds
them. A plan change that is not regenerated here fails `tests/unit/scripts/test_study_md.py`.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gradshare.contract.plan import Plan, load_plan  # noqa: E402

STUDY_MD = REPO / "STUDY.md"
PROFILES = ("tiny", "full")
BLOCK = re.compile(r"(?P<open><!-- plan:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(?P<close><!-- /plan -->)", re.S)


class StudyMdError(ValueError):
    """STUDY.md's markers do not match the blocks this script writes."""


def plans(overrides: dict[str, str] | None = None) -> dict[str, Plan]:
    """Both profiles, with the same `concern.field` overrides applied to each (as prepare would)."""
    return {p: load_plan(p, overrides) for p in PROFILES}


# -- formatting -------------------------------------------------------------------------------

def num(v) -> str:
    """A plan number as written in the plan: thousands separated, floats without float noise."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.0f}" if v.is_integer() and abs(v) >= 1000 else f"{v:g}"
    if isinstance(v, (tuple, list)):
        return ", ".join(f"`{x}`" for x in v)
    return f"`{v}`"


def ratio(v: float) -> str:
    """A multiplier with at least two decimals (1.1 -> 1.10), never rounded."""
    s = f"{v:g}"
    return f"{v:.2f}" if len(s.partition(".")[2]) < 2 else s


def signed(v: float, unit: str) -> str:
    return f"{v:+g} {unit}"


def get(plan: Plan, key: str):
    concern, _, name = key.partition(".")
    return getattr(getattr(plan, concern), name)


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def by_profile(ps: dict[str, Plan], rows: list[tuple[str, Callable[[Plan], str], str]]) -> str:
    """One row per quantity: what | tiny | full | plan fields."""
    out = []
    for what, show, source in rows:
        out.append([what, *(show(ps[p]) for p in PROFILES), source])
    return table(["", *PROFILES, "from `plan.py`"], out)


def field_rows(keys: list[tuple[str, str]]) -> list[tuple[str, Callable[[Plan], str], str]]:
    return [(what, (lambda p, k=key: num(get(p, k))), f"`{key}`") for what, key in keys]


# -- the blocks -----------------------------------------------------------------------------

def block_profiles(ps):
    rows = [
        ("what it is for", lambda p: "the embedded default: the whole shape on CPU, in minutes"
         if p.study.profile == "tiny" else "the study itself, on GPUs", "`study.profile`"),
        ("device, collectives", lambda p: f"`{p.hardware.device}`, "
         + ("NCCL" if p.hardware.device == "cuda" else "gloo"), "`hardware.device`"),
        ("precision", lambda p: num(p.hardware.precision), "`hardware.precision`"),
        ("deterministic algorithms", lambda p: num(p.hardware.deterministic), "`hardware.deterministic`"),
        *field_rows([("torch.compile of each decoder layer", "hardware.compile"),
                     ("fused AdamW kernel", "hardware.fused_adamw"),
                     ("DDP gradients as bucket views", "hardware.gradient_as_bucket_view"),
                     ("cross-entropy in chunks of tokens (0: all at once)", "hardware.loss_chunk_tokens"),
                     ("activation checkpointing", "hardware.activation_checkpointing"),
                     ("micro-batches replayed as CUDA graphs", "hardware.cuda_graphs"),
                     ("allocator cap per process, GiB (0: none)", "hardware.max_device_gib")]),
        ("plan_sha256 (first 16 hex)", lambda p: f"`{p.sha256()[:16]}`", "`Plan.sha256()`"),
    ]
    return by_profile(ps, rows)


def block_arms(ps):
    rows = []
    tiny = ps["tiny"]
    for arm in (tiny.arm(name) for name in tiny.arms.names):
        role = ("candidate" if arm.name == tiny.arms.candidate else
                "control" if arm.name in tiny.arms.controls else "")
        rows.append([f"`{arm.name}`", role, f"`{arm.kind}`", *(num(ps[p].arms.processes(arm.name)) for p in PROFILES),
                     arm.method.describe(arm)])
    return table(["arm (in running order)", "role", "kind", "processes, tiny", "processes, full",
                  "gradient exchange"], rows) + "\nEach arm is one row of `arms.rows` (`name:kind:processes`, a PowerSGD row " \
        "with its own `:rank=R` and `:warmup=W` where it differs from `powersgd`).\n"


def block_shared(ps):
    return by_profile(ps, [
        ("study seed (data, schedule order, initialisation, RNG)", lambda p: f"`{p.study.seed}`", "`study.seed`"),
        ("final step: every final model is fixed here", lambda p: num(p.schedule.updates), "`schedule.updates`"),
        ("documents per global batch", lambda p: num(p.schedule.docs_per_update), "`schedule.docs_per_update`"),
        ("documents per micro-batch on one rank (where not packed)", lambda p: num(p.schedule.micro_batch_docs),
         "`schedule.micro_batch_docs`"),
        ("tokens per packed micro-batch (0: not packed)", lambda p: num(p.schedule.micro_batch_tokens),
         "`schedule.micro_batch_tokens`"),
        *field_rows([("AdamW learning rate", "optim.lr"),
                     ("learning-rate warm-up (updates, linear)", "optim.warmup_updates"),
                     ("AdamW beta1", "optim.beta1"), ("AdamW beta2", "optim.beta2"),
                     ("AdamW eps", "optim.eps"), ("weight decay", "optim.weight_decay"),
                     ("global gradient-norm clip", "optim.clip_norm")]),
    ])


def block_powersgd(ps):
    return by_profile(ps, [
        ("rank of the approximation", lambda p: num(p.powersgd.rank), "`powersgd.rank`"),
        ("dense warm-up: plain all-reduce for updates", lambda p: f"1 to {p.powersgd.warmup_updates}",
         "`powersgd.warmup_updates`"),
        ("first compressed update", lambda p: num(p.powersgd.warmup_updates + 1), "`powersgd.warmup_updates`"),
        ("warm start (reuse Q between updates)", lambda p: num(p.powersgd.warm_start), "`powersgd.warm_start`"),
        ("error feedback", lambda p: num(p.powersgd.error_feedback), "`powersgd.error_feedback`"),
        ("compress a matrix only if (rows + cols) x rank x this < rows x cols",
         lambda p: num(p.powersgd.min_compression_rate), "`powersgd.min_compression_rate`"),
        ("DDP bucket size (MB)", lambda p: num(p.powersgd.bucket_cap_mb), "`powersgd.bucket_cap_mb`"),
        ("hook implementation", lambda p: num(p.powersgd.hook), "`powersgd.hook`"),
        ("orthogonalisation of P", lambda p: num(p.powersgd.orthogonalization), "`powersgd.orthogonalization`"),
        ("device memory for FP32 error in flight (MB, `fast` hook)", lambda p: num(p.powersgd.staging_mb),
         "`powersgd.staging_mb`"),
        ("error added between micro-batches (`fast` hook)", lambda p: num(p.powersgd.fold_errors),
         "`powersgd.fold_errors`"),
    ])


def block_data(ps):
    def fam(p):
        return len(p.data.families)
    return by_profile(ps, [
        ("task families", lambda p: f"{fam(p)}: {num(p.data.families)}", "`data.families`"),
        ("training tasks", lambda p: f"{num(fam(p) * p.data.train_per_family)} "
         f"({fam(p)} x {num(p.data.train_per_family)})", "`data.train_per_family`"),
        ("final-test cases, disjoint from training", lambda p: f"{num(p.test_cases)} "
         f"({fam(p)} x {num(p.data.test_per_family)})", "`data.test_per_family`"),
        ("conversation-replay documents", lambda p: num(p.data.replay_docs), "`data.replay_docs`"),
        ("where the conversations come from", lambda p: num(p.data.replay_source), "`data.replay_source`"),
        ("retention probes (already seen by the seed model)", lambda p: num(p.data.retention_probes),
         "`data.retention_probes`"),
        ("conversations the tiny seed model is pre-trained on, besides the probes",
         lambda p: num(p.data.pretrain_docs), "`data.pretrain_docs`"),
        ("tokens per document at most (prompt + target)", lambda p: num(p.data.max_doc_tokens),
         "`data.max_doc_tokens`"),
        ("schedule: updates x documents = training documents",
         lambda p: f"{num(p.schedule.updates)} x {num(p.schedule.docs_per_update)} = "
                   f"{num(p.schedule.updates * p.schedule.docs_per_update)} = "
                   f"{num(fam(p) * p.data.train_per_family)} tasks + {num(p.data.replay_docs)} replay",
         "`schedule.*`, `data.*`"),
    ])


def block_model(ps):
    return by_profile(ps, field_rows([
        ("seed model", "model.source"), ("model shape (gradshare/model/configs)", "model.config"),
        ("tokenizer vocabulary trained by prepare (tiny)", "model.vocab_size"),
        ("seed pre-training updates (tiny)", "model.pretrain_steps"),
        ("documents per pre-training update", "model.pretrain_batch_docs"),
        ("pre-training learning rate", "model.pretrain_lr"),
    ]))


def block_attempts(ps):
    def limit(p):
        a, u = p.arms, p.schedule.updates
        return (f"{num(a.startup_s)} + {num(u)} x {num(a.expected_update_s)} x {num(a.timeout_margin)} "
                f"= {num(a.timeout_s(u))} s")
    return by_profile(ps, [
        ("attempts an arm may make", lambda p: num(p.arms.max_attempts), "`arms.max_attempts`"),
        ("start-up and checkpoint allowance (s)", lambda p: num(p.arms.startup_s), "`arms.startup_s`"),
        ("expected seconds per update", lambda p: num(p.arms.expected_update_s), "`arms.expected_update_s`"),
        ("margin", lambda p: num(p.arms.timeout_margin), "`arms.timeout_margin`"),
        ("time limit of one arm: start-up + updates x expected x margin", limit,
         "`arms.timeout_s(schedule.updates)`"),
    ])


def block_report(ps):
    return by_profile(ps, [
        ("normal multiplier z of every interval", lambda p: num(p.screen.z), "`screen.z`"),
        ("greedy generation budget per test case (tokens)", lambda p: num(p.scoring.max_new_tokens),
         "`scoring.max_new_tokens`"),
        ("test cases per generation batch", lambda p: num(p.scoring.batch_size), "`scoring.batch_size`"),
    ])


def block_quality(ps):
    def cand(p):
        return f"`{p.arms.candidate}`"
    return by_profile(ps, [
        ("task gain: candidate minus seed, overall accuracy, at least",
         lambda p: signed(p.screen.task_gain_pp, "pp"), "`screen.task_gain_pp`"),
        ("retention: upper bound of the NLL change (mean + z x se), at most",
         lambda p: signed(p.screen.retention_upper_nats, "nats"), "`screen.retention_upper_nats`"),
        ("non-inferiority: lower bound of candidate minus each control (mean - z x se), at least",
         lambda p: signed(p.screen.noninferiority_pp, "pp"), "`screen.noninferiority_pp`"),
        ("with z", lambda p: num(p.screen.z), "`screen.z`"),
        ("candidate", cand, "`arms.candidate`"),
        ("controls", lambda p: num(p.arms.controls), "`arms.controls`"),
    ])


def block_speed(ps):
    return by_profile(ps, [
        ("candidate active tokens/s, at least this times the baseline's",
         lambda p: f"{ratio(p.screen.speed_ratio)} x", "`screen.speed_ratio`"),
        ("baseline arm", lambda p: f"`{p.screen.speed_baseline}`", "`screen.speed_baseline`"),
    ])


def block_infra(ps):
    def zones(p):
        return ", ".join(f"`{h}` in `{z}`" for h, z in zip(p.infra.hosts, p.infra.zones))
    return by_profile(ps, [
        ("instance type", lambda p: f"`{p.infra.instance_type}`", "`infra.instance_type`"),
        ("GPU per host", lambda p: f"`{p.infra.gpu}`", "`infra.gpu`"),
        ("hosts and zones", zones, "`infra.hosts`, `infra.zones`"),
        ("declared on-demand price per host-hour (USD)", lambda p: f"{p.infra.usd_per_host_hour:g}",
         "`infra.usd_per_host_hour`"),
        ("date of that price", lambda p: f"`{p.infra.price_date}`", "`infra.price_date`"),
        ("cross-zone transfer per GB, each direction (USD)", lambda p: f"{p.infra.cross_zone_usd_per_gb:g}",
         "`infra.cross_zone_usd_per_gb`"),
        ("stop deadline for the whole study (hours)", lambda p: num(p.infra.deadline_hours),
         "`infra.deadline_hours`"),
        ("allocation bound for the whole study (USD)", lambda p: num(p.infra.budget_usd), "`infra.budget_usd`"),
        ("every host running until the deadline (USD)",
         lambda p: f"{len(p.infra.hosts) * p.infra.deadline_hours * p.infra.usd_per_host_hour:.2f}",
         "hosts x deadline x price"),
    ])


def block_all(ps):
    flat = {p: ps[p].flat() for p in PROFILES}
    rows = [[f"`{k}`", *(f"`{flat[p][k]}`" if flat[p][k] else "(empty)" for p in PROFILES),
             "" if flat["tiny"][k] == flat["full"][k] else "differs"] for k in sorted(flat["tiny"])]
    return (table(["plan field", *PROFILES, ""], rows)
            + "\n" + "\n".join(f"- `plan_sha256` of `{p}`: `{ps[p].sha256()}`" for p in PROFILES) + "\n")


BLOCKS: dict[str, Callable[[dict[str, Plan]], str]] = {
    "profiles": block_profiles, "arms": block_arms, "shared": block_shared, "powersgd": block_powersgd,
    "data": block_data, "model": block_model, "attempts": block_attempts, "report": block_report,
    "quality": block_quality, "speed": block_speed, "infra": block_infra, "all": block_all,
}


# -- rewriting ------------------------------------------------------------------------------

def generate(overrides: dict[str, str] | None = None) -> dict[str, str]:
    """Every block's body, as this plan (with `overrides`, if any) makes it."""
    ps = plans(overrides)
    return {name: make(ps) for name, make in BLOCKS.items()}


def blocks_in(text: str) -> dict[str, str]:
    """The generated blocks of a STUDY.md text, name -> body; refuses duplicates and unknown names."""
    found: dict[str, str] = {}
    for m in BLOCK.finditer(text):
        name = m["name"]
        if name in found:
            raise StudyMdError(f"STUDY.md has the block `plan:{name}` twice; keep one")
        if name not in BLOCKS:
            raise StudyMdError(f"STUDY.md has a block `plan:{name}` that scripts/study_md.py does not "
                               f"write; known: {', '.join(BLOCKS)}")
        found[name] = m["body"]
    missing = [n for n in BLOCKS if n not in found]
    if missing:
        raise StudyMdError("STUDY.md lacks the blocks " + ", ".join(f"`plan:{n}`" for n in missing)
                           + "; add `<!-- plan:NAME -->` and `<!-- /plan -->` lines where they belong")
    return found


def prose(text: str) -> str:
    """STUDY.md without its generated blocks (markers kept): the part written by hand."""
    return BLOCK.sub(lambda m: m["open"] + m["close"], text)


def render(text: str, overrides: dict[str, str] | None = None) -> str:
    """`text` with every generated block rewritten."""
    blocks_in(text)
    bodies = generate(overrides)
    return BLOCK.sub(lambda m: m["open"] + bodies[m["name"]] + m["close"], text)


def stale(text: str, overrides: dict[str, str] | None = None) -> list[str]:
    """Names of the blocks whose text differs from what the plan makes now."""
    have, want = blocks_in(text), generate(overrides)
    return [n for n in BLOCKS if have[n] != want[n]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 naming stale blocks; write nothing")
    ap.add_argument("--file", type=Path, default=STUDY_MD, help="the document (default: STUDY.md)")
    args = ap.parse_args(argv)
    text = args.file.read_text()
    try:
        if args.check:
            bad = stale(text)
            if bad:
                print(f"{args.file.name}: stale generated blocks: " + ", ".join(f"plan:{n}" for n in bad)
                      + "; run `python scripts/study_md.py`", file=sys.stderr)
                return 1
            print(f"{args.file.name}: every generated block matches gradshare/contract/plan.py")
            return 0
        new = render(text)
    except StudyMdError as e:
        print(f"{args.file.name}: {e}", file=sys.stderr)
        return 1
    if new != text:
        args.file.write_text(new)
        print(f"{args.file.name}: rewrote " + ", ".join(f"plan:{n}" for n in stale(text)))
    else:
        print(f"{args.file.name}: already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
