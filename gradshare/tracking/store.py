"""Reading a study back from the tracking store: the one way every step gets what an
earlier step registered — the prepared plan, the verified inputs, the commitment and
the committed checkpoints. Each reader checks what it reads against the hash that was
registered with it and refuses, naming the run, when they differ.

    prep, plan = store.prepared_plan(study)
    inputs = store.verified_inputs(prep, plan, workdir, store.TRAIN_INPUTS)
    commit_run, commitment = store.commitment(study)
    ckpts = store.verified_checkpoints(commitment, workdir / "checkpoints")

Writing (runs, tags, claims) lives in `gradshare.tracking.study_runs` and `gradshare.tracking.claims`.
"""
from __future__ import annotations

import json
from pathlib import Path

from gradshare.contract.errors import Refusal, StudyError
from gradshare.contract.plan import (
    PLAN_FILE,
    Plan,
    PlanError,
    plan_from_json,
)
from gradshare.contract.tags import INPUTS_SHA, PLAN_SHA
from gradshare.tracking import connection, study_runs
from gradshare.tracking.orphans import COMMITMENT_FILE
from gradshare.util.hashing import (
    CheckpointError,
    checkpoint_sha256,
    checkpoint_side_files,
    file_entries,
    sha256_file,
    tree_sha256,
)

# What each step may read of the prepare run's inputs: train never sees the test set.
TRAIN_INPUTS = ("data/train_tasks.jsonl", "data/replay.jsonl", "schedule.json", "tokenizer", "seed_model")
SCORE_INPUTS = ("eval/test_tasks.jsonl", "eval/probes.jsonl", "tokenizer", "seed_model")


def prepared_plan(study: str) -> tuple[object, Plan]:
    """The study's prepare run and its plan, checked against the run's plan hash tag."""
    prep = study_runs.prepare_run(study)
    text = study_runs.read_text(prep.info.run_id, PLAN_FILE)
    try:
        plan = plan_from_json(text, f"{PLAN_FILE} of prepare run {prep.info.run_id}")
    except PlanError as exc:
        raise StudyError(f"{exc}; the study's inputs cannot be trusted: prepare a new study") from None
    if prep.data.tags.get(PLAN_SHA) != plan.sha256():
        raise StudyError(f"{PLAN_FILE} of prepare run {prep.info.run_id} does not hash to its registered "
                         f"plan_sha256; the study's inputs cannot be trusted: prepare a new study")
    return prep, plan


def verified_inputs(prep, plan: Plan, workdir: Path, wanted=TRAIN_INPUTS) -> Path:
    """Download `wanted` inputs of the prepare run `prep`; refuse on any byte the manifest
    does not register, and on a local seed model whose files differ from it."""
    manifest = json.loads(study_runs.download(prep.info.run_id, "inputs/manifest.json", workdir).read_text())
    if manifest["plan_sha256"] != plan.sha256():
        raise StudyError("inputs/manifest.json belongs to another plan: prepare a new study")
    registered = prep.data.tags.get(INPUTS_SHA)
    if tree_sha256(manifest["files"]) != manifest["inputs_sha256"] or manifest["inputs_sha256"] != registered:
        raise StudyError(f"inputs/manifest.json of prepare run {prep.info.run_id} does not hash to the "
                           f"registered {INPUTS_SHA}; refusing unregistered inputs")

    def chosen(path: str) -> bool:
        return any(path == w or path.startswith(w + "/") for w in wanted)

    for e in manifest["files"]:  # every name it gives stays inside the inputs, chosen or not
        connection.safe_artifact_path(e["path"])
    entries = {e["path"]: e for e in manifest["files"] if chosen(e["path"])}
    root = workdir / "inputs"
    for w in wanted:  # seed_model/ exists only where prepare built the seed model
        if any(p == w or p.startswith(w + "/") for p in entries):
            # MLflow places the artifact's last path component directly under dst.
            study_runs.download(prep.info.run_id, f"inputs/{w}", root / Path(w).parent)
    got = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    bad = sorted((set(entries) ^ got) | {p for p in set(entries) & got
                                         if sha256_file(root / p) != entries[p]["sha256"]})
    if bad:
        raise StudyError(f"input hash mismatch for {', '.join(bad[:5])}: these files differ from the "
                           f"prepare run's manifest; refusing to use unregistered inputs")
    # what each process that reads them checks again (`verify_again`): the bytes prepare registered
    (root / VERIFIED).write_text(json.dumps({p: e["sha256"] for p, e in sorted(entries.items())}, indent=1))
    seed = manifest["seed_model"]
    if seed["kind"] == "local-hf" and "seed_model" in wanted:
        local = file_entries(seed["path"]) if Path(seed["path"]).is_dir() else []
        if local != seed["files"]:
            raise StudyError(f"the local seed model {seed['path']} differs from the files prepare "
                               f"registered; refusing to use it")
    return root


