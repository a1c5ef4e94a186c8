"""The preflight's arithmetic, checked against what it stands for: dense's buffers are the
buckets DDP itself builds for the model (read from a real DDP over a one-rank gloo group); a
socket setting is the environment NCCL and gloo read; the go/no-go's hours and dollars are the
module's formula, derived here by hand; settings the plan cannot hold are refused."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gradshare.contract.plan import PlanError, load_plan
from gradshare.cost import measured
from gradshare.hosts import sockets
from gradshare.model.lm import build_model
from gradshare.model.source import model_config, parameter_shapes
from gradshare.steps.preflight import buffers
from tests.unit.cost.test_share import studied


@pytest.mark.parametrize("cap_mb", [1, 25])
def test_dense_buffers_are_the_buckets_ddp_builds(tmp_path, cap_mb):
    plan = load_plan("tiny", {"powersgd.bucket_cap_mb": str(cap_mb), "model.vocab_size": "512"})
    model = build_model(model_config(plan.model.config, plan.model.vocab_size), 0)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        ddp = DDP(model, bucket_cap_mb=cap_mb)
        ids = torch.randint(0, 512, (2, 16))
        ddp(input_ids=ids).logits.sum().backward()  # records the order the gradients come in
        ddp(input_ids=ids)  # ... and the next forward rebuilds the buckets in it: the arms' buckets
        got = sorted(b.buffer().numel() * 4 for b in ddp.reducer._get_zeros_like_grad_buckets())
    finally:
        dist.destroy_process_group()
    dense, psgd = buffers(plan, parameter_shapes(plan))
    # DDP's own buckets: as many, each within 1% (its order is the gradients' arrival, which puts a
    # norm's few hundred bytes in a neighbouring bucket now and then)
    assert len(dense) == len(got)
    assert all(abs(a - b) <= 0.01 * b for a, b in zip(sorted(dense), got)), (sorted(dense), got)
    assert sum(dense) == 4 * sum(p.numel() for p in model.parameters())
    assert 0 < sum(psgd) < sum(dense)  # PowerSGD's P, Q and what it leaves whole: fewer bytes


def test_a_socket_setting_is_the_environment_each_backend_reads():
    assert sockets.env_for("4x8", "nccl", "ens5") == {"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "8",
                                                     "NCCL_SOCKET_IFNAME": "ens5"}
    assert sockets.env_for("2x2", "gloo", "gslink") == {"GLOO_SOCKET_IFNAME": "gslink,gslink,gslink,gslink"}
    assert sockets.env_for("2x2", "gloo", "") == {}  # gloo needs a name to open several devices
    plan = load_plan("tiny")
    assert sockets.interface(plan, "127.0.0.1", env={}) == "lo"
    assert sockets.interface(plan, "10.0.1.5", env={"GLOO_SOCKET_IFNAME": "ens5,ens5"}) == "ens5"
    assert sockets.backend(load_plan("full")) == "nccl"
    assert sockets.backend(load_plan("full", {"hardware.rehearsal": "one-gpu"})) == "gloo"
    for bad in ("9x9", "0x4", "4", "auto2"):
        with pytest.raises(PlanError, match="not TxS"):
            load_plan("tiny", {"hardware.sockets": bad})
    with pytest.raises(PlanError, match="preflight.sockets lists the settings"):
        load_plan("tiny", {"preflight.sockets": "auto"})


def _figures():
    """Two settings' rates as a probe reports them: 1 MB rounds of dense, 10 kB of PowerSGD."""
    def setting(last_Bps):
        return {"dense_Bps": last_Bps, "dense_first_Bps": 2 * last_Bps, "dense_last_Bps": last_Bps,
                "dense_round_s": 1e6 / last_Bps, "dense_round_bytes": 1e6, "capacity_Bps": last_Bps,
                "powersgd_round_s": 0.01}
    return {"settings": {"1x1": setting(1e6), "4x1": setting(4e6)}, "best": "4x1", "world": 2,
            "clock_offset_s": [0.0, 0.0], "ranks": [], "backend": "gloo", "run_id": "r1"}


