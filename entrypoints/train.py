"""Entry point `train`: one arm of the study, 128 updates, every step metered.

    mlflow run . -e train --env-manager local --experiment-name gradshare-tiny -P arm=single
    mlflow run . -e train --env-manager local --experiment-name gradshare-tiny -P arm=dense
    mlflow run . -e train --env-manager local --experiment-name gradshare-tiny -P arm=powersgd
    # two hosts, one GPU each (run on both, machine_rank 0 and 1):
    mlflow run . -e train --env-manager local -P arm=powersgd -P num_machines=2 \\
        -P machine_rank=0 -P main_process_ip=10.0.0.5 -P main_process_port=29500

    # full-state checkpoints every 40 updates; a stopped arm continues in its own run from the last
    mlflow run . -e train --env-manager local -P arm=powersgd -P full_state_every=40
    mlflow run . -e train --env-manager local -P arm=powersgd -P resume_from=<run id>

The arm's processes are started with `accelerate launch` (gloo on CPU, NCCL on GPU).
Launch parameters that cannot work (`gradshare.train.launch`: a machine_rank outside
0..num_machines-1, a port outside 0..65535, a negative full_state_every) are refused
before any run, naming the parameter and the values it may take.
A run that cannot start, diverges or is stopped ends FAILED with gradshare.failure_reason.
A resume is checked first (the run is a stopped attempt of the arm, the study is not
committed, its newest full state is complete and every byte matches its manifest); a
resume that cannot be made is recorded as a refusal of its own and the stopped run is
left as it was.
"""
from __future__ import annotations

import logging
import os

from entrypoints.common import parse, study_parser
from gradshare.contract import metrics as M
from gradshare.contract.errors import Refusal, StudyError
from gradshare.contract.plan import ARM_KINDS
from gradshare.contract.tags import FAILURE, REFUSAL, RESUMED_RUN, RUN_NAME, STEP, STUDY
from gradshare.tracking import clock, connection, study_runs
from gradshare.tracking.orphans import process_tags
from gradshare.train.driver import Launch, check_resume, run_arm, run_secondary_host
from gradshare.train.launch import launch_problem


def main(argv=None) -> None:
    ap = study_parser(__doc__)
    ap.add_argument("--arm", required=True, choices=ARM_KINDS)
    ap.add_argument("--num-machines", type=int, default=1)
    ap.add_argument("--machine-rank", type=int, default=0)
    ap.add_argument("--main-process-ip", default="127.0.0.1")
    ap.add_argument("--main-process-port", type=int, default=0)
    ap.add_argument("--full-state-every", type=int, default=0, help="full-state checkpoint every N updates")
    ap.add_argument("--resume-from", default="", help="run id of a stopped attempt of this arm")
    args, _ = parse(ap, argv, overrides_allowed=False)

    if problem := launch_problem(vars(args)):  # before any run: a bad launch is refused, not attempted
        name, text = problem
        ap.error(f"argument --{name.replace('_', '-')}: {text}")

    connection.stop_on_sigterm()

    launch = Launch(args.num_machines, args.machine_rank, args.main_process_ip, args.main_process_port)
    if launch.machine_rank > 0:  # only machine rank 0 owns the arm's MLflow run
        _secondary_host(args.study, args.arm, launch)
        return
    resume = None
    if args.resume_from:
        resume = _checked_resume(args.study, args.arm, args.resume_from)
        os.environ["MLFLOW_RUN_ID"] = args.resume_from  # the stopped run, reopened: one run per attempt
    import mlflow

    # MLflow's system metrics: a sample every 2 s, each logged as taken (its defaults, 10 s and
    # one sample, leave an arm shorter than 10 s without any)
    mlflow.set_system_metrics_sampling_interval(2)
    mlflow.set_system_metrics_samples_before_logging(1)
    # ... and without its INFO lines at each start and stop ("Skip logging GPU metrics", ...)
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
    with study_runs.study_run(args.study, "train", arm=args.arm, run_name=f"train-{args.arm}",
                     system_metrics=True) as run:
        summary = run_arm(args.study, args.arm, run, launch, args.full_state_every, resume)
        if summary:
            m = summary["metrics"]
            print(f"[gradshare] arm {args.arm} FINISHED: final loss {m[M.FINAL_LOSS]:.4f}, "
                  f"active {m[M.ACTIVE_S]:.1f}s, {m[M.ACTIVE_TOKENS_PER_S]:,.0f} tok/s, "
                  f"checkpoint {summary['checkpoint_sha256'][:16]}…")


def _secondary_host(study: str, arm: str, launch: Launch) -> None:
    """Machine rank > 0: this host's workers, no run of its own. The run `mlflow run` made for
    it says what it is (`train-<arm>-host<rank>`) and that its process lives; a clock behind the
    study's is refused on it, as on every step's run."""
    exp_id = study_runs.setup(study, create=False)
    launcher = os.environ.get("MLFLOW_RUN_ID")
    name = f"train-{arm}-host{launch.machine_rank}"
    if launcher:  # a launcher's run for this host: say what it is and that it lives
        tags = study_runs.study_tags(study, "train-host", "", arm) | process_tags() | {RUN_NAME: name}
        for key, value in tags.items():
            connection.client().set_tag(launcher, key, value)
    try:
        clock.check(exp_id, exclude={launcher} if launcher else set())
    except Refusal as exc:
        if launcher:  # KILLED and tagged, as every refused step's run
            c = connection.client()
            for key, value in {FAILURE: str(exc), REFUSAL: "true", RUN_NAME: f"refused-{name}"}.items():
                c.set_tag(launcher, key, value)
            c.set_terminated(launcher, "KILLED")
        raise SystemExit(f"[gradshare] train host {launch.machine_rank} refused: {exc}") from None
    try:
        run_secondary_host(study, arm, launch)
    except StudyError as exc:
        raise SystemExit(f"[gradshare] train host {launch.machine_rank} FAILED: {exc}") from None


def _checked_resume(study: str, arm: str, run_id: str):
    """The verified resume, or a refusal recorded on a run of its own (the launcher's, if
    `mlflow run` made one) while the stopped run stays untouched."""

    study_runs.setup(study, create=False)
    try:
        resume = check_resume(study, arm, run_id)
    except Refusal as exc:
        with study_runs.study_run(study, "train", arm=arm, run_name=f"train-{arm}"):
            raise exc
    launcher = os.environ.pop("MLFLOW_RUN_ID", None)
    if launcher and launcher != run_id:  # `mlflow run` made a run for this command: it only points
        c = connection.client()
        c.set_tag(launcher, STUDY, study)
        c.set_tag(launcher, STEP, "train-resume")
        c.set_tag(launcher, RUN_NAME, f"train-{arm}-resume")  # it only points at the run it resumed
        c.set_tag(launcher, RESUMED_RUN, run_id)
        c.set_terminated(launcher, "FINISHED")
    return resume


if __name__ == "__main__":
    main()
