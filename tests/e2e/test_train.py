"""`train`: arms that differ only in how the gradient is communicated (the small study's four:
the study's three, and PowerSGD at rank 8)."""
import json

import pytest
import torch

from gradshare.contract.plan import load_plan
from gradshare.contract.tags import ARM, ATTEMPT, CKPT_SHA, FAILURE, REFUSAL, STEP, STUDY
from gradshare.tracking import connection
from gradshare.tracking import study_runs
from tests.conftest import SMALL, SMALL_STUDY, overrides, run_entry

pytestmark = pytest.mark.e2e

ARMS = load_plan("tiny", SMALL_STUDY).arms.names


def _finished(study, arm):
    [run] = study_runs.search(study, "train", arm, status="FINISHED")
    return run


def _weights(run, tmp_path):
    from safetensors.torch import load_file
    ckpt = study_runs.download(run.info.run_id, "checkpoint", tmp_path / run.info.run_id)
    return load_file(str(ckpt / "model.safetensors"))


def test_every_arm_sees_the_same_documents_in_the_same_order(trained_study, tmp_path):
    prep = study_runs.prepare_run(trained_study)
    sched = json.loads(study_runs.download(prep.info.run_id, "inputs/schedule.json", tmp_path).read_text())
    for arm in ARMS:
        run = _finished(trained_study, arm)
        seen = study_runs.download(run.info.run_id, "schedule/update_sha256.txt", tmp_path / arm).read_text().split()
        assert seen == sched["update_sha256"], arm
    assert len({_finished(trained_study, a).data.tags["gradshare.schedule_sha256"] for a in ARMS}) == 1


def test_single_and_dense_give_the_same_weights_within_float32_tolerance(trained_study, tmp_path):
    single = _weights(_finished(trained_study, "single"), tmp_path)
    dense = _weights(_finished(trained_study, "dense"), tmp_path)
    seed = _weights_of_seed(trained_study, tmp_path)
    assert single.keys() == dense.keys()
    for k in single:
        torch.testing.assert_close(dense[k], single[k], rtol=1e-4, atol=2e-5, msg=k)
    # and training really moved them: the agreement is not that of two untouched copies
    assert max((single[k] - seed[k]).abs().max().item() for k in single) > 1e-3


def _weights_of_seed(study, tmp_path):
    from safetensors.torch import load_file
    prep = study_runs.prepare_run(study)
    d = study_runs.download(prep.info.run_id, "inputs/seed_model", tmp_path / "seed")
    return load_file(str(d / "model.safetensors"))


def test_powersgd_differs_from_dense_only_after_the_warm_up(trained_study):
    c = connection.client()
    loss = {a: [m.value for m in sorted(c.get_metric_history(_finished(trained_study, a).info.run_id,
                                                              "train/loss"), key=lambda m: m.step)]
            for a in ("dense", "powersgd")}
    warm = load_plan("tiny", SMALL).powersgd.warmup_updates
    # Updates 1..warm are plain all-reduce, and the loss of update warm+1 is computed before
    # the first compressed exchange changes any weight.
    assert loss["powersgd"][:warm + 1] == pytest.approx(loss["dense"][:warm + 1], rel=1e-5)
    # the first compressed exchange moves the weights, so the next loss differs
    assert abs(loss["powersgd"][warm + 1] - loss["dense"][warm + 1]) > 1e-6 * abs(loss["dense"][warm + 1])


def _expected_compressed_bytes(weights, rank, rate=2.0):
    """Hand count of PowerSGD's payload: P and Q for matrices worth compressing, the rest whole."""
    total = 0
    for t in weights.values():
        if t.ndim <= 1:
            total += t.numel() * 4
            continue
        rows = t.shape[0]
        cols = t.numel() // rows
        r = min(rank, rows, cols)
        total += ((rows + cols) * r if (rows + cols) * r * rate < rows * cols else rows * cols) * 4
    return total


