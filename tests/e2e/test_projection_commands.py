"""The projection's commands: `benchmarks/calibrate_projection.py` on the committed H200 result
makes the committed calibration, and `gradshare project` prints the verdict, writes the plot and
refuses bad input. (The projection by hand: tests/unit/cost/test_projection.py.)"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gradshare.cost import gpu_cost
from tests.conftest import REPO

pytestmark = pytest.mark.e2e

H200_RESULT = REPO / "benchmarks" / "results" / "2026-12-04-h200-a8e8d35-gpu_path.json"


def test_the_h200_parts_fitted_on_one_workload_predict_the_other_within_15_percent(tmp_path):
    """The committed calibration is what the script makes of the committed H200 result file, and
    fitted on either workload it predicts single, dense and powersgd on the other."""
    out = tmp_path / "cal.json"
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "calibrate_projection.py"), str(H200_RESULT),
                          "--memory-gbps", "4300", "--memory-source", "x", "--workdir", str(tmp_path / "w"),
                          "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    made = json.loads(out.read_text())
    assert len(made["checks"]) == 6
    for name, check in made["checks"].items():
        assert abs(check["error"]) < 0.15, name
        assert check["measured_s"] > 0.1
    committed = json.loads(gpu_cost.CALIBRATION.read_text())
    for k in ("s_per_padded_token", "s_per_micro_batch", "s_fixed", "dense_extra_s", "compress_s", "error_bytes"):
        assert made[k] == pytest.approx(committed[k], rel=1e-9), k


def test_the_command_prints_the_verdict_writes_the_plot_and_refuses_bad_input(tmp_path):
    out = subprocess.run([sys.executable, "-m", "entrypoints.cli", "project", "--hosts", "2,4",
                          "--json", str(tmp_path / "p.json"), "--plot", str(tmp_path / "p.png")],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    p = json.loads((tmp_path / "p.json").read_text())["study_hosts"]
    assert {r["arm"] for r in p["rows"]} == {"single", "dense", "powersgd"}
    assert {c["hosts"] for c in p["curves"]} == {2, 4}
    psgd = next(r for r in p["rows"] if r["arm"] == "powersgd")
    assert f"| powersgd | {psgd['s_per_update']:.3f} | {psgd['speed_ratio']:.2f} |" in out.stdout
    assert "built here by prepare's code" in out.stdout and "Break-even" in out.stdout
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert not out.stderr.strip(), out.stderr[-2000:]  # no progress bar, no warning
    # refused as argparse refuses (usage, one error line, exit 2) before anything is read: with a
    # study too, where a bad rate was once ignored
    for args, says in ((["--hosts", "1"], "at least 2 hosts"), (["--hosts", "2,x"], "expected numbers"),
                       (["--rates-mbit", "abc"], "expected numbers"),
                       (["--rates-mbit", "abc", "--study", "no-store-needed"], "expected numbers"),
                       (["--rates-mbit", "0", "--study", "no-store-needed"], "positive number of Mbit/s"),
                       (["--rates-mbit", "5"], "needs --study")):
        bad = subprocess.run([sys.executable, "-m", "entrypoints.cli", "project", *args], cwd=REPO,
                             capture_output=True, text=True)
        assert bad.returncode == 2 and says in bad.stderr, (args, bad.stderr)
        assert bad.stderr.splitlines()[-1].startswith("gradshare project: error: "), args