VERIFIED = "verified.json"  # beside verified inputs: path -> the SHA-256 prepare registered


def verify_again(root: Path) -> None:
    """Every input `verified_inputs` put under `root`, hashed again where a later process reads it
    (an arm's workers, after launch): StudyError naming the first file that changed or went."""
    for path, sha in json.loads((root / VERIFIED).read_text()).items():
        f = root / path
        if not f.is_file() or sha256_file(f) != sha:
            state = "is gone" if not f.is_file() else "no longer hashes to what prepare registered"
            raise StudyError(f"{f} {state} (the arm's inputs changed after its launch)")


def commit_run(study: str):
    """The study's FINISHED commit run, or None."""
    runs = study_runs.search(study, "commit", status="FINISHED")
    return runs[0] if runs else None


def commitment(study: str) -> tuple[object, dict]:
    """The study's commit run and its commitment, or a refusal that says to commit first."""
    run = commit_run(study)
    if run is None:
        raise Refusal(f"study {study!r} is not committed: no test case is scored before every "
                        f"candidate is sealed. Run `mlflow run . -e commit --env-manager local "
                        f"-P study={study}` first")
    return run, json.loads(study_runs.read_text(run.info.run_id, COMMITMENT_FILE))


def checkpoint_files(run_id: str, workdir: Path) -> list[dict]:
    """The train run's checkpoint files other than its weights (config, tokenizer), as
    `{path, bytes, sha256}`: what the commitment seals beside the weights' content hash."""
    c, names, dirs = connection.client(), [], ["checkpoint"]
    while dirs:
        for a in c.list_artifacts(run_id, dirs.pop()):
            (dirs if a.is_dir else names).append(a.path)
    side = [n for n in names if not n.endswith(".safetensors")]
    for name in side:
        study_runs.download(run_id, name, workdir / Path(name).parent)
    return checkpoint_side_files(file_entries(workdir / "checkpoint")) if side else []


def verified_checkpoints(commitment: dict, root: Path) -> dict[str, Path]:
    """Download each committed FINISHED arm's checkpoint; refuse any that moved: weights
    whose content hash (`hashing.checkpoint_sha256`) differs from the one sealed, or (where
    the commitment seals them) a config or tokenizer file whose bytes differ."""
    out = {}
    for entry in commitment["arms"]:
        if entry["status"] != "FINISHED":
            continue
        path = study_runs.download(entry["run_id"], "checkpoint", root / connection.safe_artifact_path(entry["arm"]))
        what = f"checkpoint of arm {entry['arm']} (run {entry['run_id']})"
        try:
            got = checkpoint_sha256(path)
        except CheckpointError as exc:
            # the stored artifact, not this step's scratch copy of it; nothing scored: a refusal
            stored = f"runs:/{entry['run_id']}/checkpoint"
            raise Refusal(f"{what}, stored at {stored}, cannot be read: "
                          f"{str(exc).replace(str(path), stored)}; refusing to score") from None
        if got != entry["checkpoint_sha256"]:
            raise StudyError(
                f"{what} has weights that hash to {got[:16]}…, but the commitment sealed "
                f"{entry['checkpoint_sha256'][:16]}…: it changed after commit; refusing to score")
        if "checkpoint_files" in entry:
            sealed = {e["path"]: e for e in entry["checkpoint_files"]}
            now = {e["path"]: e for e in checkpoint_side_files(file_entries(path))}
            moved = sorted(p for p in sealed.keys() | now.keys() if sealed.get(p) != now.get(p))
            if moved:
                raise StudyError(f"{what}: {', '.join(moved)} differ from the files the commitment sealed "
                                   f"(the model is built from its config.json): it changed after commit; "
                                   f"refusing to score")
        out[entry["arm"]] = path
    return out
