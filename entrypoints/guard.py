"""`gradshare guard`: stop the study's EC2 instances at its deadline, whatever else happens.

    gradshare guard --study gradshare-full            # waits until the deadline, then stops them
    gradshare guard --study gradshare-full --now      # stops them at once

Which instances, when, the run it keeps and where its credentials come from:
`gradshare.steps.guard`.
"""
from __future__ import annotations

import argparse

from gradshare.steps.guard import guard


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
