"""`prepare`: hashed inputs for the whole study, registered in a real MLflow server. (A plan
that cannot run: tests/unit/steps/test_prepare_refusals.py.)"""
import json
from collections import Counter
from pathlib import Path

import pytest

from gradshare.util.hashing import sha256_file
from gradshare.util.jsonio import read_jsonl
from gradshare.contract.plan import load_plan
from gradshare.contract.tags import FAILURE, PLAN_SHA, STEP, STUDY
from gradshare.tracking import study_runs
from tests.conftest import SMALL_ARMS, SMALL, SMALL_STUDY, mlflow_run, run_entry, overrides

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def prep(prepared_study, tmp_path_factory):
    run = study_runs.prepare_run(prepared_study)
    root = tmp_path_factory.mktemp("prep")
    inputs = study_runs.download(run.info.run_id, "inputs", root)
    plan_json = json.loads(study_runs.download(run.info.run_id, "plan.json", root).read_text())
    return run, inputs, plan_json


def test_the_prepare_run_shows_every_plan_parameter_plan_json_manifest_and_tags(prepared_study, prep):
    run, inputs, plan_json = prep
    plan = load_plan("tiny", SMALL_STUDY)
    assert {k: run.data.params.get(k) for k in plan.flat()} == plan.flat()
    assert plan_json["plan_sha256"] == plan.sha256()
    assert run.data.tags[STUDY] == prepared_study
    assert run.data.tags[STEP] == "prepare"
    assert run.data.tags[PLAN_SHA] == plan.sha256()
    manifest = json.loads((inputs / "manifest.json").read_text())
    assert manifest["plan_sha256"] == plan.sha256()
    for e in manifest["files"]:  # every registered byte is what was logged
        assert sha256_file(inputs / e["path"]) == e["sha256"]
        assert (inputs / e["path"]).stat().st_size == e["bytes"]
    src = manifest["sources"]
    assert src["packages"]["torch"] and src["python"] and "determinism" in src and src["seeds"]["study"]


def test_data_sets_are_logged_as_inputs_with_a_full_sha256(prep):
    run, inputs, _ = prep
    logged = {d.dataset.name: d for d in run.inputs.dataset_inputs}
    manifest = {e["path"]: e["sha256"] for e in json.loads((inputs / "manifest.json").read_text())["files"]}
    for name in ("data/train_tasks.jsonl", "data/replay.jsonl", "eval/test_tasks.jsonl", "eval/probes.jsonl"):
        tags = {t.key: t.value for t in logged[name].tags}
        assert tags["gradshare.sha256"] == manifest[name]


def test_each_family_gets_its_train_and_test_counts(prep):
    _, inputs, _ = prep
    train = read_jsonl(inputs / "data/train_tasks.jsonl")
    test = read_jsonl(inputs / "eval/test_tasks.jsonl")
    assert Counter(d["family"] for d in train) == {f: 12 for f in load_plan().data.families}
    assert Counter(d["family"] for d in test) == {f: 8 for f in load_plan().data.families}
    assert len(read_jsonl(inputs / "data/replay.jsonl")) == 16
    assert len(read_jsonl(inputs / "eval/probes.jsonl")) == 8


def test_training_tasks_and_test_cases_are_disjoint_by_prompt_hash(prep):
    _, inputs, _ = prep
    import hashlib
    train = {d["prompt_sha256"] for d in read_jsonl(inputs / "data/train_tasks.jsonl")}
    test = read_jsonl(inputs / "eval/test_tasks.jsonl")
    assert all(hashlib.sha256(c["question"].encode()).hexdigest() == c["prompt_sha256"] for c in test)
    assert train.isdisjoint(c["prompt_sha256"] for c in test)


def test_probes_replay_and_pretraining_conversations_are_disjoint(prep):
    _, inputs, _ = prep
    texts = [{d["target"] for d in read_jsonl(inputs / p)}
             for p in ("data/replay.jsonl", "eval/probes.jsonl", "data/pretrain.jsonl")]
    assert not (texts[0] & texts[1]) and not (texts[0] & texts[2]) and not (texts[1] & texts[2])


def test_each_training_document_is_used_exactly_once_in_the_schedule(prep):
    _, inputs, _ = prep
    sched = json.loads((inputs / "schedule.json").read_text())
    ids = [i for u in sched["updates"] for i in u]
    docs = [d["id"] for d in read_jsonl(inputs / "data/train_tasks.jsonl")] + \
           [d["id"] for d in read_jsonl(inputs / "data/replay.jsonl")]
    assert len(sched["updates"]) == 8 and all(len(u) == 8 for u in sched["updates"])
    assert sorted(ids) == sorted(docs) and len(set(ids)) == len(ids)
    assert len(sched["target_tokens"]) == 8 and all(n > 0 for n in sched["target_tokens"])


