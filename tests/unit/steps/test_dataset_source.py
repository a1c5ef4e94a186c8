"""The prepare run's data sets point at its own artifacts, and MLflow never has to guess how.

Handed a bare URI string, MLflow's dataset-source registry asks every registered source
whether it claims it and, when several do, warns (`warnings.warn`, category UserWarning)
"The specified dataset source can be interpreted in multiple ways". A SQLite store's
artifacts (a local path) are claimed twice; a tracking server's `mlflow-artifacts:` URIs by
nobody. `artifact_dataset_source` builds the source for the scheme instead.
"""
from __future__ import annotations

import logging
import warnings

import mlflow
import pytest

from gradshare.contract.plan import load_plan
from gradshare.inputs.build import build_inputs
from gradshare.steps.prepare import artifact_dataset_source, log_prepare_run
from tests.conftest import SMALL

AMBIGUOUS = "can be interpreted in multiple ways"

ARTIFACT_URIS = {
    "sqlite store, local path": "/data/mlruns/1/0123abcd/artifacts/inputs/data/train_tasks.jsonl",
    "file: URI": "file:///data/mlruns/1/0123abcd/artifacts/inputs/data/train_tasks.jsonl",
    "tracking server, proxied": "mlflow-artifacts:/1/0123abcd/artifacts/inputs/data/train_tasks.jsonl",
    "tracking server, http": "http://127.0.0.1:5000/api/2.0/mlflow-artifacts/artifacts/1/0123abcd/"
                             "artifacts/inputs/data/train_tasks.jsonl",
    "object store": "s3://bucket/mlruns/1/0123abcd/artifacts/inputs/data/train_tasks.jsonl",
}


def _source_uri(source) -> str:
    return source.to_dict().get("uri") or source.to_dict().get("url")


def test_a_bare_local_artifact_uri_is_what_makes_mlflow_guess():
    """The cause, shown: MLflow's own resolution of a local artifact path warns."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resolve_dataset_source(ARTIFACT_URIS["sqlite store, local path"])
    assert any(AMBIGUOUS in str(w.message) for w in caught)


@pytest.mark.parametrize("form", list(ARTIFACT_URIS))
def test_each_artifact_uri_form_gets_one_source_with_that_uri_and_no_warning(form, caplog):
    uri = ARTIFACT_URIS[form]
    import pandas as pd

    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.DEBUG, logger="mlflow"):
        warnings.simplefilter("always")
        source = artifact_dataset_source(uri)
        ds = mlflow.data.from_pandas(pd.DataFrame({"id": [1, 2]}), name="data/train_tasks.jsonl",
                                     source=source)
    assert _source_uri(ds.source) == uri
    assert [str(w.message) for w in caught if "source" in str(w.message).lower()] == []
    assert AMBIGUOUS not in caplog.text
    # The logged source reads back as the same kind, with the same URI.
    from mlflow.data.dataset_source_registry import get_dataset_source_from_json
    back = get_dataset_source_from_json(ds.source.to_json(), ds.source._get_source_type())
    assert _source_uri(back) == uri


def test_a_local_artifact_source_is_the_local_kind_and_a_proxied_one_loads_through_mlflow():
    assert artifact_dataset_source(ARTIFACT_URIS["sqlite store, local path"])._get_source_type() == "local"
    assert artifact_dataset_source(ARTIFACT_URIS["tracking server, http"])._get_source_type() == "http"
    proxied = artifact_dataset_source(ARTIFACT_URIS["tracking server, proxied"])
    assert proxied._get_source_type() == "mlflow-artifacts"
    # Built twice, registered once.
    from mlflow.data.dataset_source_registry import get_registered_sources
    artifact_dataset_source(ARTIFACT_URIS["tracking server, proxied"])
    assert [s._get_source_type() for s in get_registered_sources()].count("mlflow-artifacts") == 1


@pytest.fixture(scope="module")
def small_inputs(tmp_path_factory):
    plan = load_plan("tiny", {**SMALL, "model.pretrain_steps": "1"})  # the seed's quality is not read here
    inputs = tmp_path_factory.mktemp("inputs") / "inputs"
    manifest = build_inputs(plan, inputs, log=lambda *_: None)
    return plan, inputs, manifest


def _log_and_capture(plan, inputs, manifest, experiment_id, caplog):
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.DEBUG, logger="mlflow"):
        warnings.simplefilter("always")
        with mlflow.start_run(experiment_id=experiment_id) as run:
            log_prepare_run(plan, inputs, manifest)
            artifact_root = mlflow.get_artifact_uri("inputs")
    messages = [str(w.message) for w in caught] + [caplog.text]
    return mlflow.get_run(run.info.run_id), artifact_root, messages


def _assert_sources_point_at_the_inputs(run, artifact_root):
    logged = {d.dataset.name: d.dataset for d in run.inputs.dataset_inputs}
    assert set(logged) == {"data/train_tasks.jsonl", "data/replay.jsonl", "eval/test_tasks.jsonl",
                           "eval/probes.jsonl"}
    for name, dataset in logged.items():
        source = mlflow.data.get_source(dataset)
        assert _source_uri(source) == f"{artifact_root}/{name}"


def test_prepare_logging_on_a_sqlite_store_never_warns_about_the_dataset_source(
        small_inputs, tmp_path, monkeypatch, caplog):
    plan, inputs, manifest = small_inputs
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        exp = mlflow.create_experiment("dataset-source", artifact_location=str(tmp_path / "artifacts"))
        run, artifact_root, messages = _log_and_capture(plan, inputs, manifest, exp, caplog)
        assert not any(AMBIGUOUS in m for m in messages), messages
        assert artifact_root.startswith(str(tmp_path / "artifacts"))
        _assert_sources_point_at_the_inputs(run, artifact_root)
    finally:
        mlflow.set_tracking_uri(previous)


def test_prepare_logging_on_a_tracking_server_keeps_the_proxied_artifact_as_source(
        small_inputs, mlflow_server, caplog):
    plan, inputs, manifest = small_inputs
    exp = mlflow.create_experiment("dataset-source-server")
    run, artifact_root, messages = _log_and_capture(plan, inputs, manifest, exp, caplog)
    assert not any(AMBIGUOUS in m for m in messages), messages
    assert artifact_root.startswith("mlflow-artifacts:/")
    _assert_sources_point_at_the_inputs(run, artifact_root)
