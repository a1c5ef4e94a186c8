"""`commit` and `score`: candidates sealed before any test scoring, then per-case scores."""
import textwrap

import pytest

from gradshare.util.jsonio import read_jsonl
from gradshare.contract.plan import load_plan
from gradshare.contract.tags import ARM, CKPT_SHA, FAILURE, REFUSAL, STEP
from gradshare.tracking import connection
from gradshare.tracking import study_runs
from tests.conftest import SMALL_STUDY, overrides, run_entry

pytestmark = pytest.mark.e2e

PLAN = load_plan("tiny", SMALL_STUDY)  # the small study: four arms, powersgd8 the fourth


def test_score_before_commit_refuses_with_a_clear_message(failing_study):
    assert not study_runs.is_committed(failing_study)  # no test commits this study
    proc = run_entry("score", "--study", failing_study, check=False)
    assert proc.returncode != 0
    run = study_runs.search(failing_study, "score", status="KILLED")[-1]  # a refusal: KILLED, not FAILED
    assert "is not committed" in run.data.tags[FAILURE] and "-e commit" in run.data.tags[FAILURE]
    assert not study_runs.search(failing_study, "score", "seed")  # nothing was scored


@pytest.fixture
def committed(committed_study):
    return committed_study


@pytest.fixture
def scored(scored_study):
    return scored_study


def test_the_commitment_seals_every_arm_with_its_checkpoint_hash(committed):
    study, c = committed
    assert [e["arm"] for e in c["arms"]] == list(PLAN.arms.names)
    for e in c["arms"]:
        [run] = study_runs.search(study, "train", e["arm"], status="FINISHED")
        assert e["status"] == "FINISHED" and e["run_id"] == run.info.run_id
        assert e["checkpoint_sha256"] == run.data.tags[CKPT_SHA]
    assert c["plan_sha256"] == PLAN.sha256() and c["committed_at"]


def test_a_second_commit_refuses(committed):
    study, _ = committed
    proc = run_entry("commit", "--study", study, check=False)
    assert proc.returncode != 0
    assert len(study_runs.search(study, "commit", status="FINISHED")) == 1
    refused = study_runs.search(study, "commit", status="KILLED")
    assert "already committed" in refused[-1].data.tags[FAILURE] and refused[-1].data.tags[REFUSAL] == "true"


def test_train_refuses_new_candidates_once_the_study_is_committed(partial_study):
    study, _ = partial_study  # powersgd never ran there: it would be a new candidate
    proc = run_entry("train", "--study", study, "--arm", "powersgd", check=False)
    assert proc.returncode != 0
    refused = study_runs.search(study, "train", "powersgd", status="KILLED")
    assert "is committed" in refused[-1].data.tags[FAILURE]


def test_one_score_step_is_a_parent_run_with_one_nested_run_per_model(scored):
    [parent] = [r for r in study_runs.search(scored, "score", status="FINISHED") if ARM not in r.data.tags]
    children = [r for r in study_runs.search(scored, "score", status="FINISHED") if ARM in r.data.tags]
    assert sorted(r.data.tags[ARM] for r in children) == sorted(["seed", *PLAN.arms.names])  # every arm, fp16 the fifth
    assert len(children) == 6
    assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}


def test_score_runs_carry_per_case_files_for_the_seed_and_every_arm(scored, tmp_path):
    for name in ("seed", *PLAN.arms.names):
        [run] = study_runs.search(scored, "score", name, status="FINISHED")
        test = read_jsonl(study_runs.download(run.info.run_id, "per_case/test.jsonl", tmp_path / name))
        ret = read_jsonl(study_runs.download(run.info.run_id, "per_case/retention.jsonl", tmp_path / name))
        assert len(test) == PLAN.test_cases and len({r["case_id"] for r in test}) == PLAN.test_cases
        assert len(ret) == PLAN.data.retention_probes and len({r["probe_id"] for r in ret}) == len(ret)
        assert set(test[0]) >= {"case_id", "family", "correct", "prediction", "target"}
        assert all(r["correct"] in (0, 1) for r in test)
        assert all(r["nll_nats"] > 0 and r["tokens"] > 0 for r in ret)
        m = run.data.metrics
        assert m["accuracy/overall"] == pytest.approx(sum(r["correct"] for r in test) / len(test))
        assert m["retention/nll_nats"] == pytest.approx(sum(r["nll_nats"] for r in ret) / len(ret))
        assert "score/test_s" in m and run.data.tags[ARM] == name


