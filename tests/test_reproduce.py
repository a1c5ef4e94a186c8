"""Reproducible on a fresh machine: the README's results block records the versions that
made it, `scripts/readme_results.py --check` names the ones that differ when a result does
not reproduce, and a fresh virtual environment installed as the README says
(`-c constraints.txt`) gets exactly those versions and the same checkpoint hash."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from gradshare.hashing import checkpoint_sha256
from tests.conftest import REPO


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


# --- a fresh machine ---------------------------------------------------------------------

INSTALL_S = 300  # measured: about 100 s on 2 cores from the local wheel and index mirrors


def pip(venv, *args, timeout=INSTALL_S):
    proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", *args], capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        out = (proc.stdout + proc.stderr)[-3000:]
        pytest.fail(f"`pip {' '.join(args)}` in a fresh venv exited {proc.returncode}. If the package index "
                    f"cannot be reached from this machine, this test cannot run here; pip said:\n{out}")
    return proc.stdout


def tiny_checkpoint(python: str, out) -> None:
    """A small model saved as train saves it (`gradshare.model.save_model`), from fixed weights."""
    code = textwrap.dedent(f"""\
        import torch
        from transformers import Qwen3Config, Qwen3ForCausalLM
        from gradshare.model import save_model
        torch.manual_seed(0)
        cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64)
        save_model(Qwen3ForCausalLM(cfg), None, {str(out)!r})
        """)
    subprocess.run([python, "-c", code], check=True, capture_output=True, text=True, timeout=120)


@pytest.mark.e2e
def test_a_fresh_venv_installed_as_the_readme_says_has_the_recorded_versions_and_hashes_the_same(tmp_path):
    """The README's second command in a new `python -m venv` (torch==2.13.0 first, then the
    project with `-c constraints.txt`, from a copy of this tree): `pip check` passes, every
    installed version is the one constraints.txt pins, and the ones the README block records
    are installed; a checkpoint made there hashes as the same one made here. (Running the
    whole study there takes ~10 minutes: equal versions make its hashes by construction.)"""
    t0 = time.monotonic()
    src = tmp_path / "src"  # a copy: a build in the checkout would race the engineers' own
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "constraints.txt"):
        shutil.copy(REPO / name, src / name)
    for pkg in ("gradshare", "analysis", "entrypoints"):
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    pip(venv, "install", "-q", "torch==2.13.0", "-c", str(src / "constraints.txt"))
    pip(venv, "install", "-q", f"{src}[test]", "-c", str(src / "constraints.txt"))
    pip(venv, "check")

    listed = json.loads(pip(venv, "list", "--format", "json"))
    installed = {canonicalize_name(p["name"]): p["version"] for p in listed}
    pins = load_script("constraints").read(src / "constraints.txt")
    wrong = {n: (installed.get(n), v) for n, v in pins.items()
             if n not in installed or not SpecifierSet(f"=={v}").contains(installed[n], prereleases=True)}
    assert not wrong, f"installed vs constraints.txt: {wrong}"

    tiny_checkpoint(python, tmp_path / "there")
    tiny_checkpoint(sys.executable, tmp_path / "here")
    assert checkpoint_sha256(tmp_path / "there") == checkpoint_sha256(tmp_path / "here")

    rr = load_script("readme_results")
    recorded = rr.recorded_versions(rr.current_block())
    versions = subprocess.run([python, str(REPO / "scripts" / "readme_results.py"), "--versions"],
                              capture_output=True, text=True, check=True, timeout=120, cwd=tmp_path).stdout
    there = json.loads(versions)
    assert there == rr.installed_versions(), "the fresh venv's versions differ from this environment's"
    differ = rr.version_differences(there, recorded)
    assert not differ, (f"the README block records other versions than constraints.txt installs: {differ}; "
                        f"regenerate the block with `python scripts/readme_results.py`")
    assert time.monotonic() - t0 < 2 * INSTALL_S
