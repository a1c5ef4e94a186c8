"""The GPU benchmark's harness, run for real on a CPU (`--smoke`: the tiny model, the same
configurations, each in a process of its own), so that a device call is never spent on a
harness bug: the study's workload is built by prepare's own code, every configuration comes
back with its per-update rows, the table names each one, and a failed configuration (here one
that is not a configuration at all) is recorded beside the others instead of stopping them."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e


def test_the_gpu_benchmark_runs_every_configuration_in_its_own_process_and_tables_them(tmp_path):
    out = tmp_path / "out" / "gpu_path.json"
    run = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_path.py"), "--smoke", "--updates", "6",
         "--only", "single,single-by-count,powersgd,ref-single", "--out", str(out), "--workdir", str(tmp_path / "w")],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(out.read_text())
    by_name = {r["config"]: r for r in data["results"]}
    assert list(by_name) == ["single", "powersgd", "single-by-count", "ref-single"]  # essential ones first
    for name, r in by_name.items():
        assert [x["update"] for x in r["rows"]] == list(range(1, 7)), name
        assert r["summary"]["step_s"] > 0
    # packed through the static steps (no capture on a CPU); by count through the plain loop
    assert by_name["single"]["graphs"] == {"shapes": 2, "captured": 0, "failed": None}
    assert by_name["single-by-count"]["graphs"] is None
    # the same first update by both layouts, from the same weights (later ones differ by AdamW's rounding)
    a, b = by_name["single"]["rows"][0]["loss"], by_name["single-by-count"]["rows"][0]["loss"]
    assert abs(a - b) / b < 1e-5
    assert "| single |" in run.stdout and "| powersgd |" in run.stdout and "**study**" in run.stdout
