"""FAULTS.md names, for each fault, the tests that inject it: each named test must exist."""
from __future__ import annotations

import re

from tests.conftest import REPO


def test_every_row_of_faults_md_names_tests_that_exist():
    """FAULTS.md's last column: `tests/<tier>/.../file.py::test_name` (or `...::test_name`, the
    same file as the name before it, or a whole file); each must be a test in the suite."""
    rows = [line for line in (REPO / "FAULTS.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith(("| fault ", "|---"))]
    assert len(rows) >= 40
    for row in rows:
        cell = row.rstrip(" |").rsplit(" | ", 1)[1]
        names = re.findall(r"`([^`]+)`", cell)
        assert names, f"no test named in: {row[:80]}"
        current = None
        for name in names:
            path, _, test = name.partition("::")
            current = REPO / path if path != "..." else current
            assert current is not None and current.is_file(), f"{name}: no such file ({row[:60]})"
            if test:
                assert re.search(rf"^def {re.escape(test)}\(", current.read_text(), re.M), \
                    f"{name}: no such test in {current.name}"
