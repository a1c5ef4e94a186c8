"""Entry point `preflight`: measure the study's hosts before any arm (`gradshare.steps.preflight`).

    mlflow run . -e preflight --env-manager local -P study=S                    # one host
    # two hosts, the arms' own launch parameters (run on both, machine_rank 0 and 1):
    mlflow run . -e preflight --env-manager local -P study=S -P num_machines=2 \\
        -P machine_rank=0 -P main_process_ip=10.0.1.5 -P main_process_port=29500
    gradshare preflight --study S [--num-machines 2 --machine-rank 1 --main-process-ip ... --main-process-port ...]

Host A (machine rank 0) records the `preflight` run: every figure, the fastest socket setting
(`hardware.sockets=auto` arms use it), and the go/no-go; the arms' deadline and budget checks
and `gradshare project --study S` read its figures from then on.
"""
from __future__ import annotations

from entrypoints.common import parse, study_parser
from gradshare.steps.preflight import run_preflight
from gradshare.tracking import study_runs
from gradshare.train.launch import Launch, launch_problem


def main(argv=None) -> None:
    ap = study_parser(__doc__)
    ap.add_argument("--num-machines", type=int, default=1)
    ap.add_argument("--machine-rank", type=int, default=0)
    ap.add_argument("--main-process-ip", default="127.0.0.1")
    ap.add_argument("--main-process-port", type=int, default=0)
    args, _ = parse(ap, argv, overrides_allowed=False)
    if problem := launch_problem(vars(args) | {"full_state_every": 0}):
        name, text = problem
        ap.error(f"argument --{name.replace('_', '-')}: {text}")
    launch = Launch(args.num_machines, args.machine_rank, args.main_process_ip, args.main_process_port)
    if launch.machine_rank > 0:  # host A owns the run; this host's ranks take part in every probe
        run_preflight(args.study, launch)
        return
    with study_runs.study_run(args.study, "preflight", run_name="preflight"):
        figures = run_preflight(args.study, launch)
    if figures["go_no_go"]["go"] != "go":
        raise SystemExit(3)  # the step ran; its answer is no-go (the run says why)


if __name__ == "__main__":
    main()
