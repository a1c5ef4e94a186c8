"""`analyze`: verdicts from the tracking store, checked against independent statistics. (The
report's pieces on records made by hand: tests/unit/analysis/test_report.py.)"""
import json

import numpy as np
import pytest
import scipy.stats as sps

from gradshare.cost import limits
from gradshare.cost.volume import GB
from gradshare.util.jsonio import read_jsonl
from gradshare.tracking import connection, store
from gradshare.tracking import figures as study_figures
from gradshare.tracking import study_runs
from tests.conftest import run_entry

pytestmark = pytest.mark.e2e


def _analyze(study, tmp_path, name):
    proc = run_entry("analyze", "--study", study)
    run = study_runs.search(study, "analyze", status="FINISHED")[-1]
    d = tmp_path / name
    files = {p: study_runs.download(run.info.run_id, p, d) for p in ("verdicts.json", "report.md", "report.html")}
    return run, files | {"stdout": proc.stdout}


@pytest.fixture(scope="module")
def analysed(scored_study, tmp_path_factory):
    study = scored_study
    tmp = tmp_path_factory.mktemp("analysis")
    run, files = _analyze(study, tmp, "first")
    return study, run, files, tmp


def _per_case(study, model, tmp_path):
    [run] = study_runs.search(study, "score", model, status="FINISHED")
    d = tmp_path / f"pc-{model}"
    return ({r["case_id"]: r for r in read_jsonl(study_runs.download(run.info.run_id, "per_case/test.jsonl", d))},
            {r["probe_id"]: r for r in read_jsonl(study_runs.download(run.info.run_id, "per_case/retention.jsonl", d))})


def test_paired_changes_and_retention_match_scipy_on_the_studys_per_case_data(analysed):
    study, _, files, tmp = analysed
    v = json.loads(files["verdicts.json"].read_text())
    data = {m: _per_case(study, m, tmp) for m in ("seed", "single", "dense", "powersgd", "powersgd8")}
    for a, b in (("powersgd", "seed"), ("powersgd", "single"), ("powersgd", "dense"),
                 ("single", "seed"), ("dense", "seed"), ("powersgd8", "seed")):
        ids = sorted(data[a][0])
        d = np.array([data[a][0][i]["correct"] - data[b][0][i]["correct"] for i in ids], float)
        se = 0.0 if np.all(d == d[0]) else float(sps.sem(d))
        got = v[f"{a}-{b}"]
        assert got["n"] == len(ids)
        assert got["mean"] == pytest.approx(d.mean(), abs=1e-12)
        assert got["se"] == pytest.approx(se, abs=1e-12)
        assert got["lo"] == pytest.approx(d.mean() - 1.96 * se, abs=1e-12)
        b01 = int(np.sum(d > 0)); b10 = int(np.sum(d < 0))
        p = 1.0 if b01 + b10 == 0 else sps.binomtest(min(b01, b10), b01 + b10, 0.5).pvalue
        assert got["mcnemar"]["p"] == pytest.approx(p)
    ids = sorted(data["seed"][1])
    d = np.array([data["powersgd"][1][i]["nll_nats"] - data["seed"][1][i]["nll_nats"] for i in ids])
    r = v["retention_change"]["powersgd"]
    assert r["mean"] == pytest.approx(d.mean()) and r["upper"] == pytest.approx(d.mean() + 1.96 * sps.sem(d))


def test_screens_are_decided_from_the_declared_thresholds(analysed):
    study, run, files, _ = analysed
    v = json.loads(files["verdicts.json"].read_text())
    q = v["quality_screen"]
    gain = 100 * v["powersgd-seed"]["mean"]
    assert q["checks"]["task_gain"]["value_pp"] == pytest.approx(gain)
    expected = (gain >= 10 and v["retention_change"]["powersgd"]["upper"] <= 0.02
                and 100 * v["powersgd-single"]["lo"] >= -3 and 100 * v["powersgd-dense"]["lo"] >= -3)
    assert q["pass"] is expected
    s = v["speed_screen"]
    tps = {a: study_runs.search(study, "train", a, status="FINISHED")[0].data.metrics["perf/active_tokens_per_s"]
           for a in ("single", "powersgd")}
    assert s["ratio"] == pytest.approx(tps["powersgd"] / tps["single"])
    assert s["pass"] is (s["ratio"] >= 1.10)
    assert run.data.tags["gradshare.quality_screen"] in ("pass", "fail")
    for arm in ("single", "dense", "powersgd"):
        c = v["cost"][arm]
        assert c["usd"] == pytest.approx(c["host_hours"] * 0.1008)  # a CPU run: priced as the CPU host
        assert c["usd_on_study_hosts"] == pytest.approx(c["host_hours"] * 2.24208)  # g6e: projection only
        assert c["gpu_s_total"] >= c["gpu_s_active"] > 0


