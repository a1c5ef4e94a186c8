"""`prepare`: build every input of the study (`gradshare.inputs.build`), and register it in MLflow.

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

import contextlib
import errno
import os
import shutil
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

from gradshare.contract.errors import StudyError
from gradshare.contract.metrics import seed_metrics
from gradshare.contract.plan import PLAN_FILE, Plan, load_plan, plan_json
from gradshare.contract.tags import DEVICE_NOTE, INPUT_SHA, INPUTS_SHA, PLAN_SHA, PRICE_WARNING, SEED_MODEL
from gradshare.cost.prices import refreshed_price
from gradshare.inputs.build import build_inputs
from gradshare.model.source import MODEL_SHAPES, parameter_shapes
from gradshare.tracking import connection, study_runs
from gradshare.tracking.figures import START_PARAM
from gradshare.util.jsonio import read_jsonl


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
    mlflow.log_text(plan_json(plan), PLAN_FILE)
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
        mlflow.log_input(ds, context=context, tags={INPUT_SHA: sha[path]})
    seed = manifest["seed_model"]
    mlflow.log_metrics(seed_metrics(seed))
    mlflow.set_tag(INPUTS_SHA, manifest["inputs_sha256"])
    mlflow.set_tag(SEED_MODEL, seed["kind"])


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

    from mlflow.data.artifact_dataset_sources import (
        _create_dataset_source_for_artifact_repo,
    )
    from mlflow.data.dataset_source_registry import (
        get_registered_sources,
        register_dataset_source,
    )
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


def prepare_study(study: str, profile: str, overrides: dict[str, str], run) -> Plan:
    """The prepare step in its run (`run`, open): refused where the study is prepared already;
    else the study's clock starts, the plan is priced and hashed, every input is built, hashed
    and logged, and a plan whose arms need GPUs this machine lacks says so. Returns the plan."""
    import mlflow

    existing = [r for r in study_runs.search(study, "prepare", status="FINISHED") if r.info.run_id != run.info.run_id]
    if existing:
        raise StudyError(
            f"study {study!r} is already prepared (run {existing[0].info.run_id}); its inputs are "
            f"pre-registered and are not regenerated. Start a new study with -P new_study=true "
            f"(archives this one) or choose another -P study=NAME")

    # the study's clock (deadline, budget) starts here
    mlflow.log_param(START_PARAM, f"{time.time():.3f}")
    plan = load_plan(profile, overrides)
    plan = _priced(plan, overrides)
    mlflow.set_tag(PLAN_SHA, plan.sha256())
    inputs = scratch_dir()
    try:
        try:
            manifest = build_inputs(plan, inputs)
        except Exception as exc:  # noqa: BLE001 - a full disk is named; anything else goes on as it was
            if no_space(exc):
                raise StudyError(f"disk: the disk of {inputs} is full ({shutil.disk_usage(inputs).free:,} bytes free) "
                                 f"while prepare built the study's inputs ({connection.one_line(exc)[:300]}): free "
                                 f"space there, or point TMPDIR at a larger disk; nothing was prepared") from None
            raise
        try:
            with few_retries():
                log_prepare_run(plan, inputs, manifest)
        except Exception as exc:  # noqa: BLE001 - a store that answers but refuses: named, its part removed
            if connection.unreachable() is not None:
                raise  # the server went away: the step's run says so (`study_runs.study_run`)
            removed, kept = remove_artifacts(run.info.run_id)
            part = (f"the {removed:,} bytes of them it had taken were removed" if kept is None else
                    f"what it had taken could not be removed ({kept}): the run's artifacts are partial")
            raise StudyError(f"store: the artifact store refused the study's inputs ({connection.one_line(exc)[:300]}); "
                             f"{part}; nothing was prepared: make room in the store and prepare again") from None
    finally:
        shutil.rmtree(inputs, ignore_errors=True)
    print(f"[gradshare] prepared study {study!r}: plan_sha256 {plan.sha256()}, "
          f"run {run.info.run_id}")
    if note := device_note(plan):
        print(note, flush=True)
        mlflow.set_tag(DEVICE_NOTE, note)
    return plan


@contextlib.contextmanager
def few_retries(retries: int = 2):
    """MLflow's client retries a refused request (HTTP 500: a full artifact store) seven times with
    doubling waits, minutes a file; here a couple of times, so that a store that cannot take the
    inputs is told within seconds (read by MLflow at every request)."""
    key = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
    old = os.environ.get(key)
    os.environ[key] = str(retries)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def no_space(exc: BaseException) -> bool:
    """Whether `exc` is a full disk: ENOSPC, or a library's error that says it in words
    (safetensors' `SafetensorError: ... No space left on device`)."""
    while exc is not None:
        if getattr(exc, "errno", None) == errno.ENOSPC or "No space left on device" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def remove_artifacts(run_id: str) -> tuple[int, str | None]:
    """Every artifact of the run removed from its store: (the bytes they held, None), or (0, why
    not) where the store would not list or delete them."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    c = connection.client()

    def size(path: str | None) -> int:
        return sum(size(f.path) if f.is_dir else (f.file_size or 0) for f in c.list_artifacts(run_id, path))

    try:
        held = size(None)
        get_artifact_repository(c.get_run(run_id).info.artifact_uri).delete_artifacts()
    except Exception as exc:  # noqa: BLE001 - the refusal is what the user must see
        return 0, connection.one_line(exc)[:200]
    return held, None


def device_note(plan) -> str | None:
    """One line where the plan's arms need GPUs this machine lacks: prepare itself runs anywhere,
    and says so instead of leaving the surprise to train."""
    if plan.hardware.device != "cuda":
        return None
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    a = plan.arms
    need = {arm: a.processes(arm) for arm in a.names}
    if have >= max(need.values()):
        return None
    arms = ", ".join(f"{arm} {n} GPU{'s' if n > 1 else ''}" for arm, n in need.items())
    return (f"[gradshare] note: this plan's arms run on CUDA GPUs ({arms}; a two-GPU arm may use two hosts with "
            f"one each) and this machine has {have}: prepare is done here, train the arms where the GPUs are")


def _priced(plan, overrides: dict):
    """With `infra.refresh_prices`, the plan carries the AWS Price List API's price and date, or
    the declared ones with a warning; the run records which (`price_source`)."""
    import mlflow

    if not plan.infra.refresh_prices:
        mlflow.log_param("price_source", "declared in the plan")
        return plan

    usd, date, warning = refreshed_price(plan)
    if warning:
        print(f"[gradshare] warning: {warning}", flush=True)
        mlflow.set_tag(PRICE_WARNING, warning)
        mlflow.log_param("price_source", "declared in the plan (the Price List API did not answer)")
        return plan
    mlflow.log_param("price_source", f"AWS Price List API, {date}")
    print(f"[gradshare] {plan.infra.instance_type}: ${usd}/h from the AWS Price List API ({date})", flush=True)
    return load_plan(plan.study.profile, {**overrides, "infra.usd_per_host_hour": str(usd), "infra.price_date": date})
