"""Tag names: every `gradshare.*` tag is spelled once, in gradshare/contract/tags.py.

Steps find each other by these tags; a name spelled twice drifts (a tag written as
`gradshare.inputs_sha256` by prepare and read under another spelling finds nothing, silently).
"""
import ast
import re
from pathlib import Path

from gradshare.contract import tags
from tests.conftest import REPO

SCANNED = ("gradshare", "analysis", "entrypoints", "scripts", "benchmarks")
HOME = REPO / "gradshare" / "contract" / "tags.py"
TAG_NAMES = sorted({v for v in vars(tags).values() if isinstance(v, str) and v.startswith(tags.PREFIX)},
                   key=len, reverse=True)
MENTION = re.compile(r"(?<![\w.])(" + "|".join(re.escape(n) for n in TAG_NAMES) + r")(?![\w])")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants: prose that may name a tag for its reader."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def tag_literals(path: Path):
    """(line, text) of every string constant, f-string parts included, that starts with
    `gradshare.` or names one of the tags in tags.py; docstrings and comments are not code."""
    tree = ast.parse(path.read_text(), str(path))
    prose = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            if node.value.startswith(tags.PREFIX) or MENTION.search(node.value):
                yield node.lineno, node.value


def test_no_tag_name_is_spelled_outside_tags_py():
    found = []
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            if path != HOME:
                found += [f"{path.relative_to(REPO)}:{line}: {text!r}" for line, text in tag_literals(path)]
    assert not found, "tag names belong in gradshare/contract/tags.py; found:\n" + "\n".join(found)


def test_the_scan_sees_literals_messages_and_f_string_parts_but_not_docstrings_or_comments(tmp_path):
    src = tmp_path / "x.py"
    src.write_text('"""Reads `gradshare.arm` of each run."""\n'  # 1: a docstring
                   '# tags["gradshare.arm"] in a comment\n'  # 2
                   'a = "gradshare.arm"\n'  # 3: a literal tag
                   'b = f"gradshare.{name}"\n'  # 4: a tag built in an f-string
                   'c = "see its run\'s gradshare.failure_reason"\n'  # 5: a tag in a message
                   'd = f"{x} has no gradshare.refusal tag"\n'  # 6: in an f-string's text
                   'e = "gradshare.arms is not a tag"\n'  # 7: the prefix alone is a literal too
                   'f = "an arm: gradshare.armsful"\n'  # 8: no tag, only a longer word
                   'def g():\n    """Sets gradshare.refusal."""\n')  # 10: a docstring
    assert sorted(line for line, _ in tag_literals(src)) == [3, 4, 5, 6, 7]


def test_every_tag_name_is_unique_and_under_the_prefix():
    names = [v for k, v in vars(tags).items() if k.isupper() and k != "PREFIX" and isinstance(v, str)
             and v.startswith(tags.PREFIX)]
    assert len(names) == len(set(names)) and len(names) >= 20
    assert tags.screen_tag("speed_screen") == "gradshare.speed_screen"