def test_a_fourth_arm_is_trained_scored_and_reported_like_the_others(analysed):
    """The small study's fourth row, PowerSGD at rank 8 (`powersgd8`): its verdict entries, its
    bytes (its own rank's P and Q, fewer than rank 32's), and its rows in every table of the report
    and the analyze run's columns, beside the three arms'; the screens still judge the candidate."""
    study, run, files, _ = analysed
    v = json.loads(files["verdicts.json"].read_text())
    assert set(v["arms"]) == {"seed", "single", "dense", "powersgd", "powersgd8", "fp16"}
    a = v["arms"]["powersgd8"]
    assert a["status"] == "FINISHED" and a["accuracy"] is not None
    assert "powersgd8-seed" in v["pairs"] and v["retention_change"]["powersgd8"]["upper"] is not None
    assert v["candidate"] == "powersgd" and "powersgd8" not in v["controls"]
    c8, c32 = v["cost"]["powersgd8"], v["cost"]["powersgd"]
    assert 0 < c8["logical_bytes_after_warmup"] < c32["logical_bytes_after_warmup"]
    [t8] = study_runs.search(study, "train", "powersgd8", status="FINISHED")
    assert t8.data.params["powersgd_rank"] == "8"
    md = files["report.md"].read_text()
    tables = [line for line in md.splitlines() if line.startswith("| powersgd8 ") or line.startswith("| powersgd8-seed")]
    assert len(tables) >= 3, md  # the arms', the pairs' and the cost table's rows at least
    for k in ("gpu_s_total", "usd", "cross_zone_usd"):
        assert run.data.metrics[f"cost/powersgd8/{k}"] == pytest.approx(c8[k], rel=1e-12, abs=1e-15)


def test_a_fifth_arm_of_a_new_kind_is_trained_scored_and_reported_like_the_others(analysed):
    """The small study's fifth row, `fp16:fp16:2`, a kind added as one module and one line of the
    kinds' table (`gradshare.kinds.fp16`): prepared, trained on two ranks, committed, scored and
    analyzed; its bytes per update are half of dense's from the first update (its hook's own
    count: tests/unit/kinds/test_fp16.py); its kind's words and its rows are in the report."""
    study, run, files, _ = analysed
    v = json.loads(files["verdicts.json"].read_text())
    a = v["arms"]["fp16"]
    assert a["status"] == "FINISHED" and a["accuracy"] is not None and a["retention_nll"] is not None
    assert "fp16-seed" in v["pairs"] and v["retention_change"]["fp16"]["upper"] is not None
    assert v["candidate"] == "powersgd" and "fp16" not in v["controls"]
    [train] = study_runs.search(study, "train", "fp16", status="FINISHED")
    assert train.data.params["kind"] == "fp16" and train.data.params["processes"] == "2"
    _, commitment = store.commitment(study)
    assert "fp16" in [e["arm"] for e in commitment["arms"]]  # sealed before any score, like the others
    c16, dense = v["cost"]["fp16"], v["cost"]["dense"]
    assert c16["logical_bytes"] * 2 == dense["logical_bytes"] > 0
    md = files["report.md"].read_text()
    assert "| fp16 | DDP with PyTorch's fp16_compress_hook" in md, md
    rows = [line for line in md.splitlines() if line.startswith("| fp16 ") or line.startswith("| fp16-seed")]
    assert len(rows) >= 4, md  # where it ran, the arms', the pairs' and the cost table's rows at least
    for k in ("gpu_s_total", "usd", "cross_zone_usd"):
        assert run.data.metrics[f"cost/fp16/{k}"] == pytest.approx(c16[k], rel=1e-12, abs=1e-15)


