"""Kept results (`gradshare.util.kept`): computed once, read after; the key moves with what the
caller names, the code and the libraries; a cache that is off, unwritable or holds a bad file
never changes the result and is never an error. Then the two users: the full profile's workload
and the model's parameter shapes, kept equal to what is computed without the cache."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from gradshare.contract.plan import load_plan
from gradshare.inputs import build
from gradshare.inputs.workload import WORKLOAD
from gradshare.model import source
from gradshare.util import kept as K


@pytest.fixture
def counted():
    calls = []

    def compute():
        calls.append(1)
        return {"shapes": [[6, 4], [4]], "n": len(calls)}

    return calls, compute


def test_a_value_is_computed_once_then_read_from_its_file(tmp_path, monkeypatch, counted):
    calls, compute = counted
    monkeypatch.setenv(K.ENV, str(tmp_path / "kept"))
    said = []
    first = K.kept("thing", {"plan_sha256": "ab"}, compute, libraries=("torch",), log=said.append)
    again = K.kept("thing", {"plan_sha256": "ab"}, compute, libraries=("torch",), log=said.append)
    assert first == again == {"shapes": [[6, 4], [4]], "n": 1} and len(calls) == 1
    [path] = (tmp_path / "kept").iterdir()  # no part file left beside it
    assert said == [f"[gradshare] thing: kept from an earlier computation by this code ({path})"]
    assert json.loads(path.read_text())["key"] == K.full_key({"plan_sha256": "ab"}, ("torch",))
    # another key, another computation
    assert K.kept("thing", {"plan_sha256": "cd"}, compute, log=said.append)["n"] == 2


def test_off_computes_every_time_and_writes_nothing(tmp_path, monkeypatch, counted):
    calls, compute = counted
    monkeypatch.setenv(K.ENV, "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert K.cache_dir() is None
    assert [K.kept("thing", {}, compute)["n"] for _ in range(2)] == [1, 2]
    assert not (tmp_path / "xdg").exists()
    monkeypatch.delenv(K.ENV)
    assert K.cache_dir() == tmp_path / "xdg" / "gradshare"


def test_a_cache_that_cannot_be_read_or_written_still_gives_the_value(tmp_path, monkeypatch, counted):
    calls, compute = counted
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(K.ENV, str(blocker))  # reading and writing under it both fail
    assert [K.kept("thing", {}, compute, log=print)["n"] for _ in range(2)] == [1, 2]
    assert blocker.read_text() == "not a folder"


def test_a_kept_file_is_used_only_whole_and_under_its_own_key(tmp_path):
    key = K.full_key({"plan_sha256": "ab"})
    path = tmp_path / "thing.json"
    K.keep(path, key, [1, 2])
    assert K.read(path, key) == [1, 2]
    assert K.read(path, K.full_key({"plan_sha256": "cd"})) is None
    for text in ("", '{"key": ', "[]", json.dumps({"key": key})):  # empty, cut short, not ours, no value
        path.write_text(text)
        assert K.read(path, key) is None, text
    path.unlink()
    assert K.read(path, key) is None


def test_the_key_moves_with_any_edit_to_the_package_and_names_the_libraries_versions(tmp_path, monkeypatch):
    copy = tmp_path / "gradshare"
    shutil.copytree(K.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(K, "PACKAGE", copy)
    before = K.full_key({"plan_sha256": "ab"}, ("tokenizers", "transformers"))
    documents = copy / "data" / "documents.py"
    documents.write_text(documents.read_text() + "\n# an edit\n")
    after = K.full_key({"plan_sha256": "ab"}, ("tokenizers", "transformers"))
    assert after["code_sha256"] != before["code_sha256"] and after["plan_sha256"] == before["plan_sha256"]
    assert set(before["libraries"]) == {"tokenizers", "transformers"} and all(before["libraries"].values())
    assert K.full_key({}, ("no-such-library",))["libraries"] == {"no-such-library": None}


# The full profile cut small (random weights: no model is built), as tests/unit/inputs/test_workload.
SMALL_FULL = {"data.train_per_family": "16", "data.test_per_family": "4", "data.replay_docs": "64",
              "data.retention_probes": "8", "schedule.updates": "4", "powersgd.warmup_updates": "2"}


def test_the_kept_workload_is_the_one_prepare_writes_and_is_built_once(tmp_path, monkeypatch):
    plan = load_plan("full", SMALL_FULL)
    written = build.build_inputs(plan, tmp_path / "inputs", log=lambda *a: None)  # prepare's own file
    assert written["plan_sha256"] == plan.sha256()
    expected = json.loads((tmp_path / "inputs" / WORKLOAD).read_text())
    builds = []
    real = build.build_inputs
    monkeypatch.setattr(build, "build_inputs", lambda *a, **k: builds.append(1) or real(*a, **k))
    monkeypatch.setenv(K.ENV, str(tmp_path / "kept"))
    assert build.workload_of(plan, log=lambda *a: None) == expected
    assert build.workload_of(plan, log=lambda *a: None) == expected and builds == [1]


def test_kept_parameter_shapes_are_the_models_and_a_later_process_reads_them_without_torch(tmp_path, monkeypatch):
    plan = load_plan("tiny")
    monkeypatch.setenv(K.ENV, "off")
    computed = source.parameter_shapes(plan)
    assert computed and all(isinstance(s, tuple) for s in computed)
    monkeypatch.setenv(K.ENV, str(tmp_path / "kept"))
    assert source.parameter_shapes(plan) == computed
    code = ("import sys; from gradshare.contract.plan import load_plan; from gradshare.model.source import "
            "parameter_shapes; s = parameter_shapes(load_plan('tiny')); "
            "print(sum(len(x) for x in s), len(s), 'torch' in sys.modules, 'transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, K.ENV: str(tmp_path / "kept")})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(sum(len(s) for s in computed)), str(len(computed)), "False", "False"]
