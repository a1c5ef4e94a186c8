"""Reproducible on a fresh machine: the README's results block records the versions that
made it, `scripts/readme_results.py --check` names the ones that differ when a result does
not reproduce, and a fresh virtual environment installed as the README says
(`-c constraints.txt`) gets exactly those versions and the same checkpoint hash (that one:
tests/e2e/test_fresh_venv.py)."""
from __future__ import annotations

import textwrap

import pytest

from tests.conftest import REPO, load_script


def study_log(single_checkpoint: str = "037f159e84f8089d") -> str:
    """What the README's first command prints, cut to the lines the script reads."""
    return textwrap.dedent(f"""\
        [gradshare] prepare: inputs_sha256 02ac18bb3d5d9aa0…
        [gradshare] arm single FINISHED: final loss 3.5268, active 45.7s, 4,596 tok/s, checkpoint {single_checkpoint}…
        [gradshare] arm powersgd FINISHED: final loss 3.5326, active 106.0s, 1,980 tok/s, checkpoint fdb445da9a4076d0…
        gradshare verdicts — gradshare-tiny
        model     status       overall acc  retention NLL  reason
        single    FINISHED           0.138         3.8400
        powersgd  FINISHED           0.136         3.8432
        quality screen: PASS
        speed screen:   FAIL  ratio 0.431 (threshold 1.1)
        budget: $0.0672 of $100; 0.148 h of 6 h
        [gradshare] step seconds: prepare 47, train-single 66, train-powersgd 142
        [gradshare] study 'gradshare-tiny' done in 681s
        """)


HERE = {"python": "3.11.7", "torch": "2.13.0+cpu", "transformers": "5.25.0", "accelerate": "1.16.0",
        "tokenizers": "0.23.3", "safetensors": "0.8.0", "mlflow": "3.17.2", "numpy": "2.4.6",
        "chitchat-dataset": "0.9.0"}


@pytest.fixture
def results(tmp_path, monkeypatch):
    """readme_results on a README of its own, its block written from `study_log()` with HERE's versions."""
    rr = load_script("readme_results")
    readme = tmp_path / "README.md"
    readme.write_text(f"# gradshare\n\n{rr.BEGIN}\nold\n{rr.END}\n\nafter\n")
    monkeypatch.setattr(rr, "README", readme)
    monkeypatch.setattr(rr, "installed_versions", lambda: dict(HERE))
    log = tmp_path / "run.txt"
    log.write_text(study_log())
    rr.main(["--from-log", str(log)])
    return rr, log


def test_the_results_block_records_the_versions_it_was_made_with(results):
    rr, _ = results
    block = rr.current_block()
    assert rr.recorded_versions(block) == HERE
    assert "Versions: python 3.11.7, torch 2.13.0+cpu, transformers 5.25.0" in block
    assert "037f159e84f8089d…" in rr.exact_in_block(block)[3]


def test_check_passes_when_every_exact_line_reproduces(results, capsys):
    rr, log = results
    rr.main(["--check", "--from-log", str(log)])
    assert "reproduces exactly" in capsys.readouterr().out


def test_check_names_the_versions_that_differ_when_a_hash_does(results, monkeypatch, capsys):
    rr, log = results
    log.write_text(study_log(single_checkpoint="9999999999999999"))
    monkeypatch.setattr(rr, "installed_versions", lambda: HERE | {"torch": "2.14.0+cpu", "numpy": "2.5.0"})
    with pytest.raises(SystemExit, match="README results differ"):
        rr.main(["--check", "--from-log", str(log)])
    out = capsys.readouterr().out
    assert "-single         3.5268  037f159e84f8089d…" in out and "+single         3.5268  9999999999999999…" in out
    assert "torch: installed 2.14.0+cpu, recorded 2.13.0+cpu" in out
    assert "numpy: installed 2.5.0, recorded 2.4.6" in out
    assert "transformers:" not in out and "mlflow:" not in out  # only those that differ


def test_check_says_when_the_versions_are_the_same_and_a_line_still_differs(results, capsys):
    rr, log = results
    log.write_text(study_log(single_checkpoint="9999999999999999"))
    with pytest.raises(SystemExit):
        rr.main(["--check", "--from-log", str(log)])
    assert "Every recorded version is installed here" in capsys.readouterr().out


def test_other_versions_with_the_same_results_pass_and_are_named(results, monkeypatch, capsys):
    rr, log = results
    monkeypatch.setattr(rr, "installed_versions", lambda: HERE | {"transformers": "5.17.0"})
    rr.main(["--check", "--from-log", str(log)])
    assert "transformers: installed 5.17.0, recorded 5.25.0" in capsys.readouterr().out


def test_a_block_from_before_the_versions_line_compares_the_versions_its_measured_line_named():
    rr = load_script("readme_results")
    old = ("**Measured** on 2 cores (AMD EPYC), Python 3.11.7, torch 2.13.0+cpu, transformers 5.24.0, "
           "accelerate 1.16.0, mlflow 3.17.2 — these move with the machine and its load:")
    recorded = rr.recorded_versions(old)
    assert recorded == {"python": "3.11.7", "torch": "2.13.0+cpu", "transformers": "5.24.0",
                        "accelerate": "1.16.0", "mlflow": "3.17.2"}
    assert rr.version_differences(HERE, recorded)[0] == "transformers: installed 5.25.0, recorded 5.24.0"


def test_constraints_pin_what_is_installed_here_and_the_readme_installs_with_them():
    constraints = load_script("constraints")
    assert constraints.read() == constraints.closure(), \
        "constraints.txt differs from this environment: run `python scripts/constraints.py`"
    readme = (REPO / "README.md").read_text()
    first, second = readme.split("```bash\n")[1:3]
    for command in (first, second):
        assert "pip install -e . -c constraints.txt" in command or \
            'pip install -e ".[test]" -c constraints.txt' in command, command


def test_check_names_the_cpu_when_it_is_another_kind_than_the_blocks(results, monkeypatch, capsys):
    """The same commit and versions gave another inputs hash on an Intel Xeon than on an AMD EPYC
    (the seed model's pre-training rounds with the CPU's kernels): --check says so."""
    rr, log = results
    assert rr.recorded_cpu(rr.current_block()) == rr.cpu_model()
    log.write_text(study_log(single_checkpoint="9999999999999999"))
    with pytest.raises(SystemExit):
        rr.main(["--check", "--from-log", str(log)])
    assert "The CPU differs" not in capsys.readouterr().out  # same CPU: not named
    monkeypatch.setattr(rr, "cpu_model", lambda: "Some Other CPU 9000")
    with pytest.raises(SystemExit):
        rr.main(["--check", "--from-log", str(log)])
    out = capsys.readouterr().out
    assert f"The CPU differs: here Some Other CPU 9000, the block's {rr.recorded_cpu(rr.current_block())}" in out
    assert rr.recorded_cpu("**Measured** on 2 cores (AMD EPYC) with those versions") == "AMD EPYC"
