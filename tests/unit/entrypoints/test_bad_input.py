"""Bad parameters are refused before any work: one line that names the parameter and what it
may be, no run made (so none left RUNNING), and nothing already stored changed.

Through `mlflow run` the plugin refuses before MLflow makes a run; straight to an entry
point (`python -m entrypoints.train`), the step's own argument check refuses before it opens
one. The model checks read local files only: the model directories are made here."""
import uuid

import mlflow
import pytest

from gradshare.model.source import check_model_source
from gradshare.contract.plan import load_plan
from entrypoints.mlflow_run_checks import refusal
from gradshare.contract.tags import STEP, STUDY
from gradshare.contract.errors import Refusal
from gradshare.tracking import connection
from tests.conftest import REPO, all_runs as _all_runs, mlflow_run_as_typed as _mlflow_run, run_entry

MODEL_SOURCE_FORMS = ("model.source is one of: tiny", "hf:/local/dir", "random-qwen3-1.7b")


def _store() -> dict:
    """Every run's status, end and tags, and every experiment's name: what a refusal must not touch."""
    return {"runs": {r.info.run_id: (r.info.status, r.info.end_time, r.data.tags) for r in _all_runs()},
            "experiments": {e.experiment_id: e.name for e in connection.client().search_experiments()}}


# The cases run as real `mlflow run` commands (about 5 s each); every other case asks the
# plugin's own decision (`refusal`, the same function, in-process) for its line. The real ones
# carry the e2e marker: `pytest -m "not e2e"` leaves them out.
REAL = {"negative rank", "prepare-missing directory", "study-BERT config", "threshold not a number"}


def _cases(argvalues, ids):
    """`parametrize`'s cases with their ids, those in REAL marked e2e."""
    return [pytest.param(*values, id=name, marks=[pytest.mark.e2e] if name in REAL else [])
            for values, name in zip(argvalues, ids)]


def _refused_before_any_run(request, *args: str) -> str:
    """The one `gradshare:` line refusing `mlflow run . ARGS`; for the REAL cases, the command is
    run and must print that line, exit non-zero and leave the store as it was."""
    line = refusal([str(REPO), *args])
    assert line is not None and line.startswith("gradshare:") and line.endswith("nothing was recorded"), line
    if request.node.callspec.id in REAL:
        before = _store()
        proc = _mlflow_run(*args)
        assert proc.returncode != 0
        assert [x for x in proc.stderr.splitlines() if x.startswith("gradshare:")] == [line], proc.stderr[-3000:]
        assert _store() == before
        # none left RUNNING by this command (a run another test on this worker's server left
        # RUNNING is not this refusal's: it once failed this line when both modules shared a worker)
        assert not [r for r in _all_runs() if r.info.status == "RUNNING" and r.info.run_id not in before["runs"]]
    return line


def _train(*params: str) -> list[str]:
    args = ["-e", "train", "--env-manager", "local", "-P", "study=bad-input", "-P", "arm=dense"]
    for p in params:
        args += ["-P", p]
    return args


# -- train's launch parameters -------------------------------------------------------------

@pytest.mark.parametrize("params, named, allowed", _cases([
    (["machine_rank=-1"], "machine_rank=-1", "give an integer in 0..0"),
    (["num_machines=2", "main_process_port=29500", "machine_rank=2"], "machine_rank=2", "give an integer in 0..1"),
    (["num_machines=0"], "num_machines=0", "give an integer >= 1"),
    (["num_machines=two"], "num_machines=two", "give an integer >= 1"),
    (["full_state_every=-3"], "full_state_every=-3", "give an integer >= 1 (a full-state checkpoint every so "
                                                     "many updates), or 0 for none"),
    (["full_state_every=often"], "full_state_every=often", "or 0 for none"),
    (["main_process_port=70000"], "main_process_port=70000", "give an integer in 0..65535"),
    (["num_machines=2", "machine_rank=1"], "main_process_port=0", "give every host the same port in 1..65535"),
], ["negative rank", "rank past the hosts", "no hosts", "hosts not a number", "negative full-state interval",
     "full-state interval not a number", "port past 65535", "two hosts without a port"]))
def test_a_launch_parameter_that_cannot_work_is_refused_before_any_run_with_its_allowed_values(
        mlflow_server, request, params, named, allowed):
    line = _refused_before_any_run(request, *_train(*params))
    assert line.startswith(f"gradshare: -P {named} ") and allowed in line, line


