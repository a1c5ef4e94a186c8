"""AWS through boto3, against a moto server on 127.0.0.1 (never an account): the guard stops
the study's instances at its deadline; prepare falls back to the declared price with a warning
where the Price List API is not served; a study's artifacts in S3 through a tracking server
started with `--artifacts-destination s3://...`. (The Price List API through botocore's Stubber:
tests/unit/cost/test_prices.py.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import boto3
import mlflow
import pytest

from gradshare.contract.plan import load_plan
from gradshare.contract.tags import STEP
from gradshare.tracking import study_runs
from tests.conftest import REPO, free_port, overrides, run_entry, wait_until_serving

pytestmark = pytest.mark.e2e

REGION = "us-east-1"
FAKE_KEY, FAKE_SECRET = "AKIAGRADSHARETESTKEY", "gradshare-test-secret-never-logged"


@pytest.fixture(scope="module")
def moto_endpoint():
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    url = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                             "AWS_DEFAULT_REGION")}
    os.environ.update({"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": FAKE_KEY,
                       "AWS_SECRET_ACCESS_KEY": FAKE_SECRET, "AWS_DEFAULT_REGION": REGION})
    yield url
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


def _instances(n: int) -> list[str]:
    ec2 = boto3.client("ec2", region_name=REGION)
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    made = ec2.run_instances(ImageId=image, MinCount=n, MaxCount=n, InstanceType="g6e.2xlarge")
    return [i["InstanceId"] for i in made["Instances"]]


def _states(ids: list[str]) -> dict[str, str]:
    ec2 = boto3.client("ec2", region_name=REGION)
    res = ec2.describe_instances(InstanceIds=ids)["Reservations"]
    return {i["InstanceId"]: i["State"]["Name"] for r in res for i in r["Instances"]}


def test_the_guard_stops_the_studys_instances_at_a_shortened_deadline(mlflow_server, moto_endpoint):
    ids = _instances(2)
    assert set(_states(ids).values()) == {"running"}
    study = "guarded-study"
    # a deadline 25 s after prepare starts: prepare takes some of it, the guard waits the rest
    run_entry("prepare", "--study", study, *overrides({"infra.deadline_hours": f"{25 / 3600:.8f}",
                                                       "infra.aws_region": REGION, "model.pretrain_steps": "1",
                                                       "infra.instance_ids": ",".join(ids)}))
    t0 = time.time()
    guard = subprocess.run([sys.executable, "-m", "entrypoints.guard", "--study", study, "--poll-s", "1"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert guard.returncode == 0, guard.stderr[-2000:]
    [prep] = study_runs.search(study, "prepare")
    deadline = float(prep.data.params["study_start_epoch_s"]) + 25
    assert time.time() >= deadline - 1 and time.time() - t0 < 60  # it waited for the deadline, no longer
    assert set(_states(ids).values()) <= {"stopping", "stopped"}
    [run] = study_runs.search(study, "guard", status="FINISHED")
    assert all(i in run.data.tags["gradshare.guard"] for i in ids)
    # nothing of the credentials reached the store
    blob = json.dumps([run.data.params, run.data.tags, prep.data.params, prep.data.tags])
    assert FAKE_KEY not in blob and FAKE_SECRET not in blob


def test_a_guard_without_instances_refuses_in_one_line(prepared_study):
    proc = subprocess.run([sys.executable, "-m", "entrypoints.guard", "--study", prepared_study, "--now"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "names no instances (infra.instance_ids)" in proc.stderr


def test_prepare_records_a_refreshed_price_or_the_fallback_and_why(mlflow_server, moto_endpoint):
    # moto serves no Price List API: prepare falls back, says so, and the plan keeps the declared price
    study = "priced-study"
    proc = run_entry("prepare", "--study", study, *overrides({"infra.refresh_prices": "true",
                                                              "model.pretrain_steps": "1"}))
    assert "price not refreshed" in proc.stdout + proc.stderr
    [prep] = study_runs.search(study, "prepare", status="FINISHED")
    assert prep.data.params["price_source"].startswith("declared")
    assert "price not refreshed" in prep.data.tags["gradshare.price_warning"]
    assert float(prep.data.params["infra.usd_per_host_hour"]) == load_plan("tiny", {}).infra.usd_per_host_hour


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory, moto_endpoint):
    """A tracking server whose artifacts live in a (moto) S3 bucket; clients see only HTTP."""
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket="gradshare-artifacts")
    root = tmp_path_factory.mktemp("s3-server")
    port = free_port()
    env = {**os.environ, "MLFLOW_S3_ENDPOINT_URL": moto_endpoint}
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--backend-store-uri", f"sqlite:///{root}/mlflow.db", "--artifacts-destination",
                             "s3://gradshare-artifacts/studies", "--workers", "1"], env=env, cwd=root,
                            stdout=open(root / "server.log", "w"), stderr=subprocess.STDOUT)
    uri = f"http://127.0.0.1:{port}"
    wait_until_serving(proc, uri, root / "server.log")
    yield uri
    proc.terminate()
    proc.wait(timeout=30)


def test_a_studys_artifacts_round_trip_through_s3_and_the_analysis_reads_them(s3_server, tmp_path):
    """Prepare, the single arm, commit, score: every artifact in the bucket; then the analysis,
    run through the server, reads them back. (The other arms' artifacts take the same path; the
    whole study from the README's first command runs in tests/e2e/test_newcomer.py.)"""
    study = "s3-study"
    # the clients know only the tracking server: no AWS endpoint or credentials in their environment
    env = {"MLFLOW_TRACKING_URI": s3_server, "AWS_ENDPOINT_URL": "", "AWS_ACCESS_KEY_ID": "",
           "AWS_SECRET_ACCESS_KEY": ""}
    run_entry("prepare", "--study", study, *overrides({"model.pretrain_steps": "1"}), env=env)
    run_entry("train", "--study", study, "--arm", "single", env=env)
    run_entry("commit", "--study", study, env=env)
    run_entry("score", "--study", study, env=env)
    run_entry("analyze", "--study", study, env=env)  # reads every input back through the server
    keys = [o["Key"] for page in boto3.client("s3", region_name=REGION).get_paginator("list_objects_v2")
            .paginate(Bucket="gradshare-artifacts", Prefix="studies/") for o in page.get("Contents", [])]
    for artifact in ("inputs/manifest.json", "checkpoint/model.safetensors", "commitment.json",
                     "per_case/test.jsonl", "report.md", "verdicts.json"):
        assert any(k.endswith(artifact) for k in keys), (artifact, keys)
    client = mlflow.MlflowClient(s3_server)
    [run] = client.search_runs([client.get_experiment_by_name(study).experiment_id],
                               f"tags.`{STEP}` = 'analyze' and attributes.status = 'FINISHED'")
    got = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path)))
    v = json.loads((got / "verdicts.json").read_text())
    assert v["arms"]["single"]["status"] == "FINISHED" and v["arms"]["single"]["accuracy"] is not None
    assert "unavailable" in v["arms"]["dense"]["failure_reason"]
    assert (got / "report.md").read_text().startswith(f"# gradshare report — study `{study}`")
