"""The study's choice of link for its two-process arms (`gradshare.steps.emulated.choose_link`):
two emulated hosts where this machine can make them and the tracking server is on its loopback;
otherwise loopback, with the reason in the arm's note; an asked-for mode that cannot be had is
refused with the choices. (Making the hosts: tests/unit/hosts/test_two_hosts.py.)"""
from __future__ import annotations

import pytest

from gradshare.contract.plan import load_plan
from gradshare.hosts import netns
from gradshare.steps import emulated
from tests.conftest import SMALL

PLAN = load_plan("tiny", SMALL)


def test_without_namespaces_the_study_falls_back_to_loopback_and_says_why(monkeypatch):
    monkeypatch.setattr(netns, "unavailable", lambda: "network namespaces need root (this process is not root)")
    link = emulated.choose_link("auto", PLAN)
    assert not link.emulated
    assert link.note == ("loopback: both ranks on one host, no byte crossed a link (network namespaces need "
                         "root (this process is not root))")
    asked = emulated.choose_link("loopback", PLAN)
    assert not asked.emulated and asked.note.startswith("loopback: both ranks on one host, as asked (hosts=loopback)")
    with pytest.raises(SystemExit, match="hosts=emulated: cannot make emulated hosts here: network namespaces"):
        emulated.choose_link("emulated", PLAN)
    with pytest.raises(SystemExit, match="choose one of auto, emulated, loopback"):
        emulated.choose_link("namespaces", PLAN)


def test_a_tracking_server_off_this_machine_keeps_the_arms_on_loopback(monkeypatch):
    import mlflow

    monkeypatch.setattr(netns, "unavailable", lambda: None)
    monkeypatch.setattr(mlflow, "get_tracking_uri", lambda: "http://10.1.2.3:5000")
    link = emulated.choose_link("auto", PLAN)
    assert not link.emulated and "http://10.1.2.3:5000 is not on this machine's loopback" in link.note
    monkeypatch.setattr(mlflow, "get_tracking_uri", lambda: "sqlite:///mlflow.db")
    assert emulated.choose_link("auto", PLAN).emulated
    assert emulated.choose_link("auto", PLAN).note.startswith("emulated: two hosts (network namespaces) joined by a 22")
