"""No leaked secret: secrets planted in the environment of every step the suite runs
(`tests/conftest.py`) appear nowhere in the store, its database and every artifact searched byte
for byte, once a whole study is scored. (The server's own safety: tests/unit/tracking/test_security.py.)

On two workers (the default, tests/conftest.py) each has its own server: this module searches the store
of the worker that scores the small study; `e2e/test_newcomer.py` searches the other's, once the
README's first command has run its whole study there."""
from __future__ import annotations

import pytest

from tests.conftest import planted_secrets_found

pytestmark = pytest.mark.e2e


def test_no_planted_secret_reaches_the_store(mlflow_server, scored_study):
    """Every step the suite ran had secrets in its environment (`conftest.PLANTED_SECRETS`): the
    scored study's prepare, four arms, commit and score at least, and every study the tests
    of this worker made before this one (the worker's server is this session's own)."""
    assert planted_secrets_found(mlflow_server) == []
