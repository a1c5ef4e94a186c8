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

import argparse

from gradshare.cost.guard import guard


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="gradshare guard", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", default="gradshare-tiny")
    ap.add_argument("--now", action="store_true", help="stop the instances at once")
    ap.add_argument("--poll-s", type=float, default=30.0)
    args = ap.parse_args(argv)
    guard(args.study, args.now, args.poll_s)


if __name__ == "__main__":
    main()
