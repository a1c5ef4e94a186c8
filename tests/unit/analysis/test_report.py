"""The report's pieces (`analysis.report`): the attempts table and the HTML page, on records and
markdown made here. (The whole `analyze` step on a scored study: tests/e2e/test_analysis.py.)"""
import base64


def _record(**arms):
    from analysis.collect import ArmRecord, StudyRecord
    return StudyRecord("s", None, "prep", None, {a: ArmRecord(a, *v) for a, v in arms.items()}, {})


def test_the_attempts_table_lists_every_attempt_of_every_arm():
    from analysis.collect import attempts_of
    from analysis.report import _attempts
    retried = {"arm": "dense", "run_id": "r2", "status": "FINISHED", "attempts": [
        {"attempt": 1, "run_id": "r1", "status": "FAILED", "failure_reason": "worker hung | timed out"},
        {"attempt": 2, "run_id": "r2", "status": "FINISHED", "failure_reason": None}]}
    old = {"arm": "single", "run_id": "r0", "status": "FAILED", "failure_reason": "diverged"}
    assert attempts_of(old) == [{"attempt": 1, "run_id": "r0", "status": "FAILED", "failure_reason": "diverged"}]
    rec = _record(single=("FAILED", "r0", "diverged"), dense=("FINISHED", "r2"),
                  powersgd=("FAILED", "r3", "never started: unavailable"))
    rec.arms["single"].attempts = attempts_of(old)
    rec.arms["dense"].attempts = attempts_of(retried)
    rec.arms["dense"].attempts[1].update(resumed_after_updates=[40], full_state_bytes=25.6e6,
                                         full_state_save_s=0.07, full_state_load_s=0.03)
    rows = [line for line in _attempts(rec) if line.startswith("| ") and not line.startswith("| arm")]
    assert rows == ["| single | 1 | r0 | FAILED | diverged |  |",
                    "| dense | 1 | r1 | FAILED | worker hung \\| timed out |  |",
                    "| dense | 2 | r2 | FINISHED |  | resumed after update 40; full state 25.6 MB, saved in 0.07 s, "
                    "loaded in 0.03 s |",
                    "| powersgd | — | r3 | FAILED | never started: unavailable | |"]


def test_report_html_renders_the_markdown_and_inlines_the_plots(tmp_path):
    from analysis.report import to_html
    png = tmp_path / "loss_curves.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    md = ("# Report\n\n> **Randomly initialised seed model.**\n\nplan `abc123`, reason: <module> & more\n\n"
          "| arm | reason |\n|---|---|\n| dense | a \\| b |\n\n```\nverdict < table\n```\n\n"
          "![loss_curves](loss_curves.png)\n")
    page = to_html(md, [png], "t")
    assert "<blockquote>" in page and "&gt;" not in page.split("<blockquote>")[1].split("</blockquote>")[0]
    assert "<strong>Randomly initialised seed model.</strong>" in page and "**" not in page
    assert "<code>abc123</code>" in page and "`" not in page
    assert "<table>" in page and "<td>a | b</td>" in page
    assert "&lt;module&gt; &amp; more" in page  # text, not markup
    assert "<pre><code>verdict &lt; table" in page
    assert f'src="data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()}"' in page
    assert "loss_curves.png" not in page


def test_the_studys_first_line_carries_both_screens_margins_and_the_money():
    """The headline the study's page opens with (issue 44: one collapsed line of two words once),
    on a verdict laid out by hand: gain and retention with their signs, the speed ratio against the
    baseline and what the screen needs, the money against the budget; an undecided screen keeps its word."""
    from analysis.analyze import headline

    v = {"quality_screen": {"pass": True, "checks": {
            "task_gain": {"value_pp": 13.64, "threshold_pp": 10.0, "pass": True},
            "retention": {"upper_nats": -0.1412, "threshold_nats": 0.02, "pass": True}}},
         "speed_screen": {"pass": False, "ratio": 0.3871, "threshold": 1.1, "baseline": "single"},
         "budget": {"usd": 0.0712, "budget_usd": 100.0}}
    assert headline(v) == "Quality PASS (+13.6 pp; retention \u22120.14 nats) \u00b7 Speed FAIL (0.39\u00d7 single; " \
                          "needs 1.10\u00d7) \u00b7 $0.07 of $100"
    v["quality_screen"] = {"pass": None, "missing": {"powersgd": "FAILED"}}
    v["speed_screen"] = {"pass": None, "baseline": "single"}
    assert headline(v) == "Quality NULL \u00b7 Speed NULL \u00b7 $0.07 of $100"
