"""No leaked secret: secrets planted in the environment of every step the suite runs
(`tests/conftest.py`) appear nowhere in the store, its database and every artifact searched byte
for byte, once a whole study is scored. (The server's own safety: tests/unit/tracking/test_security.py.)"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import PLANTED_SECRETS

pytestmark = pytest.mark.e2e


def test_no_planted_secret_reaches_the_store(mlflow_server, scored_study):
    """Every step the suite ran had secrets in its environment (`conftest.PLANTED_SECRETS`): the
    scored study's prepare, four arms, commit and score at least, and every study the tests
    of this worker made before this one (the worker's server is this session's own). Every byte the server keeps (its database, with every parameter, tag
    and system metric, and every artifact) is searched for them."""
    for name, secret in PLANTED_SECRETS.items():
        assert os.environ[name] == secret  # planted: the steps inherited it
    root = Path(mlflow_server.artifacts).parent
    stores = [root / "mlflow.db", *[p for p in Path(mlflow_server.artifacts).rglob("*") if p.is_file()]]
    assert len(stores) > 10  # the database and the studies' artifacts (inputs, checkpoints, ...)
    for path in stores:
        data = path.read_bytes()
        for name, secret in PLANTED_SECRETS.items():
            assert secret.encode() not in data, f"{name} found in {path}"