def test_the_seed_model_has_lower_probe_nll_than_the_untrained_model_it_started_from(prep):
    _, inputs, _ = prep
    from gradshare.data.tokenizer import load_tokenizer
    from gradshare.model.lm import build_model, load_model, mean_nll
    from gradshare.model.source import model_config

    plan = load_plan("tiny", SMALL)
    tok = load_tokenizer(inputs / "tokenizer")
    probes = read_jsonl(inputs / "eval/probes.jsonl")
    untrained = build_model(model_config(plan.model.config, vocab_size=len(tok)), plan.study.seed)
    seed = load_model(inputs / "seed_model")
    before = [r["nll_nats"] for r in mean_nll(untrained, tok, probes, plan.data.max_doc_tokens)]
    after = [r["nll_nats"] for r in mean_nll(seed, tok, probes, plan.data.max_doc_tokens)]
    assert sum(after) / len(after) < sum(before) / len(before) - 0.1


def test_two_prepares_of_the_same_plan_give_identical_hashes(prepared_study, prep):
    _, inputs, _ = prep
    run_entry("prepare", "--study", "small-study-again", *overrides(SMALL_ARMS))
    again = study_runs.download(study_runs.prepare_run("small-study-again").info.run_id, "inputs/manifest.json",
                       Path(inputs).parent / "again")
    a = json.loads((inputs / "manifest.json").read_text())
    b = json.loads(again.read_text())
    assert a["files"] == b["files"] and a["inputs_sha256"] == b["inputs_sha256"]


def test_a_second_prepare_of_a_study_refuses_unless_told_to_start_a_new_study(prepared_study):
    proc = mlflow_run("prepare", prepared_study, SMALL_STUDY, check=False)
    assert proc.returncode != 0
    assert "already prepared" in proc.stdout + proc.stderr
    failed = [r for r in study_runs.search(prepared_study, "prepare") if r.info.status == "FAILED"]
    assert failed and "already prepared" in failed[-1].data.tags[FAILURE]
    assert len(study_runs.search(prepared_study, "prepare", status="FINISHED")) == 1


def test_new_study_archives_the_old_one_and_prepares_afresh(mlflow_server):
    import mlflow
    run_entry("prepare", "--study", "renewed", *overrides({"model.pretrain_steps": "1"}))
    first = study_runs.prepare_run("renewed").info.run_id
    run_entry("prepare", "--study", "renewed", "--new-study", "true",
              *overrides({"model.pretrain_steps": "1"}))
    assert study_runs.prepare_run("renewed").info.run_id != first
    archived = [e for e in mlflow.search_experiments() if e.name.startswith("renewed@archived-")]
    assert archived and mlflow.get_run(first).info.experiment_id == archived[0].experiment_id


def test_every_registered_input_file_is_in_the_hash_check(mlflow_server, prepared_study, tmp_path):
    """One changed byte in any input file a step reads (first, last or between, in the manifest's
    order) is refused naming that file: a check that skipped one file would let it through."""
    import re

    from gradshare.contract.errors import StudyError
    from gradshare.tracking import store

    prep, plan = store.prepared_plan(prepared_study)
    wanted = tuple(dict.fromkeys(store.TRAIN_INPUTS + store.SCORE_INPUTS))
    manifest = json.loads(study_runs.download(prep.info.run_id, "inputs/manifest.json", tmp_path / "m").read_text())
    paths = [e["path"] for e in manifest["files"]
             if any(e["path"] == w or e["path"].startswith(w + "/") for w in wanted)]
    assert {p.split("/")[0] for p in paths} >= {"data", "eval", "schedule.json", "tokenizer", "seed_model"}
    store.verified_inputs(prep, plan, tmp_path / "as-registered", wanted)  # unchanged: accepted
    for i, rel in enumerate(paths):
        [stored] = list(mlflow_server.artifacts.rglob(f"{prep.info.run_id}/artifacts/inputs/{rel}"))
        original = stored.read_bytes()
        stored.write_bytes(bytes([original[0] ^ 1]) + original[1:] if original else b"x")
        try:
            with pytest.raises(StudyError, match=f"input hash mismatch for {re.escape(rel)}:"):
                store.verified_inputs(prep, plan, tmp_path / f"changed-{i}", wanted)
        finally:
            stored.write_bytes(original)
    print(f"{len(paths)} input files, each refused when changed: {paths}")
