"""A prepared study's workload: what each update asks of one device, by the loop's own layout.

For every update of the schedule: its input and target tokens, and, for one rank of a one-rank
and of a two-rank arm (the slower rank of the two), the padded tokens its micro-batches hold
and how many micro-batches it runs (`gradshare.model.batching.for_plan`, as the loop does).
The projection's compute per update is built from these (`gradshare.cost.projection`): a study with
shorter documents has fewer padded tokens, and only its matrix work shrinks.

    record = describe(plan, docs, tokenizer, schedule)      # prepare writes it as inputs/workload.json
    record = tracking.figures.study_workload(prep, plan)    # what `gradshare project` reads of a study
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from gradshare.data.documents import encode
from gradshare.data.schedule import rank_share
from gradshare.data.tokenizer import load_tokenizer
from gradshare.model.batching import for_plan
from gradshare.util.jsonio import read_jsonl

WORKLOAD = "workload.json"  # prepare's record, one of the study's hashed inputs (inputs/workload.json)
WORLDS = (1, 2)  # the study's one-device and two-device arms


def describe(plan, docs: dict[str, dict], tokenizer, schedule: dict) -> dict:
    """The per-update figures of `schedule` (see the module docstring), and their medians."""
    max_tok = schedule["max_doc_tokens"]
    lengths = {i: len(encode(tokenizer, d, max_tok)[0]) for i, d in docs.items()}
    updates = []
    for u, ids in enumerate(schedule["updates"]):
        row = {"input_tokens": sum(lengths[i] for i in ids), "target_tokens": schedule["target_tokens"][u]}
        for world in WORLDS:
            ranks = [for_plan(plan, rank_share(ids, r, world), lengths) for r in range(world)]
            padded = [sum(mb.shape[0] * mb.shape[1] for mb in mbs) for mbs in ranks]
            slow = max(range(world), key=lambda r: (padded[r], len(ranks[r])))
            row[f"w{world}"] = {"padded_tokens": padded[slow], "micro_batches": len(ranks[slow])}
        updates.append(row)
    return {"plan_sha256": plan.sha256(), "updates": updates, "median": medians(updates),
            "layout": (f"packed into rows of {plan.data.max_doc_tokens}, {plan.schedule.micro_batch_tokens} tokens "
                       f"per micro-batch" if plan.schedule.micro_batch_tokens else
                       f"{plan.schedule.micro_batch_docs} whole documents per micro-batch")}


def medians(updates: list[dict]) -> dict:
    out = {k: statistics.median(u[k] for u in updates) for k in ("input_tokens", "target_tokens")}
    for world in WORLDS:
        for k in ("padded_tokens", "micro_batches"):
            out[f"w{world}_{k}"] = statistics.median(u[f"w{world}"][k] for u in updates)
    return out


def scaled(record: dict, factor: float) -> dict:
    """The same schedule with every document `factor` times as long: padded tokens scale, and so do
    the micro-batches (at least one) that hold them. For the break-even search."""
    ups = []
    for u in record["updates"]:
        row = {"input_tokens": u["input_tokens"] * factor, "target_tokens": u["target_tokens"] * factor}
        for world in WORLDS:
            w = u[f"w{world}"]
            row[f"w{world}"] = {"padded_tokens": w["padded_tokens"] * factor,
                                "micro_batches": max(1, math.ceil(w["micro_batches"] * factor))}
        ups.append(row)
    return {**record, "updates": ups, "median": medians(ups)}


TRAINING_FILES = ("data/train_tasks.jsonl", "data/replay.jsonl")
"""Where prepare's inputs hold the training documents: the generated tasks, the replay conversations."""


def training_docs(inputs: Path) -> dict[str, dict]:
    """Every training document of prepared inputs (or an arm's workdir, which mirrors them), by id."""
    return {d["id"]: d for name in TRAINING_FILES for d in read_jsonl(Path(inputs) / name)}


def from_inputs(plan, inputs: Path) -> dict:
    """`describe` of inputs written by prepare's `build_inputs` under `inputs`."""
    docs = training_docs(inputs)
    schedule = json.loads((inputs / "schedule.json").read_text())
    return describe(plan, docs, load_tokenizer(inputs / "tokenizer"), schedule)


