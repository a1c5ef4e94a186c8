"""`gradshare guard`: stop the study's EC2 instances at its deadline, whatever else happens.

    gradshare guard --study gradshare-full            # waits until the deadline, then stops them
    gradshare guard --study gradshare-full --now      # stops them at once

The instances and region are the plan's (`infra.instance_ids`, `infra.aws_region`); the
deadline is the study's start (prepare) + `infra.deadline_hours`. `study` starts a guard in
a session of its own when the plan names instances, so that a study that dies still has
its hosts stopped. The guard is an MLflow run of the study (step `guard`): RUNNING while it
waits, then FINISHED with the stop request's answer (each instance's state before and after)
in its tags and `guard.json`, or FAILED with the reason. Credentials come only from boto3's
standard chain (environment, profile, instance role) and are never logged; the endpoint may
be redirected with `AWS_ENDPOINT_URL` (the tests point it at a local moto server).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

from gradshare.contract.tags import GUARD
from gradshare.cost import limits
from gradshare.tracking import figures, store, study_runs


def stop_instances(region: str, instance_ids: list[str]) -> list[dict]:
    import boto3

    ec2 = boto3.client("ec2", region_name=region)
    resp = ec2.stop_instances(InstanceIds=list(instance_ids))
    return [{"instance_id": s["InstanceId"], "before": s["PreviousState"]["Name"], "after": s["CurrentState"]["Name"]}
            for s in resp["StoppingInstances"]]


def guard(study: str, now: bool = False, poll_s: float = 30.0, log=print) -> list[dict]:
    import mlflow

    study_runs.setup(study, create=False)
    prep, plan = store.prepared_plan(study)
    i = plan.infra
    if not i.instance_ids:
        raise SystemExit("guard: the plan names no instances (infra.instance_ids): nothing to stop")
    deadline = figures.study_start(prep) + i.deadline_hours * 3600
    with study_runs.study_run(study, "guard", run_name="guard"):
        mlflow.log_params({"instance_ids": ",".join(i.instance_ids), "region": i.aws_region,
                           "deadline_epoch_s": f"{deadline:.0f}"})
        log(f"[gradshare] guard: stopping {', '.join(i.instance_ids)} in {i.aws_region} at "
            f"{limits._utc(deadline)}" + (" (now: --now)" if now else ""), flush=True)
        while not now and (left := deadline - time.time()) > 0:
            time.sleep(min(poll_s, left))
        states = stop_instances(i.aws_region, list(i.instance_ids))
        mlflow.log_dict({"stopped_at_epoch_s": time.time(), "instances": states}, "guard.json")
        mlflow.set_tag(GUARD, "stopped " + ", ".join(f"{s['instance_id']}:{s['after']}" for s in states))
        log(f"[gradshare] guard: {states}", flush=True)
        return states


def start_detached(study: str) -> subprocess.Popen:
    """A guard that outlives the process that starts it (its own session, output to a log)."""
    log = open(f"guard-{study}.log", "a")
    return subprocess.Popen([sys.executable, "-m", "entrypoints.guard", "--study", study], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True, env=dict(os.environ))
