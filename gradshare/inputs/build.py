"""Every input of the study, built from the plan alone: tasks, documents, the schedule, the
tokenizer, the seed model and the manifest that hashes them. Two builds of one plan give
identical bytes. `prepare` registers what this builds; the projection builds the full
profile's inputs in-process to read their workload.

Layout of the inputs (the prepare run's artifacts under `inputs/`):
    data/train_tasks.jsonl   3,072 generated training tasks (documents)
    data/replay.jsonl        1,024 conversation-replay documents
    data/pretrain.jsonl      tiny profile: conversations the seed model was pre-trained on
    eval/test_tasks.jsonl    1,024 final-test cases (read only by `score`)
    eval/probes.jsonl        128 retention probes (exposed during pre-training)
    schedule.json            128 x 32 document ids, per-update target-token counts and hashes
    workload.json            per update: input tokens, and padded tokens and micro-batches of
                             one rank of a one- and a two-rank arm (`gradshare.inputs.workload`)
    tokenizer/               the tokenizer
    seed_model/              tiny profile: the pre-trained seed model (safetensors)
    manifest.json            path, bytes, SHA-256 of every file above; numerical sources
plus `plan.json` at the run's root. Two prepares of the same plan give identical bytes.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from gradshare.contract.plan import Plan
from gradshare.data import documents as D
from gradshare.data.replay import load_conversations, select_documents
from gradshare.data.schedule import build_schedule, update_sha256
from gradshare.data.tasks import generate_splits
from gradshare.data.tokenizer import load_tokenizer, train_bpe
from gradshare.inputs.workload import WORKLOAD
from gradshare.inputs.workload import describe as describe_workload
from gradshare.model.source import model_config
from gradshare.util.hashing import file_entries, tree_sha256
from gradshare.util.hashing import file_entries as entries
from gradshare.util.jsonio import write_json, write_jsonl
from gradshare.util.kept import kept
from gradshare.util.sources import numerical_sources, set_determinism


def build_inputs(plan: Plan, out: str | Path, log=print) -> dict:
    """Write every input of the study under `out`; returns the manifest."""
    import torch

    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    seed, d = plan.study.seed, plan.data
    set_determinism(plan.hardware.deterministic, compiles=False)  # prepare compiles nothing
    t0 = time.perf_counter()

    train_cases, test_cases = generate_splits(d.families, d.train_per_family, d.test_per_family, seed)
    train_docs = [D.task_document(c) for c in train_cases]
    write_jsonl(out / "data/train_tasks.jsonl", [{**doc, "prompt_sha256": c["prompt_sha256"]}
                                                 for doc, c in zip(train_docs, train_cases)])
    write_jsonl(out / "eval/test_tasks.jsonl", test_cases)
    log(f"tasks: {len(train_cases)} train, {len(test_cases)} test ({time.perf_counter() - t0:.1f}s)")

    convs = load_conversations(d.replay_source)
    sel = select_documents(convs, seed, replay=d.replay_docs, probes=d.retention_probes,
                           pretrain=d.pretrain_docs)
    replay = [D.conversation_document(x, "replay") for x in sel["replay"]]
    probes = [D.conversation_document(x, "probe") for x in sel["probes"]]
    pretrain = [D.conversation_document(x, "pretrain") for x in sel["pretrain"]]
    write_jsonl(out / "data/replay.jsonl", replay)
    write_jsonl(out / "eval/probes.jsonl", probes)
    if pretrain:
        write_jsonl(out / "data/pretrain.jsonl", pretrain)
    log(f"conversations: {len(convs)} loaded from {d.replay_source}; {len(replay)} replay, "
        f"{len(probes)} probes, {len(pretrain)} pre-training")

    tok_dir = out / "tokenizer"
    m = plan.model
    if m.source.startswith("hf:"):
        src = Path(m.source[3:])
        tokenizer = load_tokenizer(src)
        tokenizer.save_pretrained(str(tok_dir))
    else:
        # Training inputs only: the test set never shapes the vocabulary.
        texts = [x["prompt"] + x["target"] for x in train_docs + replay + pretrain + probes]
        train_bpe(texts, m.vocab_size, tok_dir)
    tokenizer = load_tokenizer(tok_dir)
    log(f"tokenizer: {len(tokenizer)} tokens")

    schedule = build_schedule([x["id"] for x in train_docs + replay], plan.schedule.updates,
                              plan.schedule.docs_per_update, seed)
    by_id = {x["id"]: x for x in train_docs + replay}
    counts = {i: D.target_tokens(tokenizer, by_id[i], d.max_doc_tokens) for i in by_id}
    write_json(out / "schedule.json", {
        "updates": schedule,
        "target_tokens": [sum(counts[i] for i in u) for u in schedule],
        "update_sha256": [update_sha256(u) for u in schedule],
        "max_doc_tokens": d.max_doc_tokens,
    })

    # what each update asks of one device, by the loop's own layout (the projection reads it)
    write_json(out / WORKLOAD, describe_workload(plan, by_id, tokenizer, json.loads((out / "schedule.json").read_text())))
    seed_info = _seed_model(plan, tokenizer, pretrain + probes, probes, out / "seed_model", log)
    files = file_entries(out)
    manifest = {
        "plan_sha256": plan.sha256(),
        "files": files,
        "inputs_sha256": tree_sha256(files),
        "seed_model": seed_info,
        "sources": numerical_sources(seed),
        "torch_threads": torch.get_num_threads(),
        "threads_per_process": plan.hardware.threads_per_process,  # every process of every arm
    }
    write_json(out / "manifest.json", manifest)
    log(f"inputs ready in {time.perf_counter() - t0:.1f}s; inputs_sha256 {manifest['inputs_sha256'][:16]}…")
    return manifest


def _seed_model(plan: Plan, tokenizer, pretrain_docs, probes, out: Path, log) -> dict:
    """Tiny: build and pre-train the seed model. Full: record the local model's files."""
    m, seed, max_tok = plan.model, plan.study.seed, plan.data.max_doc_tokens
    if m.source == "tiny":
        # Deferred (allow-listed in tests/unit/test_layers.py): the model's code loads torch and
        # transformers, which only the tiny seed needs; the projection and prepare's parser import
        # this module and build no model.
        from gradshare.model.lm import build_model, mean_nll, pretrain_seed, save_model

        model = build_model(model_config(m.config, vocab_size=len(tokenizer)), seed)
        before = [r["nll_nats"] for r in mean_nll(model, tokenizer, probes, max_tok)]
        losses = pretrain_seed(model, tokenizer, pretrain_docs, m.pretrain_steps, m.pretrain_batch_docs,
                               m.pretrain_lr, max_tok, seed, log)
        after = [r["nll_nats"] for r in mean_nll(model, tokenizer, probes, max_tok)]
        save_model(model, None, out)
        return {"kind": "tiny-pretrained", "config": m.config,
                "parameters": sum(p.numel() for p in model.parameters()),
                "probe_nll_untrained": sum(before) / len(before),
                "probe_nll_seed": sum(after) / len(after), "pretrain_final_loss": losses[-1]}
    if m.source.startswith("hf:"):
        src = Path(m.source[3:])
        return {"kind": "local-hf", "path": str(src), "files": entries(src),
                "warning": None}
    if m.source.startswith("random-"):
        return {"kind": "random-init", "config": m.config, "seed": seed,
                "warning": "randomly initialised weights: throughput work only, not a quality verdict"}
    raise ValueError(f"model.source={m.source!r} is not tiny, hf:/dir or random-qwen3-1.7b")


def workload_of(plan: Plan, log=print) -> dict:
    """`plan`'s workload record as prepare writes it (`inputs/workload.json`), its inputs built
    here in a temporary folder by this module's own code; kept after the first build for the same
    plan, code and tokenizer libraries (`gradshare.util.kept`)."""
    def build() -> dict:
        with tempfile.TemporaryDirectory(prefix="gradshare-workload-") as tmp:
            build_inputs(plan, Path(tmp) / "inputs", log=lambda *a: None)
            return json.loads((Path(tmp) / "inputs" / WORKLOAD).read_text())

    return kept("workload", {"plan_sha256": plan.sha256()}, build, libraries=("tokenizers", "transformers"), log=log)