@pytest.mark.parametrize("param, said", [
    ("machine-rank=1", "not a parameter of -e train: did you mean 'machine_rank'?"),
    ("schedule.updates=3", "-e train takes its plan from the prepare run: plan fields are set at -e prepare"),
], ids=["misspelt launch parameter", "plan field at train"])
def test_a_parameter_train_does_not_take_is_refused_before_any_run_naming_what_it_takes(mlflow_server, request,
                                                                                      param, said):
    line = _refused_before_any_run(request, *_train(param))
    assert f"-P {param}" in line and said in line, line


@pytest.mark.parametrize("flags, said", [
    (["--machine-rank", "-1"], "argument --machine-rank: machine_rank=-1 is not a machine rank for "
                               "num_machines=1: give an integer in 0..0"),
    (["--num-machines", "2", "--main-process-port", "29500", "--machine-rank", "2"],
     "argument --machine-rank: machine_rank=2 is not a machine rank for num_machines=2: give an integer in 0..1"),
    (["--machine-rank", "one"], "argument --machine-rank: invalid int value: 'one'"),
    (["--num-machines", "0"], "argument --num-machines: num_machines=0 is not a number of hosts: "
                              "give an integer >= 1"),
    (["--full-state-every", "-3"], "argument --full-state-every: full_state_every=-3 is not a number of updates"),
    (["--main-process-port", "65536"], "argument --main-process-port: main_process_port=65536 is not a port: "
                                       "give an integer in 0..65535"),
], ids=["negative rank", "rank past the hosts", "rank not a number", "no hosts", "negative full-state interval",
        "port past 65535"])
def test_a_bad_launch_straight_to_the_train_entry_point_is_refused_before_any_run(mlflow_server, flags, said):
    before = _store()
    proc = run_entry("train", "--study", "bad-launch", "--arm", "dense", *flags, check=False)
    assert proc.returncode == 2
    [line] = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert said in line, proc.stderr[-3000:]
    assert _store() == before and mlflow.get_experiment_by_name("bad-launch") is None


def test_the_driver_refuses_the_same_launches_for_callers_that_skip_the_entry_point():
    from gradshare.train.launch import Launch, check_launch

    check_launch(Launch(num_machines=2, machine_rank=1, main_process_port=29500), full_state_every=2)
    for launch, every, said in [
        (Launch(machine_rank=-1), 0, "machine_rank=-1 is not a machine rank for num_machines=1"),
        (Launch(num_machines=2, machine_rank=1), 0, "main_process_port=0 (any free port) works on one host only"),
        (Launch(main_process_port=70000), 0, "main_process_port=70000 is not a port"),
        (Launch(), -1, "full_state_every=-1 is not a number of updates"),
    ]:
        with pytest.raises(Refusal, match=said.replace("(", r"\(").replace(")", r"\)")):
            check_launch(launch, every)


# -- the model -------------------------------------------------------------------------------

