"""One parser for every command's plan fields (`entrypoints.common.plan_overrides`): `--k=v` and
`--k v` alike, a bad field one line naming it."""
from __future__ import annotations

import subprocess
import sys

import pytest

from entrypoints.common import plan_overrides, study_parser
from tests.conftest import REPO


def test_both_forms_of_a_plan_field_parse_to_the_same_overrides():
    ap = study_parser("doc", makes_plan=True)
    args, rest = ap.parse_known_args(["--study", "s", "--schedule.updates=8", "--optim.lr", "1e-4"])
    assert args.study == "s" and plan_overrides(ap, rest) == {"schedule.updates": "8", "optim.lr": "1e-4"}
    assert plan_overrides(ap, ["--model.source=hf:/a=b"]) == {"model.source": "hf:/a=b"}  # the first = splits
    with pytest.raises(SystemExit):
        plan_overrides(ap, ["--schedule.updates"])  # no value
    with pytest.raises(SystemExit):
        plan_overrides(ap, ["--updates=8"])  # not concern.field


def _server_print(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "entrypoints.cli", "server", "--print", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_the_server_takes_plan_fields_in_both_forms_and_refuses_an_unknown_one_in_a_line():
    spaced = _server_print("--infra.artifact_destination", "s3://bucket/prefix")
    joined = _server_print("--infra.artifact_destination=s3://bucket/prefix")
    assert spaced.returncode == joined.returncode == 0, joined.stderr[-2000:]
    assert spaced.stdout == joined.stdout and "s3://bucket/prefix" in joined.stdout
    bad = _server_print("--infra.artifact_destinaton=s3://b")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "did you mean 'infra.artifact_destination'" in bad.stderr
