"""A new per-update metric is one entry in `gradshare.contract.metrics.PER_UPDATE` and one value
in the loop: the loop's update carries the value through to `step_metrics`, the tracking store
holds its history, `analysis.collect` reads it back and `analysis.report` draws it, with no other
list edited. The exercise is done here with a made-up metric, twice each update's loss, on a real
single arm (4 updates on CPU) and a real MLflow store (SQLite)."""
from __future__ import annotations

from itertools import accumulate
from operator import itemgetter

import mlflow
import torch
from mlflow.entities import Metric

from analysis import report
from analysis.collect import ArmRecord, StudyRecord, histories
from gradshare.contract import metrics as M
from gradshare.contract.plan import load_plan
from gradshare.model.lm import build_model
from gradshare.model.source import model_config
from gradshare.train import loop
from tests.unit.train.test_micro_batches import SMALL, _inputs

NAME = "train/loss_doubled"
MADE_UP = M.PerUpdate(NAME, "nats x 2", itemgetter("loss_doubled"),
                      M.Plot("Twice the loss, summed", "loss_doubled.png", cumulative=True))


def _trained_with_the_made_up_metric(tmp_path, monkeypatch) -> tuple[list[float], dict[int, dict]]:
    """A single arm trained with `MADE_UP` in the table and its value computed in the update:
    the losses and rank 0's metrics of each update, as the train step would log them."""
    monkeypatch.setattr(M, "PER_UPDATE", M.PER_UPDATE + (MADE_UP,))
    update = loop._update

    def update_with_the_made_up_value(*args, **kwargs):
        out = update(*args, **kwargs)
        out.values["loss_doubled"] = 2 * out.loss  # the one line the loop gains
        return out

    monkeypatch.setattr(loop, "_update", update_with_the_made_up_value)
    docs, tok, schedule = _inputs(tmp_path)
    plan = load_plan("tiny", SMALL)
    model = build_model(model_config(plan.model.config, len(tok)), plan.study.seed)
    logged = {}

    def on_step(u, metrics, docs_sha):
        logged[u] = metrics

    res = loop.train(loop.TrainJob(plan, "single", model, tok, docs, schedule, torch.device("cpu"), 0, 1,
                                   on_step=on_step, log=lambda *a: None))
    return res.losses, logged


def _stored(tmp_path, logged: dict[int, dict]):
    """The updates' metrics in a fresh MLflow store, one run: (client, run id)."""
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("per-update")).info.run_id
    client.log_batch(run_id, metrics=[Metric(k, v, 0, u) for u, m in logged.items() for k, v in m.items()])
    return client, run_id


def _drawn(monkeypatch) -> dict[str, dict]:
    """Every figure the report saves, by file name: its title, y label and lines (label -> y values)."""
    figures = {}
    save = report._save

    def keep(fig, path):
        ax = fig.axes[0]
        figures[path.name] = {"title": ax.get_title(), "ylabel": ax.get_ylabel(),
                              "lines": {ln.get_label(): list(ln.get_ydata()) for ln in ax.lines}}
        return save(fig, path)

    monkeypatch.setattr(report, "_save", keep)
    return figures


def test_a_new_per_update_metric_is_logged_read_back_and_plotted_from_its_one_entry(tmp_path, monkeypatch):
    losses, logged = _trained_with_the_made_up_metric(tmp_path, monkeypatch)
    assert len(losses) == 4 and sorted(logged) == [1, 2, 3, 4]
    assert [logged[u][NAME] for u in (1, 2, 3, 4)] == [2 * x for x in losses]
    assert [logged[u][M.TRAIN_LOSS] for u in (1, 2, 3, 4)] == losses  # the others as before

    client, run_id = _stored(tmp_path, logged)
    read = histories(client, run_id)
    assert read[NAME] == [(u, 2 * x) for u, x in enumerate(losses, 1)]
    assert read[M.TRAIN_LOSS] == list(enumerate(losses, 1))

    plan = load_plan("tiny", SMALL)
    rec = StudyRecord("s", plan, "prep", None, {"single": ArmRecord("single", "FINISHED", run_id, histories=read)}, {})
    figures = _drawn(monkeypatch)
    paths = report.plots(rec, {"z": 1.96, "arms": {}}, tmp_path / "plots")
    assert (tmp_path / "plots" / "loss_doubled.png") in paths
    assert figures["loss_doubled.png"] == {"title": "Twice the loss, summed", "ylabel": "nats x 2",
                                           "lines": {"single": list(accumulate(2 * x for x in losses))}}
    assert figures["loss_curves.png"]["lines"] == {"single": losses}


def test_the_wire_plot_draws_loopback_dashed_beside_it_for_the_multi_process_arms_only(tmp_path, monkeypatch):
    """The table's `beside`: cumulative loopback bytes next to the wire bytes of a DDP arm; a
    one-process arm's loopback is not drawn."""
    plan = load_plan("tiny")
    hist = {M.WIRE_TX_BYTES: [(1, 1.0), (2, 2.0)], M.LOOPBACK_BYTES: [(1, 10.0), (2, 20.0)]}
    rec = StudyRecord("s", plan, "prep", None, {arm: ArmRecord(arm, "FINISHED", arm, histories=hist)
                                                for arm in ("single", "dense")}, {})
    figures = _drawn(monkeypatch)
    report.plots(rec, {"z": 1.96, "arms": {}}, tmp_path)
    assert figures["cumulative_wire_bytes.png"]["lines"] == {
        "single": [1.0, 3.0], "dense": [1.0, 3.0], f"dense ({M.LOOPBACK_BYTES})": [10.0, 30.0]}
