"""Entry point `train`: one arm of the study, 128 updates, every step metered
(`gradshare.steps.train.train_arm`).

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

from entrypoints.common import parse, study_parser
from gradshare.steps import train as T
from gradshare.tracking import connection
from gradshare.train.launch import Launch, launch_problem


def main(argv=None) -> None:
    ap = study_parser(__doc__)
    ap.add_argument("--arm", required=True, help="an arm of the study's plan (its arms.rows); "
                    "the step refuses any other, naming them")
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
    T.train_arm(args.study, args.arm, launch, args.full_state_every, args.resume_from or None)


if __name__ == "__main__":
    main()