def test_the_seed_scores_match_an_independent_nll_computation(scored, tmp_path):
    """Retention NLL recomputed here from the seed weights, token by token."""
    import torch
    from gradshare.data.documents import encode
    from gradshare.data.tokenizer import load_tokenizer
    from gradshare.model.lm import load_model

    prep = study_runs.prepare_run(scored)
    tok = load_tokenizer(study_runs.download(prep.info.run_id, "inputs/tokenizer", tmp_path))
    model = load_model(study_runs.download(prep.info.run_id, "inputs/seed_model", tmp_path))
    probes = read_jsonl(study_runs.download(prep.info.run_id, "inputs/eval/probes.jsonl", tmp_path))
    [run] = study_runs.search(scored, "score", "seed", status="FINISHED")
    logged = {r["probe_id"]: r for r in read_jsonl(study_runs.download(run.info.run_id, "per_case/retention.jsonl", tmp_path))}
    for p in probes[:3]:
        ids, mask = encode(tok, p, PLAN.data.max_doc_tokens)
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
        nll = [-logp[t - 1, ids[t]].item() for t in range(1, len(ids)) if mask[t]]
        assert logged[p["id"]]["tokens"] == len(nll)
        assert logged[p["id"]]["nll_nats"] == pytest.approx(sum(nll) / len(nll), rel=1e-5)


def test_failed_and_unavailable_arms_are_committed_with_reasons_and_not_scored(partial_study):
    study, c = partial_study
    by_arm = {e["arm"]: e for e in c["arms"]}
    assert by_arm["single"]["status"] == "FINISHED"
    assert by_arm["dense"]["status"] == "FAILED" and "diverged" in by_arm["dense"]["failure_reason"]
    assert by_arm["powersgd"]["status"] == "FAILED" and "unavailable" in by_arm["powersgd"]["failure_reason"]
    ghost = connection.client().get_run(by_arm["powersgd"]["run_id"])  # the unavailable arm: a visible FAILED run
    assert ghost.info.status == "FAILED" and "unavailable" in ghost.data.tags[FAILURE]
    assert ghost.data.tags[STEP] == "train" and ghost.data.tags[ARM] == "powersgd"


def test_a_checkpoint_altered_after_commit_is_refused(partial_study, mlflow_server):
    study, c = partial_study
    single = next(e for e in c["arms"] if e["arm"] == "single")
    [path] = list(mlflow_server.artifacts.rglob(f"{single['run_id']}/artifacts/checkpoint/model.safetensors"))
    original = path.read_bytes()
    scored_before = len(study_runs.search(study, "score", "seed"))
    path.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))  # one byte
    try:
        proc = run_entry("score", "--study", study, check=False)
    finally:
        path.write_bytes(original)
    assert proc.returncode != 0
    failed = study_runs.search(study, "score", status="FAILED")
    assert "changed after commit" in failed[-1].data.tags[FAILURE]
    assert len(study_runs.search(study, "score", "seed")) == scored_before  # refused before scoring anything


def test_a_config_altered_after_commit_is_refused_though_the_weights_are_the_same(partial_study, mlflow_server):
    """The weights' hash leaves config.json out (it carries transformers' version), but score
    builds the model from it: the commitment seals its bytes beside the weights."""
    study, c = partial_study
    single = next(e for e in c["arms"] if e["arm"] == "single")
    assert "config.json" in {f["path"] for f in single["checkpoint_files"]}
    [path] = list(mlflow_server.artifacts.rglob(f"{single['run_id']}/artifacts/checkpoint/config.json"))
    original = path.read_text()
    path.write_text(original.replace('"tie_word_embeddings": true', '"tie_word_embeddings": false'))
    assert path.read_text() != original
    try:
        proc = run_entry("score", "--study", study, check=False)
    finally:
        path.write_text(original)
    assert proc.returncode != 0
    reason = study_runs.search(study, "score", status="FAILED")[-1].data.tags[FAILURE]
    assert "config.json differ" in reason and "changed after commit" in reason


