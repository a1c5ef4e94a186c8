"""STUDY.md, the project's pre-registration, states no number that `gradshare/plan.py` does not make.

Its numbers live in blocks that `scripts/study_md.py` generates from `load_plan("tiny")` and
`load_plan("full")`; the prose between the blocks is written by hand and carries no numbers.
"""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "study_md.py"


@pytest.fixture(scope="module")
def study_md():
    spec = importlib.util.spec_from_file_location("study_md", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def text():
    return (REPO / "STUDY.md").read_text()


def test_every_generated_block_of_study_md_is_what_the_plan_makes_now(study_md, text):
    have, want = study_md.blocks_in(text), study_md.generate()
    stale = [name for name in want if have[name] != want[name]]
    assert not stale, (f"STUDY.md's blocks {stale} differ from gradshare/plan.py: "
                       f"run `python scripts/study_md.py` and commit STUDY.md")


def test_the_check_command_passes_on_the_committed_document_and_names_a_stale_block(tmp_path):
    ok = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=REPO, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    doc = tmp_path / "STUDY.md"
    doc.write_text((REPO / "STUDY.md").read_text().replace("| 1.10 x |", "| 1.25 x |"))
    bad = subprocess.run([sys.executable, str(SCRIPT), "--check", "--file", str(doc)],
                         capture_output=True, text=True)
    assert bad.returncode == 1
    assert "plan:speed" in bad.stderr and "plan:quality" not in bad.stderr


def test_a_changed_speed_ratio_changes_the_speed_block_and_the_whole_plan_only(study_md):
    now = study_md.generate()
    changed = study_md.generate({"screen.speed_ratio": "1.25"})
    assert "1.10 x" in now["speed"] and "1.25 x" in changed["speed"]
    assert {name for name in now if now[name] != changed[name]} == {"speed", "profiles", "all"}


@pytest.mark.parametrize("override, block, shown", [
    ({"screen.noninferiority_pp": "-2.5"}, "quality", "-2.5 pp"),
    ({"screen.task_gain_pp": "12"}, "quality", "+12 pp"),
    ({"screen.retention_upper_nats": "0.05"}, "quality", "+0.05 nats"),
    ({"screen.z": "2.58"}, "report", "2.58"),
    ({"powersgd.rank": "16"}, "powersgd", "| 16 | 16 |"),
    ({"arms.max_attempts": "2"}, "attempts", "| 2 | 2 |"),
    ({"infra.usd_per_host_hour": "3.5"}, "infra", "| 3.5 | 3.5 |"),
])
def test_a_changed_plan_number_shows_in_its_block(study_md, override, block, shown):
    assert shown not in study_md.generate()[block]
    assert shown in study_md.generate(override)[block]


def test_the_rewrite_puts_a_changed_plan_into_the_document_and_nothing_else(study_md, text):
    changed = study_md.render(text, {"screen.speed_ratio": "1.25"})
    assert study_md.prose(changed) == study_md.prose(text)
    assert "1.25 x" in study_md.blocks_in(changed)["speed"]
    assert study_md.stale(changed, {"screen.speed_ratio": "1.25"}) == []
    assert "speed" in study_md.stale(changed)


# The screens' thresholds as the blocks print them, and any other number literal: none of them
# may appear in the hand-written prose, where no script would keep it true.
THRESHOLDS = ("1.10", "1.1 x", "0.02", "+10", "-3", "1.96")
NUMBER = re.compile(r"(?<![\w.\-+$])[+\-$]?\d[\d,]*(?:\.\d+)?(?!\.?\w)")
# Number words that would restate a plan count (arms, ranks, hosts, families, warm-up, hours).
NUMBER_WORDS = re.compile(r"\b(three|four|six|eight|thirty-two|hundred|thousand)\b", re.I)


def test_the_prose_states_no_plan_number_outside_the_generated_blocks(study_md, text):
    prose = study_md.prose(text)
    assert [t for t in THRESHOLDS if t in prose] == []
    assert NUMBER.findall(prose) == []
    assert NUMBER_WORDS.findall(prose) == []
    # ... while the blocks do state them, from the plan.
    blocks = "".join(study_md.blocks_in(text).values())
    for shown in ("1.10 x", "+0.02 nats", "+10 pp", "-3 pp", "1.96", "1,460 s", "5,296 s", "2.24208"):
        assert shown in blocks


def test_the_number_check_would_catch_a_number_written_by_hand(study_md, text):
    for sentence in ("The candidate must be 1.10 times as fast.", "It trains for 128 updates.",
                     "Retention may rise by at most +0.02 nats.", "A lower bound of -3 pp.",
                     "A budget of $100 applies.", "There are 1,024 cases."):
        assert NUMBER.findall(sentence), sentence
    for harmless in ("SHA-256", "FP32", "bf16", "Qwen3", "plan:speed"):
        assert not NUMBER.findall(harmless), harmless


def test_the_readme_points_at_the_projects_own_study_md():
    readme = (REPO / "README.md").read_text()
    assert "../shared/STUDY.md" not in readme
    assert "`STUDY.md`" in readme