def _tiny_causal_lm(path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    Qwen3ForCausalLM(cfg).save_pretrained(str(path))  # config.json (architectures) and weights
    return path


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """A model directory for each way `hf:` can name something no step could load, and a good one."""
    from transformers import BertConfig, Qwen3Config

    from gradshare.data.tokenizer import train_bpe

    root = tmp_path_factory.mktemp("models")
    (root / "no-config").mkdir()
    small_bert = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    BertConfig(**small_bert).save_pretrained(str(root / "bert"))
    BertConfig(**small_bert, architectures=["BertForMaskedLM"]).save_pretrained(str(root / "bert-mlm"))
    Qwen3Config(architectures=["Qwen3ForCausalLM"]).save_pretrained(str(root / "no-weights"))
    _tiny_causal_lm(root / "no-tokenizer")
    train_bpe(["a small tokenizer for a small model"] * 4, 64, _tiny_causal_lm(root / "good"))
    return root


# kind -> (the plan field as `-P` gives it, given the model directories; what the line says is wrong)
BAD_MODELS = {
    "missing directory": (lambda d: f"model.source=hf:{d}/nowhere", "which does not exist"),
    "no config.json": (lambda d: f"model.source=hf:{d}/no-config", "which holds no config.json"),
    "BERT config": (lambda d: f"model.source=hf:{d}/bert", "a 'bert' model with no architectures, not a causal LM"),
    "BERT masked-LM checkpoint": (lambda d: f"model.source=hf:{d}/bert-mlm",
                                  "a 'bert' model with architectures ['BertForMaskedLM'], not a causal LM"),
    "causal LM without weights": (lambda d: f"model.source=hf:{d}/no-weights",
                                  "which holds no weights: expected one of model.safetensors"),
    "causal LM without tokenizer": (lambda d: f"model.source=hf:{d}/no-tokenizer",
                                    "which holds no tokenizer: expected tokenizer.json or tokenizer_config.json"),
    "none of the forms": (lambda d: "model.source=gpt2", "model.source='gpt2' is none of the allowed forms"),
}


MODEL_CASES = [("prepare", k) for k in BAD_MODELS] + [("study", "missing directory"), ("study", "BERT config")]


@pytest.mark.parametrize("entry, kind", _cases(MODEL_CASES, [f"{entry}-{kind}" for entry, kind in MODEL_CASES]))
def test_a_model_no_step_could_load_is_refused_before_any_run_naming_the_allowed_forms(
        mlflow_server, request, model_dirs, entry, kind):
    param, wrong = BAD_MODELS[kind]
    line = _refused_before_any_run(request, "-e", entry, "--env-manager", "local", "-P", "study=bad-model",
                                   "-P", param(model_dirs))
    assert line.startswith("gradshare: model.source=") and wrong in line, line
    assert all(form in line for form in MODEL_SOURCE_FORMS), line


def test_a_model_config_not_among_the_configs_is_refused_before_any_run_naming_them(mlflow_server):
    line = refusal([str(REPO), "-e", "prepare", "--env-manager", "local", "-P", "study=bad-model",
                    "-P", "model.config=qwen3_17b.json"])
    assert "model.config='qwen3_17b.json' is not a file in gradshare/model/configs" in line
    assert "choose one of qwen3_1p7b.json, tiny_qwen3.json" in line


def test_a_complete_local_causal_lm_passes_the_model_check(model_dirs):
    check_model_source(load_plan("tiny", {"model.source": f"hf:{model_dirs / 'good'}"}))
    check_model_source(load_plan("tiny", {"model.source": "hf:good"}), base=model_dirs)  # relative to the steps' dir
    check_model_source(load_plan("full"))  # random-qwen3-1.7b


@pytest.mark.parametrize("entry, flags, said", [
    ("prepare", ["--model.source", "hf:/no/such/model"], "model.source='hf:/no/such/model' names /no/such/model, "
                                                          "which does not exist"),
    ("study", ["--model.source", "hf:/no/such/model"], "which does not exist"),
    ("prepare", ["--arms.rows", "single:single:1,dense:dense:3,powersgd:powersgd:2"], "dense's 3 processes (arms.rows)"),
], ids=["prepare, missing model", "study, missing model", "prepare, impossible plan"])
def test_a_new_study_refused_straight_to_its_entry_point_archives_nothing(mlflow_server, entry, flags, said):
    """`--new-study true` archives the study it replaces: a refused one must leave that study
    where it was, with its runs as they were."""
    study = f"kept-{entry}-{uuid.uuid4().hex[:8]}"
    c = connection.client()
    kept = c.create_experiment(study)
    run = c.create_run(kept, tags={STUDY: study, STEP: "prepare"})
    c.set_terminated(run.info.run_id, "FINISHED")
    before = _store()
    proc = run_entry(entry, "--study", study, "--new-study", "true", *flags, check=False)
    assert proc.returncode == 2
    [line] = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert said in line, proc.stderr[-3000:]
    if "model.source" in flags:
        assert all(form in line for form in MODEL_SOURCE_FORMS), line
    assert _store() == before  # not archived, no run added
    assert mlflow.get_experiment_by_name(study).experiment_id == kept


# -- plan values through `mlflow run` ---------------------------------------------------------

@pytest.mark.parametrize("entry, param, said", _cases([
    ("prepare", "screen.retention_upper_nats=abc", "plan parameter screen.retention_upper_nats='abc' is not a valid float"),
    ("prepare", "schedule.docs_per_update=7", "schedule.updates x schedule.docs_per_update = 128 x 7 = 896, but the "
                                              "training documents number"),
    ("study", "schedule.docs_per_update=7", "= 4096; each document is used exactly once"),
    ("prepare", "powersgd.rank=-1", "powersgd.rank must be >= 1"),
    ("prepare", "updates=3", "-P updates=3 is not a parameter of -e prepare: did you mean 'schedule.updates'?"),
], ["threshold not a number", "updates break the 4,096 documents", "the same at study", "negative PowerSGD rank",
    "field without its concern"]))
def test_a_plan_value_that_cannot_be_run_is_refused_before_any_run_naming_the_field(mlflow_server, request, entry,
                                                                                   param, said):
    line = _refused_before_any_run(request, "-e", entry, "--env-manager", "local", "-P", "study=bad-plan", "-P", param)
    assert said in line, line