def test_the_analyze_run_shows_the_verdict_as_columns_of_the_runs_table(analysed):
    """The figures each screen is decided on, each finished arm's cost, and each screen's word,
    as the analyze run's metrics and params, equal to what its verdicts.json says."""
    _, run, files, _ = analysed
    v = json.loads(files["verdicts.json"].read_text())
    q, s, m = v["quality_screen"]["checks"], v["speed_screen"], run.data.metrics
    expected = {
        "verdict/task_gain_pp": q["task_gain"]["value_pp"],
        "verdict/task_gain_lo_pp": 100 * v["powersgd-seed"]["lo"],
        "verdict/retention_upper_nats": q["retention"]["upper_nats"],
        "verdict/noninferior_single_lo_pp": q["noninferior_to_single"]["lower_pp"],
        "verdict/noninferior_dense_lo_pp": q["noninferior_to_dense"]["lower_pp"],
        "verdict/speed_ratio": s["ratio"],
        **{f"cost/{arm}/{k}": v["cost"][arm][k] for arm in ("single", "dense", "powersgd")
           for k in ("gpu_s_total", "usd", "cross_zone_usd")}}
    for key, value in expected.items():
        assert m[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key
    words = {True: "pass", False: "fail"}
    assert run.data.params["quality_screen"] == words[v["quality_screen"]["pass"]]
    assert run.data.params["speed_screen"] == words[s["pass"]]


def test_the_verdict_is_the_description_of_the_studys_page_and_of_the_analyze_run(analysed):
    """At first sight, through the server: the experiment's description (its page, opened from the
    experiment list) and the analyze run's (its page) are the verdict: both screens' words in the
    heading, the table beneath, as this analysis decided them."""
    from analysis.analyze import description
    from gradshare.contract.tags import NOTE

    study, run, files, _ = analysed
    v = json.loads(files["verdicts.json"].read_text())
    c = connection.client()
    words = {True: "PASS", False: "FAIL", None: "NULL"}
    q, sp, b = v["quality_screen"], v["speed_screen"], v["budget"]
    margins = ""
    if "task_gain" in (q.get("checks") or {}):
        gain, upper = q["checks"]["task_gain"]["value_pp"], q["checks"]["retention"]["upper_nats"]
        margins = f" ({'+' if gain >= 0 else '−'}{abs(gain):.1f} pp; retention {'+' if upper >= 0 else '−'}{abs(upper):.2f} nats)"
    speed = f" ({sp['ratio']:.2f}× {sp['baseline']}; needs {sp['threshold']:.2f}×)" if sp.get("ratio") is not None else ""
    heading = (f"### Quality {words[q['pass']]}{margins} · Speed {words[sp['pass']]}{speed} · "
               f"${b['usd']:.2f} of ${b['budget_usd']:.0f}")
    study_page, run_page = c.get_experiment_by_name(study).tags[NOTE], c.get_run(run.info.run_id).data.tags[NOTE]
    assert study_page == run_page and study_page.startswith(heading + "\n"), study_page[:200]
    # the table this verdict makes, line for line where verdicts.json's sorted keys cannot reorder it
    lines = study_page.splitlines()
    for arm, a in v["arms"].items():
        assert any(line.startswith(f"{arm:<10}{a['status']:<12}") for line in lines), (arm, study_page)
    made = description(v).splitlines()
    for key in ("quality screen: ", "speed screen: ", "cost: ", "budget: "):
        [mine] = [line for line in made if line.startswith(key)]
        assert mine in lines, (mine, study_page)


def test_every_run_of_the_study_has_a_name_that_says_its_step(analysed):
    """No run keeps a name MLflow drew at random (`mlflow run` makes each launcher's run with
    one): each is named after its step (`prepare`, `train-dense-attempt1`, `score-seed`, ...), a
    refusal `refused-<step>...`, tagged; no run but a refusal is KILLED."""
    from gradshare.contract.tags import REFUSAL, RUN_NAME, STEP

    study = analysed[0]
    exp = connection.client().get_experiment_by_name(study)
    runs = connection.client().search_runs([exp.experiment_id], max_results=1000)
    assert len(runs) >= 8
    for r in runs:
        name, step = r.data.tags.get(RUN_NAME, ""), r.data.tags.get(STEP, "")
        refused, kind = r.data.tags.get(REFUSAL) == "true", step.split("-")[0]  # train-host: train-<arm>-host1
        assert kind and name.startswith(f"refused-{kind}" if refused else kind), (name, step, r.info.run_id)
        # KILLED is a refusal's alone (bare `mlflow run`'s launcher turns a refusal's end FAILED)
        assert r.info.status != "KILLED" or refused, (name, r.info.status)


def test_the_report_shows_tables_and_self_contained_plots(analysed):
    _, run, files, _ = analysed
    md, page = files["report.md"].read_text(), files["report.html"].read_text()
    for needle in ("Accuracy by family", "Paired changes", "Retention change", "Cost", "Attempts",
                   "Where the arms ran", "Projection (`gradshare project`)", "The study's hosts"):
        assert needle.replace("`", "") in page.replace("<code>", "").replace("</code>", "") and needle in md
    # this study's two-process arms ran on one host: the link table and a loud line say so
    assert "| dense | DDP, plain all-reduce of the whole gradient | loopback: both ranks on one host, no byte crossed a link |" in md
    assert "A two-process arm exchanged over loopback" in md
    assert page.count("data:image/png;base64,") == 7 and "src=\"http" not in page
    assert "<table>" in page and "<pre><code>" in page and "**" not in page
    names = {a.path for a in connection.client().list_artifacts(run.info.run_id)}
    assert {"accuracy_by_family.png", "loss_curves.png", "throughput.png", "cumulative_wire_bytes.png",
            "projected_speed_ratio.png"} <= names


def test_the_verdicts_do_not_change_when_the_analysis_runs_twice(analysed):
    study, _, files, tmp = analysed
    _, again = _analyze(study, tmp, "second")
    assert again["verdicts.json"].read_bytes() == files["verdicts.json"].read_bytes()


def test_a_study_whose_candidate_failed_reports_it_with_both_screens_null(partial_scored, tmp_path):
    study = partial_scored
    _, files = _analyze(study, tmp_path, "partial")
    v = json.loads(files["verdicts.json"].read_text())
    assert v["quality_screen"]["pass"] is None and v["speed_screen"]["pass"] is None
    assert "unavailable" in v["quality_screen"]["reason"] and "unavailable" in v["speed_screen"]["reason"]
    assert v["arms"]["powersgd"]["status"] == "FAILED" and v["arms"]["dense"]["status"] == "FAILED"
    assert "diverged" in v["arms"]["dense"]["failure_reason"]
    assert v["powersgd-seed"]["mean"] is None and v["single-seed"]["mean"] is not None
    assert v["cost"]["powersgd"] is None
    md = files["report.md"].read_text()
    assert "| powersgd | FAILED |" in md and "unavailable" in md and "diverged" in md
    attempts = md[md.index("## Attempts"):md.index("## Plots")]
    assert any(line.startswith("| dense |") and "FAILED" in line and "the arm's reason, in the verdict table" in line
               for line in attempts.splitlines())
    # every reason once, in its arm's row: the pairs, the screens, the cost, the projection and
    # the attempts name the arm (analyze once printed a failed arm's reason seven times)
    for arm in ("dense", "powersgd"):
        reason = v["arms"][arm]["failure_reason"]
        assert files["stdout"].count(reason) == 1 and md.count(reason) == 1, (arm, reason)
    assert "no data: powersgd FAILED" in files["stdout"] and "missing: powersgd FAILED" in files["stdout"]
    assert v["quality_screen"]["missing"]["dense"] == v["arms"]["dense"]["failure_reason"]  # the record keeps it


def test_the_reports_projected_cross_zone_dollars_are_the_budget_checks_for_the_same_study(analysed):
    """One cross-zone formula (`gradshare.cost.volume`): the dollars the report projects from each
    arm's logged logical bytes are the dollars the budget check projects for that arm before it
    starts, from the study's recorded parameter shapes."""
    study, _, files, _ = analysed
    v = json.loads(files["verdicts.json"].read_text())
    report = files["report.md"].read_text()
    prep, plan = store.prepared_plan(study)
    shapes = study_figures.prepared_shapes(prep, plan)
    for arm in plan.arms.names:
        budget_usd = limits.expected_cross_bytes(plan, arm, shapes) / GB * plan.infra.cross_zone_usd_per_gb
        reported = v["cost"][arm]["cross_zone_usd_projected_from_logical"]
        assert reported == pytest.approx(budget_usd, rel=1e-12), arm
        assert (reported > 0) is (arm != "single"), arm
        assert f" {reported:.6f} |" in report, arm