def test_powersgd_logical_bytes_after_warm_up_are_below_dense_by_the_expected_ratio(trained_study, tmp_path):
    c = connection.client()
    plan = load_plan("tiny", SMALL_STUDY)
    hist = {a: {m.step: m.value for m in c.get_metric_history(_finished(trained_study, a).info.run_id,
                                                                 "comm/logical_bytes")}
            for a in ("dense", "powersgd", "powersgd8", "fp16")}
    weights = _weights(_finished(trained_study, "dense"), tmp_path)
    weights.pop("lm_head.weight", None)  # tied to the embedding: one parameter, one gradient
    dense_bytes = sum(t.numel() * 4 for t in weights.values())
    expected = _expected_compressed_bytes(weights, plan.powersgd.rank)
    w = plan.powersgd.warmup_updates
    assert hist["dense"] == {u: dense_bytes for u in range(1, 9)}
    assert all(hist["powersgd"][u] == dense_bytes for u in range(1, w + 1))
    assert all(hist["powersgd"][u] == expected for u in range(w + 1, 9))
    assert dense_bytes / expected > 2.0
    # the fourth arm's row sets rank 8: its own P and Q after the same warm-up, fewer than rank 32's
    at8 = _expected_compressed_bytes(weights, plan.arm("powersgd8").rank)
    assert plan.arm("powersgd8").rank == 8 and at8 < expected
    assert hist["powersgd8"] == {u: dense_bytes if u <= w else at8 for u in range(1, 9)}
    # the fifth arm's kind, fp16: two bytes an element from the first update
    assert hist["fp16"] == {u: dense_bytes // 2 for u in range(1, 9)}


def test_every_arm_logs_per_step_metrics_and_summaries(trained_study):
    c = connection.client()
    per_step = ["train/loss", "train/grad_norm", "perf/step_s", "perf/tokens_per_s", "perf/gpu_s",
                "comm/logical_bytes", "comm/wire_tx_bytes", "comm/wire_rx_bytes"]
    summary = ["perf/active_s", "perf/active_tokens_per_s", "perf/gpu_s_total", "ckpt/save_s",
               "ckpt/bytes", "comm/logical_bytes_total", "comm/logical_bytes_post_warmup"]
    for arm in ARMS:
        run = _finished(trained_study, arm)
        for key in per_step:
            assert sorted(m.step for m in c.get_metric_history(run.info.run_id, key)) == list(range(1, 9)), (arm, key)
        for key in summary:
            assert key in run.data.metrics, (arm, key)
        assert run.data.metrics["perf/gpu_s_total"] >= run.data.metrics["perf/active_s"]
        assert len(run.data.tags[CKPT_SHA]) == 64
        assert run.data.tags[ARM] == arm and run.data.tags[STEP] == "train"
        assert any(k.startswith("system/") for k in run.data.metrics), arm  # MLflow system metrics
        # the arm's phases, measured: what the limits read instead of declared start-up figures
        from gradshare.contract import metrics as M
        m = run.data.metrics
        assert all(m[M.phase_s(p)] >= 0 for p in M.PHASES), (arm, {p: m.get(M.phase_s(p)) for p in M.PHASES})
        assert m[M.phase_s("updates")] == m["perf/active_s"] and m[M.phase_s("checkpoint_write")] == m["ckpt/save_s"]
        first = min(c.get_metric_history(run.info.run_id, "perf/step_s"), key=lambda x: x.step)
        assert m[M.phase_s("first_update")] == first.value
        shapes = json.loads(study_runs.read_text(study_runs.prepare_run(trained_study).info.run_id, "model_shapes.json"))
        assert m[M.REPLICA_TENSORS] == len(shapes["shapes"])  # every parameter compared


def test_the_checkpoint_upload_to_the_tracking_server_is_metered_as_its_own_line(trained_study):
    from gradshare.contract import metrics as M
    for arm in ARMS:
        m = _finished(trained_study, arm).data.metrics
        # the test server listens on 127.0.0.1: the checkpoint's bytes cross loopback, once at least
        assert m[M.loopback_bytes("upload")] >= m[M.CKPT_BYTES] > 0, arm
        assert M.wire_tx_bytes("upload") in m


def test_the_checkpoint_hash_tag_is_the_hash_of_the_logged_checkpoint(trained_study, tmp_path):
    from gradshare.util.hashing import checkpoint_sha256
    run = _finished(trained_study, "powersgd")
    ckpt = study_runs.download(run.info.run_id, "checkpoint", tmp_path)
    assert checkpoint_sha256(ckpt) == run.data.tags[CKPT_SHA]
    assert (ckpt / "model.safetensors").exists() and (ckpt / "config.json").exists()
    assert (ckpt / "tokenizer.json").exists()


def test_a_nan_loss_ends_the_run_failed_with_a_reason_and_the_default_plan_allows_no_retry(failing_study):
    proc = run_entry("train", "--study", failing_study, "--arm", "dense",
                     env={"GRADSHARE_INJECT_NAN_AT": "3"}, check=False)
    assert proc.returncode != 0
    [run] = study_runs.search(failing_study, "train", "dense")
    assert run.info.status == "FAILED"
    assert "diverged" in run.data.tags[FAILURE] and "update 3" in run.data.tags[FAILURE]
    assert run.data.tags[ATTEMPT] == "1"
    # the default plan allows one attempt: the arm is refused a second, naming the first
    from gradshare.contract.plan import load_plan

    assert load_plan("tiny").arms.max_attempts == 1
    again = run_entry("train", "--study", failing_study, "--arm", "dense", check=False)
    assert again.returncode != 0
    first, refused = study_runs.search(failing_study, "train", "dense")
    assert first.info.run_id == run.info.run_id and refused.info.status == "KILLED"  # a refusal, not a failure
    assert refused.data.tags[REFUSAL] == "true" and ATTEMPT not in refused.data.tags
    assert "used its 1 attempt" in refused.data.tags[FAILURE] and run.info.run_id in refused.data.tags[FAILURE]


def test_an_arm_that_would_overlap_a_running_arm_is_refused(failing_study):
    import mlflow
    from gradshare.tracking import claims
    c = connection.client()
    exp = mlflow.get_experiment_by_name(failing_study)
    other = c.create_run(exp.experiment_id, tags={STUDY: failing_study, STEP: "train", ARM: "single"})
    # a running arm as train leaves it: a RUNNING run holding its claim in the study's ledger
    claims.append(study_runs.prepare_run(failing_study).info.run_id, "train", "single", other.info.run_id)
    try:
        proc = run_entry("train", "--study", failing_study, "--arm", "powersgd", check=False)
    finally:
        c.set_tag(other.info.run_id, REFUSAL, "true")  # the stand-in was no attempt of single
        c.set_terminated(other.info.run_id, "KILLED")
    assert proc.returncode != 0
    [run] = study_runs.search(failing_study, "train", "powersgd")
    assert run.info.status == "KILLED" and "never overlapping" in run.data.tags[FAILURE]
    assert other.info.run_id in run.data.tags[FAILURE] and run.data.tags[REFUSAL] == "true"


def test_an_arm_without_its_devices_is_refused_naming_what_it_needs(mlflow_server):
    study = "gpu-study-on-cpu"
    prep = run_entry("prepare", "--study", study, *overrides({"model.pretrain_steps": "1", "hardware.device": "cuda"}))
    # prepare runs anywhere, and says in one line what the arms will need
    [note] = [line for line in prep.stdout.splitlines() if line.startswith("[gradshare] note:")]
    assert "single 1 GPU, dense 2 GPUs, powersgd 2 GPUs" in note and "this machine has 0" in note
    for arm, needs in (("dense", "needs 2 CUDA device(s), 2 on this host, and this host has 0"),
                       ("single", "needs 1 CUDA device(s), 1 on this host, and this host has 0")):
        proc = run_entry("train", "--study", study, "--arm", arm, check=False)
        assert proc.returncode != 0
        [run] = study_runs.search(study, "train", arm)
        reason = run.data.tags[FAILURE]
        assert needs in reason and run.data.tags[REFUSAL] == "true" and ATTEMPT not in run.data.tags
        # one GPU is what single needs: no word of a second host; dense may take two hosts
        assert ("num_machines=2" in reason) == (arm == "dense"), reason


def test_a_corrupted_input_is_refused_without_an_attempt_and_the_arm_trains_once_fixed(mlflow_server,
                                                                                        failing_study, tmp_path):
    """...and neither the refused step nor the one that trained leaves a temporary folder."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # Tamper with one registered byte in the server's artifact store, then train.
    prep = study_runs.prepare_run(failing_study)
    [path] = list(mlflow_server.artifacts.rglob(f"{prep.info.run_id}/artifacts/inputs/data/replay.jsonl"))
    original = path.read_bytes()
    path.write_bytes(original[:-2] + b" \n")
    try:
        proc = run_entry("train", "--study", failing_study, "--arm", "single", check=False, env={"TMPDIR": str(tmp)})
    finally:
        path.write_bytes(original)
    assert proc.returncode != 0
    assert not list(tmp.glob("gradshare-*"))
    [refused] = [r for r in study_runs.search(failing_study, "train", "single") if "replay.jsonl" in r.data.tags.get(FAILURE, "")]
    reason = refused.data.tags[FAILURE]
    assert "data/replay.jsonl" in reason and "manifest" in reason and "no attempt used" in reason
    assert refused.data.tags[REFUSAL] == "true" and ATTEMPT not in refused.data.tags
    # the store's byte restored: the arm trains, as its first attempt (the plan allows one)
    run_entry("train", "--study", failing_study, "--arm", "single", env={"TMPDIR": str(tmp)})
    [done] = study_runs.search(failing_study, "train", "single", status="FINISHED")
    assert done.data.tags[ATTEMPT] == "1"
    assert not list(tmp.glob("gradshare-*"))


def test_an_arm_that_already_finished_is_not_trained_again(trained_study):
    proc = run_entry("train", "--study", trained_study, "--arm", "single", check=False)
    assert proc.returncode != 0
    assert len(study_runs.search(trained_study, "train", "single", status="FINISHED")) == 1
    refused = [r for r in study_runs.search(trained_study, "train", "single") if r.data.tags.get(REFUSAL) == "true"]
    assert "already finished" in refused[-1].data.tags[FAILURE]


def test_two_host_launch_needs_a_shared_port_and_a_valid_machine_rank(prepared_study):
    proc = run_entry("train", "--study", prepared_study, "--arm", "dense", "--num-machines", "2",
                     "--machine-rank", "1", check=False)
    assert proc.returncode != 0 and "main_process_port" in proc.stderr
    # the second host opened no run of its own: rank 0's run is the arm's record
    assert all(r.data.params.get("machine_rank", "0") == "0" for r in study_runs.search(prepared_study, "train"))


def test_a_local_hugging_face_seed_model_is_loaded_and_its_files_are_verified(prepared_study, tmp_path):
    """The full profile's loading path (`model.source=hf:/dir`) on a model directory made here."""
    import shutil
    prep = study_runs.prepare_run(prepared_study)
    model_dir = study_runs.download(prep.info.run_id, "inputs/seed_model", tmp_path)
    for f in study_runs.download(prep.info.run_id, "inputs/tokenizer", tmp_path / "tok").iterdir():
        shutil.copy(f, model_dir / f.name)
    study = "hf-seed-study"
    run_entry("prepare", "--study", study, *overrides({"model.source": f"hf:{model_dir}"}))
    manifest = json.loads(study_runs.download(study_runs.prepare_run(study).info.run_id, "inputs/manifest.json", tmp_path / "m").read_text())
    assert manifest["seed_model"]["kind"] == "local-hf"
    assert {e["path"] for e in manifest["seed_model"]["files"]} >= {"config.json", "model.safetensors", "tokenizer.json"}
    run_entry("train", "--study", study, "--arm", "single")
    # one changed byte in the local model directory after prepare: train refuses
    weights = model_dir / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    proc = run_entry("train", "--study", study, "--arm", "dense", check=False)
    assert proc.returncode != 0
    [run] = study_runs.search(study, "train", "dense")
    assert "local seed model" in run.data.tags[FAILURE] and run.data.tags[REFUSAL] == "true"