def test_the_go_no_go_is_compute_plus_the_measured_exchange_against_deadline_and_budget():
    plan = load_plan("tiny", {"schedule.updates": "8", "schedule.docs_per_update": "8", "data.train_per_family": "12",
                              "data.replay_docs": "16", "powersgd.warmup_updates": "2", "infra.budget_usd": "100"})
    f = _figures()
    compute = 0.2
    # dense: 8 x (0.2 / 2 + 1e6 / 4e6); powersgd: 2 warm-up updates as dense, 6 at PowerSGD's round
    assert measured.arm_seconds(plan, "dense", compute, f) == pytest.approx(8 * (0.1 + 0.25))
    assert measured.arm_seconds(plan, "powersgd", compute, f) == pytest.approx(2 * 0.35 + 6 * 0.11)
    assert measured.arm_seconds(plan, "single", compute, f) == pytest.approx(8 * 0.2)
    known = studied(plan, compute)  # single finished: one device's update measured
    g = measured.go_no_go(plan, f, known, 10.0, now=100.0, spent_usd=0.0)
    assert [r["arm"] for r in g["arms"]] == ["dense", "powersgd"]  # single is done
    assert g["hours"] == pytest.approx((10 + 2.8 + 10 + 1.36) / 3600)
    assert g["go"] == "go" and g["why"] == []
    # the speed screen at the burst (first window: half the round) and the sustained rate
    assert g["speed_ratio"]["last"] == pytest.approx(8 * 0.2 / 1.36)
    late = measured.go_no_go(plan, f, known, 10.0, now=plan.infra.deadline_hours * 3600 - 20, spent_usd=0.0)
    assert late["go"] == "no-go" and "past the deadline" in late["why"][0]
    poor = measured.go_no_go(plan, f, known, 10.0, 100.0, spent_usd=99.9999)
    assert poor["go"] == "no-go" and "past the $100 bound" in poor["why"][0]


def test_the_measured_link_replaces_the_declared_one_with_its_provenance():
    plan = load_plan("full")
    f = _figures()
    shaped, line = measured.plan_with(plan, f)
    # 4 MB/s of logical bytes, a ring of two: 1 x the bytes each way, TCP/IP headers, in bits
    assert shaped.infra.link_gbit == pytest.approx(4e6 * 1514 / 1448 * 8 / 1e9)
    assert shaped.infra.host_pinned_both_gbps == plan.infra.host_pinned_both_gbps  # no GPU measured
    assert line.startswith("measured on these hosts, preflight run r1: link") and "host link declared" in line
    f["ranks"] = [{"host_link_both_GBps": 30.0}, {"host_link_both_GBps": 25.0}]
    shaped, line = measured.plan_with(plan, f)
    assert shaped.infra.host_pinned_both_gbps == 25.0 and "host link 25.0 GB/s" in line


PROBE_LOG = """[W1207 04:31:02.000000000 socket.cpp:752] [c10d] The client socket has failed to connect.
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/tmp/ci2/gradshare/hosts/probe.py", line 287, in run
    result_path(workdir, rank).write_text(json.dumps(out, indent=1))
OSError: [Errno 28] No space left on device
E1207 04:31:03.000000000 1234 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1) local_rank: 0 (pid: 1234) of binary: /usr/bin/python
Traceback (most recent call last):
  File "/usr/bin/accelerate", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
gradshare.hosts.probe FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-07_04:31:03
  host      : hostb
  rank      : 1 (local_rank: 0)
  exitcode  : 1 (pid: 1234)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_a_failed_probe_is_named_by_its_ranks_exit_and_own_error_not_the_launchers():
    """CI once lost a probe's cause: the step kept the last 600 characters of the launcher's log,
    torch elastic's summary ("gradshare.hosts.probe FAILED ... <NO_OTHER_FAILURES>"), and cut the
    rank's own traceback off (2026-12-07). The line names the rank, its host, its exit and the
    error it raised; the launcher's ChildFailedError, which says only that a child failed, never."""
    from gradshare.steps.preflight import probe_failure

    assert probe_failure(PROBE_LOG) == "rank 1 on hostb exited 1: OSError: [Errno 28] No space left on device"
    killed = PROBE_LOG.split("Traceback")[0] + PROBE_LOG[PROBE_LOG.index("gradshare.hosts.probe FAILED"):] \
        .replace("exitcode  : 1 (pid: 1234)", "exitcode  : -9 (pid: 1234)")
    assert probe_failure(killed) == "rank 1 on hostb killed by SIGKILL"
    assert probe_failure("just a line the launcher wrote\n") == "just a line the launcher wrote"
    assert probe_failure("") == "the launcher wrote nothing"
