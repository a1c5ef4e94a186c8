"""The documents a GPU benchmark trains on: the study's own, or the 512-token stand-ins.

- `study` (the default): the full profile's prepared inputs, built in-process by prepare's own
  code (`gradshare.inputs.build.build_inputs`: tasks, conversations, tokenizer, schedule; no model,
  no MLflow), of which a benchmark takes the first N updates. A median of ~3,400 input tokens
  per update: ~30-token tasks and conversations of up to 512 tokens.
- `stand-in-512`: 32 synthetic documents per update that each fill 512 tokens (16,384 tokens),
  the shape every GPU figure before 2026-12-04 was measured on.
Both come back as (documents by id, tokenizer, schedule) in the loop's own format.
"""
from __future__ import annotations

import json
from pathlib import Path

DOCS_PER_UPDATE = 32
DOC_TOKENS = 512
WORKLOADS = ("study", "stand-in-512")


def stand_in_documents(n: int, seed: int) -> list[dict]:
    """Task documents long enough that each is cut at 512 tokens: every row of a micro-batch
    is full, 32 x 512 = 16,384 tokens per update, as in the design's anchors."""
    from gradshare.data.tasks import FAMILIES, generate_splits

    train, _ = generate_splits(FAMILIES, n * 6 // len(FAMILIES) + 1, 1, seed)
    docs = []
    for i in range(n):
        chunk = train[i * 6:(i + 1) * 6] or train[:6]
        text = "\n".join(f"{c['question']} {c['answer']}" for c in chunk) * 16
        docs.append({"id": f"doc/{i:05d}", "kind": "task", "family": None, "prompt": "", "target": text})
    return docs


def schedule_for(tokenizer, docs: dict, updates: int, seed: int, max_tokens: int = DOC_TOKENS) -> dict:
    from gradshare.data.documents import target_tokens
    from gradshare.data.schedule import build_schedule, update_sha256

    ids = build_schedule(sorted(docs), updates, DOCS_PER_UPDATE, seed)
    return {"updates": ids, "max_doc_tokens": max_tokens,
            "target_tokens": [sum(target_tokens(tokenizer, docs[i], max_tokens) for i in u) for u in ids],
            "update_sha256": [update_sha256(u) for u in ids]}


def build(workload: str, workdir: Path, log=print) -> Path:
    """Write the workload's inputs under `workdir/<workload>` once (every configuration's process
    reads them): the study's via prepare's own code, the stand-ins with a BPE trained on them."""
    from gradshare.contract.plan import load_plan

    out = Path(workdir) / workload
    if (out / "schedule.json").exists():
        return out
    if workload == "study":
        from gradshare.inputs.build import build_inputs

        build_inputs(load_plan("full"), out, log=log)
        return out
    if workload != "stand-in-512":
        raise ValueError(f"unknown workload {workload!r}: one of {WORKLOADS}")
    from gradshare.data.tokenizer import load_tokenizer, train_bpe
    from gradshare.util.jsonio import write_json, write_jsonl

    updates = 16
    docs = stand_in_documents(updates * DOCS_PER_UPDATE, 7)
    train_bpe([d["target"] for d in docs], 4096, out / "tokenizer")
    write_jsonl(out / "data/train_tasks.jsonl", docs)
    tok = load_tokenizer(out / "tokenizer")
    write_json(out / "schedule.json", schedule_for(tok, {d["id"]: d for d in docs}, updates, 20261202))
    return out


def load(workload: str, workdir: Path, updates: int):
    """(documents by id, tokenizer, the schedule's first `updates` updates) of a built workload."""
    from gradshare.data.tokenizer import load_tokenizer
    from gradshare.util.jsonio import read_jsonl

    root = Path(workdir) / workload
    docs = {}
    for name in ("data/train_tasks.jsonl", "data/replay.jsonl"):
        if (root / name).exists():
            docs.update({d["id"]: d for d in read_jsonl(root / name)})
    full = json.loads((root / "schedule.json").read_text())
    if updates > len(full["updates"]):
        raise ValueError(f"workload {workload} has {len(full['updates'])} updates, asked for {updates}")
    schedule = {k: (v[:updates] if isinstance(v, list) else v) for k, v in full.items()}
    used = {i for u in schedule["updates"] for i in u}
    return {i: d for i, d in docs.items() if i in used}, load_tokenizer(root / "tokenizer"), schedule


WARMUP = 2  # plain exchanges before compression in the benchmarks (upstream start_powerSGD_iter)


def bench_plan(profile: str, extra: dict, updates: int | None = None):
    """The profile's plan for a benchmark at world size 1: every arm one process, PowerSGD
    compressing from the third exchange. `updates`: a schedule of that many updates of 32
    documents (the plan's data sizes made to fit it); None: the profile's own. On a CPU the
    GPU-only levers are dropped."""
    from gradshare.contract.plan import load_plan

    over = {"arms.rows": "single:single:1,dense:dense:1,powersgd:powersgd:1", "powersgd.warmup_updates": str(WARMUP),
            "data.max_doc_tokens": str(DOC_TOKENS)}
    if updates is not None:
        n = updates * DOCS_PER_UPDATE
        over |= {"schedule.updates": str(updates), "data.train_per_family": str((n - 4) // 4),
                 "data.replay_docs": str(n - 4 * ((n - 4) // 4))}
    if profile != "full":
        extra = {k: v for k, v in extra.items() if k not in ("hardware.compile", "hardware.fused_adamw")}
    return load_plan(profile, {**over, **extra})
