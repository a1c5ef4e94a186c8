"""`prepare`: build every input of the study, hash it, and register it in MLflow.

Layout of the inputs (the prepare run's artifacts under `inputs/`):
    data/train_tasks.jsonl   3,072 generated training tasks (documents)
    data/replay.jsonl        1,024 conversation-replay documents
    data/pretrain.jsonl      tiny profile: conversations the seed model was pre-trained on
    eval/test_tasks.jsonl    1,024 final-test cases (read only by `score`)
    eval/probes.jsonl        128 retention probes (exposed during pre-training)
    schedule.json            128 x 32 document ids, per-update target-token counts and hashes
    workload.json            per update: input tokens, and padded tokens and micro-batches of
                             one rank of a one- and a two-rank arm (`gradshare.workload`)
    tokenizer/               the tokenizer
    seed_model/              tiny profile: the pre-trained seed model (safetensors)
    manifest.json            path, bytes, SHA-256 of every file above; numerical sources
plus `plan.json` at the run's root. Two prepares of the same plan give identical bytes.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from gradshare.data import documents as D
from gradshare.data.replay import load_conversations, select_documents
from gradshare.data.schedule import build_schedule, update_sha256
from gradshare.data.tasks import generate_splits
from gradshare.data.tokenizer import load_tokenizer, train_bpe
from gradshare.hashing import file_entries, read_jsonl, tree_sha256, write_json, write_jsonl
from gradshare.metrics import seed_metrics
from gradshare.plan import Plan
from gradshare.model import MODEL_SHAPES, parameter_shapes
from gradshare.sources import numerical_sources, set_determinism
from gradshare.workload import WORKLOAD
from gradshare.workload import describe as describe_workload


def build_inputs(plan: Plan, out: str | Path, log=print) -> dict:
    """Write every input of the study under `out`; returns the manifest."""
    import torch

    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    seed, d = plan.study.seed, plan.data
    set_determinism(plan.hardware.deterministic)
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
    from gradshare.hashing import file_entries as entries
    from gradshare.model import build_model, mean_nll, model_config, pretrain_seed, save_model

    m, seed, max_tok = plan.model, plan.study.seed, plan.data.max_doc_tokens
    if m.source == "tiny":
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


def _params_not_yet_logged(flat: dict[str, str]) -> dict[str, str]:
    """The plan's parameters less those the run already holds with the same value. Launched by
    `mlflow run . -e prepare -P link.rate_mbit=50`, MLflow logs `50` before prepare starts; the
    plan's `50.0` would then be refused as a changed value (plan.json holds the canonical one).
    A value that really differs is left in, so that MLflow refuses it."""
    import mlflow

    held = mlflow.get_run(mlflow.active_run().info.run_id).data.params
    return {k: v for k, v in flat.items() if k not in held or not _same_value(held[k], v)}


def _same_value(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return float(a) == float(b)
    except ValueError:
        return False


def log_prepare_run(plan: Plan, inputs: Path, manifest: dict) -> None:
    """Parameters, plan.json, inputs/ (with manifest.json), data sets with full SHA-256."""
    import mlflow
    import pandas as pd

    mlflow.log_params(_params_not_yet_logged(plan.flat()))
    mlflow.log_dict(json.loads(plan.canonical_json()) | {"plan_sha256": plan.sha256()}, "plan.json")
    # for each arm's budget check, which would otherwise load transformers to build it (~5 s)
    mlflow.log_dict({"shapes": [list(s) for s in parameter_shapes(plan)]}, MODEL_SHAPES)
    mlflow.log_artifacts(str(inputs), "inputs")
    sha = {e["path"]: e["sha256"] for e in manifest["files"]}
    for path, context in (("data/train_tasks.jsonl", "training"), ("data/replay.jsonl", "training"),
                          ("eval/test_tasks.jsonl", "test"), ("eval/probes.jsonl", "retention")):
        df = pd.DataFrame(read_jsonl(inputs / path))
        source = artifact_dataset_source(mlflow.get_artifact_uri(f"inputs/{path}"))
        ds = mlflow.data.from_pandas(df, name=path, source=source)
        # MLflow's own digest is 8 hex characters over 10,000 rows: not enough to pre-register.
        mlflow.log_input(ds, context=context, tags={"gradshare.sha256": sha[path]})
    seed = manifest["seed_model"]
    mlflow.log_metrics(seed_metrics(seed))
    mlflow.set_tag("gradshare.inputs_sha256", manifest["inputs_sha256"])
    mlflow.set_tag("gradshare.seed_model", seed["kind"])


def artifact_dataset_source(uri: str):
    """The dataset source of one of the prepare run's artifacts, chosen by the URI's scheme.

    Handed a bare string, `mlflow.data.from_pandas` asks every registered dataset source
    whether it claims it, and warns when more than one does: a local path or `file:` URI
    (a SQLite store's artifacts) is claimed by two identical `local` sources, one per
    scheme, while `mlflow-artifacts:` (a tracking server's proxied artifacts) is claimed by
    none. So the source is built here for the scheme the store gave, keeping `uri` as is:
    `http(s)` -> MLflow's HTTP source; a scheme with a registered artifact source (`local`,
    `s3`, `gs`, ...) -> that source; any other artifact scheme -> a source of the same kind
    as MLflow's artifact sources (its `load` downloads through the artifact repository),
    registered once so that `mlflow.data.get_source` can read it back.
    """
    from urllib.parse import urlparse

    from mlflow.data.artifact_dataset_sources import _create_dataset_source_for_artifact_repo
    from mlflow.data.dataset_source_registry import get_registered_sources, register_dataset_source
    from mlflow.data.http_dataset_source import HTTPDatasetSource
    from mlflow.utils.uri import is_local_uri

    scheme = urlparse(uri).scheme
    if scheme in ("http", "https"):
        return HTTPDatasetSource(uri)
    kind = "local" if is_local_uri(uri, is_tracking_or_registry_uri=False) else scheme
    for cls in reversed(get_registered_sources()):  # the last registered takes precedence, as in MLflow
        if cls._get_source_type() == kind:
            return cls(uri)
    name = "".join(part.capitalize() for part in kind.replace("_", "-").split("-")) + "ArtifactDatasetSource"
    cls = _create_dataset_source_for_artifact_repo(scheme=kind, dataset_source_name=name)
    register_dataset_source(cls)
    return cls(uri)


def archive_existing_study(study: str) -> str | None:
    """Rename an existing study's experiment (with its runs) out of the way so that a new one starts clean."""
    import mlflow

    exp = mlflow.get_experiment_by_name(study)
    # The run a launcher made for this very command may already be there: it is not the old study.
    launcher = os.environ.get("MLFLOW_RUN_ID")
    runs = [] if exp is None else mlflow.MlflowClient().search_runs([exp.experiment_id], max_results=2)
    if not [r for r in runs if r.info.run_id != launcher]:
        return None  # nothing to keep apart: an empty experiment is simply reused
    new_name = f"{study}@archived-{time.strftime('%Y%m%dT%H%M%S')}"
    mlflow.MlflowClient().rename_experiment(exp.experiment_id, new_name)
    return new_name


def scratch_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="gradshare-inputs-"))
