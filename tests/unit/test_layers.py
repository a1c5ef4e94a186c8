"""The house rules of the code, read from its own imports: every package on one floor, imports
only from its floor or below (never upward, never in a circle), and lazy imports only of heavy
backends. README's Architecture section draws the same floors."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FLOORS = ("contract", "util", "data", "model", "inputs", "hosts", "tracking", "cost", "train", "steps",
          "analysis", "entrypoints")
OWN = ("gradshare", "analysis", "entrypoints")
# Imported inside functions, each with its reason in the module: they cost seconds to import.
HEAVY = {"mlflow", "torch", "transformers", "matplotlib", "accelerate", "boto3", "safetensors", "tokenizers",
         "datasets", "pyarrow", "pandas", "chitchat_dataset", "markdown"}


def package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "gradshare":
        return parts[1] if len(parts) > 2 else None  # gradshare/__init__ is no floor
    return parts[0] if parts[0] in OWN else None


def modules(root: Path = REPO) -> dict[str, Path]:
    found = {}
    for top in OWN:
        for path in (root / top).rglob("*.py"):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports_of(source: str, known: set[str]) -> list[tuple[str, int, bool]]:
    """(imported module of the project, line, inside a function) for every import in `source`;
    `from pkg import mod` counts as importing `pkg.mod` where that is a module."""
    tree = ast.parse(source)
    inner = {id(sub) for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
             for sub in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                     for a in node.names]
        else:
            continue
        out += [(n, node.lineno, id(node) in inner) for n in names if n.split(".")[0] in OWN]
    return out


def back_arrows(found: dict[str, Path]) -> list[str]:
    known = set(found)
    bad = []
    for name, path in found.items():
        here = package_of(name)
        if here not in FLOORS:
            continue
        for target, line, _ in imports_of(path.read_text(), known):
            there = package_of(target)
            if there in FLOORS and FLOORS.index(there) > FLOORS.index(here):
                bad.append(f"{path.relative_to(REPO)}:{line} ({here}, floor {FLOORS.index(here)}) imports "
                           f"{target} ({there}, floor {FLOORS.index(there)})")
    return bad


def circles(found: dict[str, Path]) -> list[list[str]]:
    """Every import circle between modules, imports inside functions included."""
    known = set(found)
    graph = {name: sorted({t for t, _, _ in imports_of(path.read_text(), known) if t in known and t != name})
             for name, path in found.items()}
    seen, stack, on_stack, cycles = {}, [], set(), []

    def visit(node):  # Tarjan's strongly connected components
        seen[node] = low = len(seen)
        lows[node] = low
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in seen:
                visit(nxt)
                lows[node] = min(lows[node], lows[nxt])
            elif nxt in on_stack:
                lows[node] = min(lows[node], seen[nxt])
        if lows[node] == seen[node]:
            comp = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                comp.append(top)
                if top == node:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    lows = {}
    for name in sorted(graph):
        if name not in seen:
            visit(name)
    return cycles


def test_every_package_has_a_floor_and_every_module_is_in_a_package():
    found = modules()
    loose = [n for n, path in found.items() if path.parent == REPO / "gradshare" and path.name != "__init__.py"]
    assert not loose, f"modules directly under gradshare/ (put each in a package): {loose}"
    assert {package_of(n) for n in found} - {None} == set(FLOORS)


def test_no_module_imports_from_a_floor_above_its_own():
    bad = back_arrows(modules())
    assert not bad, "imports that reach up a floor:\n" + "\n".join(bad)


def test_no_import_circle_even_through_imports_inside_functions():
    found = circles(modules())
    assert not found, f"import circles: {found}"


def test_lazy_imports_are_heavy_backends_only():
    bad = []
    for name, path in modules().items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for sub in ast.walk(node):
                mods = ([a.name for a in sub.names] if isinstance(sub, ast.Import) else
                        [sub.module] if isinstance(sub, ast.ImportFrom) and sub.module else [])
                bad += [f"{path.relative_to(REPO)}:{sub.lineno} {m}" for m in mods if m.split(".")[0] not in HEAVY]
    assert not bad, "imports inside functions that belong at the top of their module:\n" + "\n".join(bad)


def test_the_rules_catch_a_back_arrow_and_a_circle(tmp_path):
    """The checks themselves: a made-up tree with an upward import and a circle is caught."""
    for rel, text in {"gradshare/__init__.py": "", "analysis/__init__.py": "", "entrypoints/__init__.py": "",
                      "gradshare/contract/__init__.py": "", "gradshare/train/__init__.py": "",
                      "gradshare/contract/plan.py": "def f():\n    from gradshare.train import loop\n",
                      "gradshare/train/loop.py": "from gradshare.contract import plan\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = modules(tmp_path)
    global REPO
    here, REPO = REPO, tmp_path
    try:
        arrows = back_arrows(found)
    finally:
        REPO = here
    assert arrows == ["gradshare/contract/plan.py:2 (contract, floor 0) imports gradshare.train.loop (train, floor 8)"]
    assert circles(found) == [["gradshare.contract.plan", "gradshare.train.loop"]]


@pytest.mark.parametrize("module", ["gradshare.tracking.study_runs", "gradshare.train.loop", "entrypoints.cli"])
def test_a_module_imports_on_its_own(module):
    """Imported first, in a fresh interpreter: no circle hides behind the order of imports."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
