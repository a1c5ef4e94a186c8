"""The plan: every study number in one frozen object, hashed, overridable, validated."""
import dataclasses
import json

import pytest

from gradshare.contract.plan import Plan, PlanError, load_plan, plan_from_dict
from gradshare.tracking import study_runs


def test_default_plan_holds_the_study_numbers():
    p = load_plan()
    assert p.study.profile == "tiny"
    assert p.arms.names == ("single", "dense", "powersgd")
    assert (p.schedule.updates, p.schedule.docs_per_update) == (128, 32)
    assert (len(p.data.families) * p.data.train_per_family, p.test_cases) == (3072, 1024)
    assert (p.data.replay_docs, p.data.retention_probes) == (1024, 128)
    assert (p.powersgd.rank, p.powersgd.warmup_updates, p.powersgd.warm_start) == (32, 8, True)
    assert p.powersgd.error_feedback == "fp32-host"
    s = p.screen
    assert (s.task_gain_pp, s.retention_upper_nats, s.noninferiority_pp, s.z, s.speed_ratio) == \
        (10.0, 0.02, -3.0, 1.96, 1.10)
    assert (p.infra.usd_per_host_hour, p.infra.deadline_hours, p.infra.budget_usd) == (2.24208, 6.0, 100.0)
    assert p.infra.zones == ("us-east-1a", "us-east-1b")


def test_plan_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        load_plan().schedule.updates = 3


def test_a_changed_plan_number_changes_plan_sha256():
    base = load_plan()
    assert load_plan().sha256() == base.sha256()
    assert load_plan("tiny", {"screen.z": "2.0"}).sha256() != base.sha256()
    assert load_plan("tiny", {"infra.usd_per_host_hour": "2.5"}).sha256() != base.sha256()


def test_plan_sha256_is_the_hash_of_canonical_json():
    import hashlib
    p = load_plan()
    text = json.dumps(dataclasses.asdict(p), sort_keys=True, separators=(",", ":"))
    assert p.sha256() == hashlib.sha256(text.encode()).hexdigest()


def test_overrides_arrive_as_strings_and_are_typed():
    p = load_plan("tiny", {"powersgd.rank": "16", "powersgd.warm_start": "false", "optim.lr": "5e-4",
                           "data.families": "boolean_expressions,word_sorting",
                           "data.train_per_family": "1536"})
    assert p.powersgd.rank == 16 and p.powersgd.warm_start is False and p.optim.lr == 5e-4
    assert p.data.families == ("boolean_expressions", "word_sorting")


def test_32_documents_over_3_ranks_without_a_fitting_micro_batch_is_refused():
    with pytest.raises(PlanError) as e:
        load_plan("tiny", {"arms.rows": "single:single:1,dense:dense:3,powersgd:powersgd:2"})
    msg = str(e.value)
    assert "dense's 3 processes (arms.rows)" in msg and "schedule.docs_per_update=32" in msg
    assert "schedule.micro_batch_docs=4" in msg


def test_a_schedule_that_does_not_use_each_document_once_is_refused():
    with pytest.raises(PlanError, match="each document is used exactly once"):
        load_plan("tiny", {"schedule.updates": "100"})


def test_warm_up_longer_than_training_is_refused():
    with pytest.raises(PlanError, match="powersgd.warmup_updates"):
        load_plan("tiny", {"powersgd.warmup_updates": "128"})


def test_unknown_or_mistyped_parameters_are_named():
    with pytest.raises(PlanError, match="unknown plan parameter 'schedule.update'"):
        load_plan("tiny", {"schedule.update": "8"})
    with pytest.raises(PlanError, match="schedule.updates='eight'"):
        load_plan("tiny", {"schedule.updates": "eight"})
    with pytest.raises(PlanError, match="unknown profile"):
        load_plan("huge")


def test_bf16_on_cpu_is_refused():
    with pytest.raises(PlanError, match="bf16-autocast needs hardware.device=cuda"):
        load_plan("tiny", {"hardware.precision": "bf16-autocast"})


def test_plan_round_trips_through_plan_json():
    p = load_plan("full")
    again = plan_from_dict(json.loads(p.canonical_json()))
    assert again == p and again.sha256() == p.sha256()


def test_every_field_is_a_flat_mlflow_parameter():
    flat = Plan().flat()
    assert flat["schedule.updates"] == "128" and flat["arms.rows"] == "single:single:1,dense:dense:2,powersgd:powersgd:2"
    assert all(isinstance(v, str) and len(v) < 6000 for v in flat.values())


def test_powersgd_needs_two_plain_exchanges_before_error_feedback():
    with pytest.raises(PlanError, match="powersgd.warmup_updates=1 must be >= 2"):
        load_plan("tiny", {"powersgd.warmup_updates": "1"})


def test_the_gradshare_command_names_its_steps_and_refuses_unknown_ones():
    import subprocess, sys
    ok = subprocess.run([sys.executable, "-m", "entrypoints.cli", "--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and "gradshare train" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "entrypoints.cli", "fly"], capture_output=True, text=True)
    assert bad.returncode == 2
    step = subprocess.run([sys.executable, "-m", "entrypoints.cli", "commit", "--help"], capture_output=True, text=True)
    assert step.returncode == 0 and "commitment.json" in step.stdout


def test_the_one_gpu_rehearsal_is_a_cuda_plan_and_says_what_it_is_not():
    full = load_plan("full", {"hardware.rehearsal": "one-gpu"})
    assert full.rehearsal_note == "rehearsal on one GPU: speed and cost are not the study's"
    assert load_plan("full").rehearsal_note is None
    assert full.sha256() != load_plan("full").sha256()  # a rehearsal is another plan, never the study's
    with pytest.raises(PlanError, match="needs hardware.device=cuda"):
        load_plan("tiny", {"hardware.rehearsal": "one-gpu"})
    with pytest.raises(PlanError, match="is not one-gpu"):
        load_plan("full", {"hardware.rehearsal": "two-gpus"})


def test_a_rehearsal_asked_for_on_the_cpu_profile_is_refused_by_prepare_with_the_reason(mlflow_server):
    from tests.conftest import overrides, run_entry

    proc = run_entry("prepare", "--study", "rehearsal-on-cpu", *overrides({"hardware.rehearsal": "one-gpu"}),
                     check=False)
    assert proc.returncode != 0
    assert "hardware.rehearsal=one-gpu puts both processes of a two-process arm on one CUDA GPU" in proc.stderr
    assert not study_runs.search("rehearsal-on-cpu", "prepare", status="FINISHED")  # nothing prepared


def test_the_hang_bound_is_so_many_expected_updates_never_under_the_stall_bound():
    """Fixed figures, not the function's own formula (a hang bound with hang_updates squared once
    passed the e2e test, which computes its expectation with `hang_s` itself)."""
    arms = load_plan("tiny", {"arms.hang_updates": "10", "arms.expected_update_s": "4", "arms.stall_s": "30"}).arms
    assert arms.hang_s() == 40.0
    assert load_plan("tiny", {"arms.hang_updates": "10", "arms.expected_update_s": "2.5",
                              "arms.stall_s": "30"}).arms.hang_s() == 30.0  # the stall bound, not 25
    assert load_plan("tiny", {"arms.hang_updates": "3", "arms.expected_update_s": "20",
                              "arms.stall_s": "30"}).arms.hang_s() == 60.0
