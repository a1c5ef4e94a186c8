"""The study's inputs (`gradshare.inputs`): the workload record each update's figures are read from
by the projection, checked against the layout worked out here, document by document; and the
build itself, which gives identical bytes twice from one plan and hashes every file it writes.
(Prepare registering them in the store: tests/e2e/test_prepare.py.)"""
from __future__ import annotations

import json
import math
import statistics

import pytest

from gradshare.contract.plan import load_plan
from gradshare.data.documents import encode
from gradshare.data.schedule import rank_share
from gradshare.inputs import workload
from gradshare.inputs.build import build_inputs
from gradshare.util.hashing import tree_sha256
from tests.unit.train.test_micro_batches import SMALL, WIDTH, _inputs

BY_COUNT = load_plan("tiny", {**SMALL, "schedule.micro_batch_docs": "4"})


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return _inputs(tmp_path_factory.mktemp("workload"))


def _by_count_padded(ids: list[str], lengths: dict[str, int], size: int) -> tuple[int, int]:
    """Whole documents, shortest first, `size` to a micro-batch, each padded to its longest."""
    ordered = sorted(ids, key=lambda i: (lengths[i], i))
    chunks = [ordered[k:k + size] for k in range(0, len(ordered), size)]
    return sum(len(c) * max(lengths[i] for i in c) for c in chunks), len(chunks)


def test_each_updates_figures_are_the_loops_layout_worked_out_by_hand(small):
    docs, tok, schedule = small
    record = workload.describe(BY_COUNT, docs, tok, schedule)
    lengths = {i: len(encode(tok, d, WIDTH)[0]) for i, d in docs.items()}
    assert len(record["updates"]) == len(schedule["updates"])
    for u, (ids, row) in enumerate(zip(schedule["updates"], record["updates"])):
        assert row["input_tokens"] == sum(lengths[i] for i in ids)
        assert row["target_tokens"] == schedule["target_tokens"][u]
        assert (row["w1"]["padded_tokens"], row["w1"]["micro_batches"]) == _by_count_padded(ids, lengths, 4)
        # two ranks: the slower one's, the rank with more padded tokens
        ranks = [_by_count_padded(rank_share(ids, r, 2), lengths, 4) for r in range(2)]
        assert (row["w2"]["padded_tokens"], row["w2"]["micro_batches"]) == max(ranks)
    assert record["median"]["w1_padded_tokens"] == statistics.median(r["w1"]["padded_tokens"]
                                                                     for r in record["updates"])
    assert record["layout"] == "4 whole documents per micro-batch"


def test_longer_documents_scale_padded_tokens_and_round_micro_batches_up(small):
    docs, tok, schedule = small
    record = workload.describe(BY_COUNT, docs, tok, schedule)
    for factor in (0.25, 3.0):
        got = workload.scaled(record, factor)
        for before, after in zip(record["updates"], got["updates"]):
            assert after["w2"]["padded_tokens"] == before["w2"]["padded_tokens"] * factor
            assert after["w1"]["micro_batches"] == max(1, math.ceil(before["w1"]["micro_batches"] * factor))
        assert got["median"]["input_tokens"] == pytest.approx(record["median"]["input_tokens"] * factor)


def test_two_builds_of_one_plan_are_the_same_bytes_and_every_file_is_hashed(tmp_path):
    """The full profile cut small (random weights: no model is built), twice."""
    plan = load_plan("full", {"data.train_per_family": "16", "data.test_per_family": "4", "data.replay_docs": "64",
                              "data.retention_probes": "8", "schedule.updates": "4", "powersgd.warmup_updates": "2"})
    one = build_inputs(plan, tmp_path / "one", log=lambda *a: None)
    two = build_inputs(plan, tmp_path / "two", log=lambda *a: None)
    assert one["inputs_sha256"] == two["inputs_sha256"] and one["files"] == two["files"]
    written = sorted(p.relative_to(tmp_path / "one").as_posix() for p in (tmp_path / "one").rglob("*")
                     if p.is_file() and p.name != "manifest.json")
    assert sorted(e["path"] for e in one["files"]) == written
    assert tree_sha256(one["files"]) == one["inputs_sha256"]
    # the workload the projection reads is the one the files give
    assert json.loads((tmp_path / "one" / workload.WORKLOAD).read_text()) == \
        workload.from_inputs(plan, tmp_path / "one")
    assert one["seed_model"]["kind"] == "random-init" and one["plan_sha256"] == plan.sha256()