def test_only_the_seed_and_finished_arms_are_scored(partial_scored):
    scored = {r.data.tags[ARM] for r in study_runs.search(partial_scored, "score", status="FINISHED") if ARM in r.data.tags}
    assert scored == {"seed", "single"}


AUDIT = textwrap.dedent("""
    import os, sys
    _log = os.environ.get("GRADSHARE_AUDIT_LOG")
    if _log:
        _busy = []
        def _hook(event, args):
            if event == "open" and not _busy and args and isinstance(args[0], (str, bytes)):
                _busy.append(1)  # our own write below raises an open event too
                try:
                    with open(_log, "a") as f:
                        f.write(os.fsdecode(args[0]) + "\\n")
                finally:
                    _busy.pop()
        sys.addaudithook(_hook)
""")


def test_train_opens_no_test_set_file(mlflow_server, tmp_path):
    """Every Python process of train (driver, launcher, workers) logs every file it opens."""
    site = tmp_path / "audit"
    site.mkdir()
    (site / "sitecustomize.py").write_text(AUDIT)
    log = tmp_path / "opened.txt"
    study = "audited-study"
    run_entry("prepare", "--study", study, *overrides({"model.pretrain_steps": "1"}))
    import os
    env = {"GRADSHARE_AUDIT_LOG": str(log), "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    run_entry("train", "--study", study, "--arm", "dense", env=env)
    opened = log.read_text().splitlines()
    assert any(p.endswith("train_tasks.jsonl") for p in opened)  # the audit sees real reads
    assert not [p for p in opened if "test_tasks" in p or "/eval/" in p or "probes" in p]


def test_each_arm_is_scored_with_its_own_committed_weights(scored, tmp_path):
    """One test case's answer and one probe's NLL recomputed here from each arm's committed
    checkpoint equal that arm's per-case records (an arm scored with another arm's weights, say
    the last one loaded, makes candidate-minus-control differences exactly zero)."""
    import torch
    from gradshare.data.documents import encode
    from gradshare.data.tokenizer import load_tokenizer
    from gradshare.model.evaluate import score_test
    from gradshare.model.lm import load_model
    from gradshare.tracking import store

    prep = study_runs.prepare_run(scored)
    tok = load_tokenizer(study_runs.download(prep.info.run_id, "inputs/tokenizer", tmp_path))
    probe = read_jsonl(study_runs.download(prep.info.run_id, "inputs/eval/probes.jsonl", tmp_path))[0]
    case = read_jsonl(study_runs.download(prep.info.run_id, "inputs/eval/test_tasks.jsonl", tmp_path))[0]
    _, commitment = store.commitment(scored)
    recomputed = {}
    for entry in commitment["arms"]:
        arm = entry["arm"]
        model = load_model(study_runs.download(entry["run_id"], "checkpoint", tmp_path / arm))
        [run] = study_runs.search(scored, "score", arm, status="FINISHED")
        got = tmp_path / f"scored-{arm}"
        tests = {r["case_id"]: r for r in read_jsonl(study_runs.download(run.info.run_id, "per_case/test.jsonl", got))}
        probes = {r["probe_id"]: r for r in read_jsonl(study_runs.download(run.info.run_id, "per_case/retention.jsonl",
                                                                            got))}
        ids, mask = encode(tok, probe, PLAN.data.max_doc_tokens)
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].double(), -1)
        nll = [-logp[t - 1, ids[t]].item() for t in range(1, len(ids)) if mask[t]]
        recomputed[arm] = sum(nll) / len(nll)
        assert probes[probe["id"]]["nll_nats"] == pytest.approx(recomputed[arm], rel=1e-5), arm
        [row] = score_test(model, tok, [case], PLAN, torch.device("cpu"), log=lambda *_: None)
        assert tests[case["id"]]["prediction"] == row["prediction"], arm
    # the check can tell the arms apart: PowerSGD's weights are not the plain arms'
    assert abs(recomputed["powersgd"] - recomputed["single"]) > 1e-4, recomputed
    assert abs(recomputed["powersgd8"] - recomputed["powersgd"]) > 1e-6, recomputed  # rank 8 is its own model
