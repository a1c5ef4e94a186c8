"""Reproducible on a fresh machine: a fresh virtual environment installed as the README says
(`-c constraints.txt`) gets exactly the versions the README's results block records and the same
checkpoint hash. (The block and `scripts/readme_results.py --check`: tests/unit/scripts/test_reproduce.py.)"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from gradshare.util.hashing import checkpoint_sha256
from tests.conftest import REPO, load_script

pytestmark = pytest.mark.e2e

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
    """A small model saved as train saves it (`gradshare.model.lm.save_model`), from fixed weights."""
    code = textwrap.dedent(f"""\
        import torch
        from transformers import Qwen3Config, Qwen3ForCausalLM
        from gradshare.model.lm import save_model
        torch.manual_seed(0)
        cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64)
        save_model(Qwen3ForCausalLM(cfg), None, {str(out)!r})
        """)
    subprocess.run([python, "-c", code], check=True, capture_output=True, text=True, timeout=120)



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
    # --no-compile: the same packages and versions, without writing a .pyc for every module of
    # torch and the rest (a minute of a 2-core machine's CPU; the imports below compile what they load)
    pip(venv, "install", "-q", "--no-compile", "torch==2.13.0", "-c", str(src / "constraints.txt"))
    pip(venv, "install", "-q", "--no-compile", f"{src}[test]", "-c", str(src / "constraints.txt"))
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
