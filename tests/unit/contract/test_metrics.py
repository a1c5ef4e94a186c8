"""Metric names: written once, in gradshare/contract/metrics.py, and nowhere else."""
import ast
import re
from pathlib import Path

import pytest

from gradshare.hosts import metering
from gradshare.contract import metrics as M
from tests.conftest import REPO

NAMESPACES = ("train", "perf", "comm", "ckpt", "score", "accuracy", "retention", "seed", "paired",
              "spend", "budget")
# A metric name, or the literal head of one built in an f-string (f"comm/host{j}/...").
# Artifact paths (per_case/..., inputs/..., schedule/..., checkpoint) are outside these
# namespaces; a file name (a dot and an extension) never is a metric.
METRIC_LIKE = re.compile(rf"^({'|'.join(NAMESPACES)})/[A-Za-z0-9_/-]*$")
CONTRACT = ("train/loss", "train/grad_norm", "perf/step_s", "perf/tokens_per_s", "perf/gpu_s",
            "comm/logical_bytes", "comm/wire_tx_bytes", "comm/wire_rx_bytes", "perf/active_s",
            "perf/active_tokens_per_s", "perf/gpu_s_total", "ckpt/save_s", "ckpt/bytes")


def _metric_literals(path: Path):
    """(line, text) of every string constant that looks like a metric name; comments are
    not in the tree, and docstrings (prose, with spaces) never match."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and METRIC_LIKE.match(node.value):
            yield node.lineno, node.value


def test_no_metric_name_is_spelled_outside_metrics_py():
    found = []
    for top in ("gradshare", "analysis", "entrypoints"):
        for path in sorted((REPO / top).rglob("*.py")):
            if path == REPO / "gradshare" / "contract" / "metrics.py":
                continue
            found += [f"{path.relative_to(REPO)}:{line}: {text!r}" for line, text in _metric_literals(path)]
    assert not found, "metric names belong in gradshare/contract/metrics.py; found:\n" + "\n".join(found)


def test_the_scan_sees_plain_and_f_string_names_but_not_comments_or_artifact_paths(tmp_path):
    src = tmp_path / "x.py"
    src.write_text('# "train/loss" in a comment\n'
                   'a = "perf/step_s"\n'
                   'b = f"comm/host{j}/wire_tx_bytes"\n'
                   'c = "per_case/test.jsonl"\n'
                   'd = "schedule/update_sha256.txt"\n'
                   'e = """Logs `train/loss` per update."""\n')
    assert [line for line, _ in _metric_literals(src)] == [2, 3]


def _all_names() -> list[str]:
    consts = [v for k, v in vars(M).items() if k.isupper() and isinstance(v, str)]
    built = []
    for j in (0, 1):
        built += [M.host_wire_tx(j), M.host_wire_rx(j)]
        for phase in metering.PHASES:
            built += [M.host_wire_tx_bytes(j, phase), M.host_wire_rx_bytes(j, phase),
                      M.host_loopback_bytes(j, phase)]
    for phase in metering.PHASES:
        built += [M.wire_tx_bytes(phase), M.wire_rx_bytes(phase), M.loopback_bytes(phase)]
    built += [M.accuracy(f) for f in ("boolean_expressions", "multistep_arithmetic", "word_sorting",
                                     "dyck_languages")]
    built += [f(p) for p in ("powersgd-seed", "powersgd-single") for f in (M.paired_mean, M.paired_lo)]
    # the aliases of the `total` phase are the same names, spelled twice on purpose
    aliases = {M.WIRE_TX_BYTES_TOTAL, M.WIRE_RX_BYTES_TOTAL}
    return [n for n in consts if n not in aliases] + built


def test_every_metric_name_is_unique_and_has_a_namespace():
    names = _all_names()
    dupes = sorted({n for n in names if names.count(n) > 1})
    assert not dupes, dupes
    bad = [n for n in names if not METRIC_LIKE.match(n)]
    assert not bad, bad


def test_the_design_contract_names_are_unchanged():
    assert set(CONTRACT) <= set(_all_names())


def _hosts():
    return {"b" * 64: {"wire_tx": 10, "wire_rx": 20, "lo_tx": 5, "lo_rx": 5},
            "a" * 64: {"wire_tx": 1, "wire_rx": 2, "lo_tx": 3, "lo_rx": 3}}


def test_an_update_logs_totals_over_hosts_and_each_host_in_host_id_order():
    m = M.step_metrics(dict(loss=2.5, grad_norm=1.0, lr=1e-4, target_tokens=100, step_s=0.5, tokens=1000,
                            world=2, logical_bytes=64, hosts=_hosts()))
    assert m == {M.TRAIN_LOSS: 2.5, M.TRAIN_GRAD_NORM: 1.0, M.TRAIN_LR: 1e-4, M.TRAIN_TARGET_TOKENS: 100,
                 M.STEP_S: 0.5, M.TOKENS_PER_S: 2000, M.GPU_S: 1.0, M.LOGICAL_BYTES: 64,
                 M.WIRE_TX_BYTES: 11, M.WIRE_RX_BYTES: 22, M.LOOPBACK_BYTES: 8,
                 # "aaa…" sorts first: host 0
                 M.host_wire_tx(0): 1, M.host_wire_rx(0): 2, M.host_wire_tx(1): 10, M.host_wire_rx(1): 20}


def test_the_per_update_table_names_each_metric_and_each_plot_once():
    names = [m.name for m in M.PER_UPDATE]
    assert len(set(names)) == len(names) and all(METRIC_LIKE.match(n) for n in names)
    plotted = [m.plot for m in M.PER_UPDATE if m.plot]
    assert len({p.file for p in plotted}) == len(plotted) and all(p.file.endswith(".png") for p in plotted)
    assert all(p.beside in names for p in plotted if p.beside)  # what is drawn beside is read back too


def test_a_summary_holds_every_phase_per_host_and_over_all_hosts():
    wire = {p: _hosts() for p in metering.PHASES}
    wire["startup"] = {"a" * 64: _hosts()["a" * 64]}  # a host seen in one phase only: 0 in another
    s = M.summary_metrics(active_s=10.0, tokens=5000, world=2, wall_s=20.0, save_s=1.0, ckpt_bytes=7,
                          logical_bytes=100, logical_bytes_post_warmup=60, final_loss=2.0, wire=wire)
    assert s[M.ACTIVE_TOKENS_PER_S] == 500 and s[M.GPU_S_TOTAL] == 40.0 and s[M.GPU_S_ACTIVE] == 20.0
    assert s[M.WIRE_TX_BYTES_TOTAL] == 11 and s[M.host_wire_tx_total(1)] == 10
    assert s[M.host_wire_tx_bytes(1, "startup")] == 0 and s[M.wire_tx_bytes("startup")] == 1
    assert s[M.loopback_bytes("checkpoint")] == 8 and s[M.host_loopback_total(0)] == 3


def test_score_metrics_are_accuracy_by_family_overall_and_mean_retention():
    rows = [{"family": "a", "correct": 1}, {"family": "a", "correct": 0}, {"family": "b", "correct": 1}]
    m = M.score_metrics(rows, [{"nll_nats": 1.0}, {"nll_nats": 2.0}])
    assert m == {M.accuracy("a"): 0.5, M.accuracy("b"): 1.0, M.ACCURACY_OVERALL: pytest.approx(2 / 3),
                 M.RETENTION_NLL_NATS: 1.5}
