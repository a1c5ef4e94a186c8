"""The house rules of the code, read from its own imports: every package on one floor, imports
only from its floor or below (never upward, never in a circle), and lazy imports only of heavy
backends. README's Architecture section draws the same floors."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FLOORS = ("kinds", "contract", "util", "data", "model", "inputs", "hosts", "tracking", "cost", "train", "steps",
          "analysis", "entrypoints")
OWN = ("gradshare", "analysis", "entrypoints")
# Heavy backends may be imported inside the functions that use them: each costs a second or more,
# which the light processes (the MLflow plugin, the CLI's dispatch, the driver, the launcher and
# the steps that train nothing) must not pay. One rule for every module, stated here once.
HEAVY = {"mlflow", "torch", "transformers", "matplotlib", "accelerate", "boto3", "safetensors", "tokenizers",
         "datasets", "pyarrow", "pandas", "chitchat_dataset", "markdown"}


# The project's own modules imported inside a function (or by name, importlib), each with why; the
# same reason is on the line in the module. Anything else belongs at the top of its module.
DEFERRED = {
    ("gradshare/kinds/powersgd.py", "gradshare.kinds.powersgd_hook"):
        "the hook's code (torch) loads only in a training process: the plan, the launcher and the budget check ask the kind without torch",
    ("entrypoints/mlflow_plugin.py", "gradshare.tracking.connection"):
        "only when `mlflow run` is stopped (SIGTERM): the plugin stays light in every other process",
    ("entrypoints/mlflow_plugin.py", "entrypoints.mlflow_run_checks"):
        "MLflow loads the plugin in every process that imports mlflow; only `mlflow run` pays for the checks",
    ("entrypoints/cli.py", "entrypoints.*"):
        "`gradshare CMD` imports CMD's module only: `--help` and the light commands load no torch",
    ("gradshare/hosts/probe.py", "gradshare.model.update_cost"):
        "the probe's processes time the model (torch, transformers); the preflight step imports the probe's Probe without them",
    ("gradshare/inputs/build.py", "gradshare.model.lm"):
        "only the tiny seed model needs the model's code (torch); the projection builds inputs without one",
}


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


def imports_of(source: str, known: set[str], keep=lambda name: name.split(".")[0] in OWN) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import in `source` of a module `keep`
    takes (the project's own, by default); `from pkg import mod` counts as importing `pkg.mod`
    where that is a module."""
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
        out += [(n, node.lineno, id(node) in inner) for n in names if keep(n)]
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


def cost_reads_of_the_store(root: Path = REPO) -> list[tuple[str, int, str]]:
    """(file, line, module) of every import of the tracking package or of mlflow in gradshare/cost/,
    at the top of a module or inside a function."""
    known = set(modules(root))
    reads = lambda name: name == "mlflow" or name.startswith(("mlflow.", "gradshare.tracking"))  # noqa: E731
    return [(path.relative_to(root).as_posix(), line, name)
            for path in sorted((root / "gradshare" / "cost").rglob("*.py"))
            for name, line, _ in imports_of(path.read_text(), known, keep=reads)]


def test_cost_computes_and_reads_no_store():
    """`cost/` takes values and returns values: no module under it imports `gradshare.tracking` or
    mlflow, at its top or inside a function; the study's figures are read by `gradshare.tracking.figures`."""
    bad = [f"{f}:{line} {m}" for f, line, m in cost_reads_of_the_store()]
    assert not bad, "cost modules that read the tracking store themselves:\n" + "\n".join(bad)


def _made_up_tree(root: Path, files: dict[str, str]) -> None:
    """The project's three top packages under `root`, and `files` (path -> text) in them: a tree
    for the rules' own tests."""
    for rel, text in {"gradshare/__init__.py": "", "analysis/__init__.py": "", "entrypoints/__init__.py": "",
                      **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_the_cost_rule_catches_a_read_of_the_store(tmp_path):
    """The check itself: a made-up cost module that imports the tracking package at its top and
    mlflow inside a function is caught, both lines."""
    _made_up_tree(tmp_path, {"gradshare/cost/__init__.py": "", "gradshare/tracking/__init__.py": "",
                             "gradshare/tracking/store.py": "",
                             "gradshare/cost/x.py": "from gradshare.tracking import store\ndef f():\n    import mlflow\n"})
    assert cost_reads_of_the_store(tmp_path) == [("gradshare/cost/x.py", 1, "gradshare.tracking.store"),
                                                 ("gradshare/cost/x.py", 3, "mlflow")]


def deferred_imports(root: Path = REPO) -> list[tuple[str, int, str]]:
    """(file, line, module) of every import inside a function, and of every `importlib.import_module`
    call (its f-string's fixed part, then `*`), in the project's code."""
    found, known = [], set(modules(root))
    for path in modules(root).values():
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module" and node.args:
                arg = node.args[0]
                name = (arg.value if isinstance(arg, ast.Constant) else
                        "".join(v.value if isinstance(v, ast.Constant) else "*" for v in arg.values)
                        if isinstance(arg, ast.JoinedStr) else "*")
                found.append((rel, node.lineno, name))
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for sub in ast.walk(node):
                if isinstance(sub, ast.Import):
                    found += [(rel, sub.lineno, a.name) for a in sub.names]
                elif isinstance(sub, ast.ImportFrom) and sub.module:
                    found += [(rel, sub.lineno, f"{sub.module}.{a.name}" if f"{sub.module}.{a.name}" in known
                               else sub.module) for a in sub.names]
    return sorted(set(found))


def test_imports_inside_functions_are_heavy_backends_or_allow_listed():
    found = deferred_imports()
    own = [(f, line, m) for f, line, m in found if m.split(".")[0] not in HEAVY]
    bad = [f"{f}:{line} {m}" for f, line, m in own if (f, m) not in DEFERRED]
    assert not bad, ("imports inside functions that belong at the top of their module (or in DEFERRED, "
                     "with their reason):\n" + "\n".join(bad))
    stale = set(DEFERRED) - {(f, m) for f, _, m in own}
    assert not stale, f"DEFERRED names imports the code no longer defers: {sorted(stale)}"


def test_the_rules_catch_a_back_arrow_and_a_circle(tmp_path):
    """The checks themselves: a made-up tree with an upward import and a circle is caught."""
    _made_up_tree(tmp_path, {"gradshare/contract/__init__.py": "", "gradshare/train/__init__.py": "",
                             "gradshare/contract/plan.py": "def f():\n    from gradshare.train import loop\n",
                             "gradshare/train/loop.py": "from gradshare.contract import plan\n"})
    found = modules(tmp_path)
    global REPO
    here, REPO = REPO, tmp_path
    try:
        arrows = back_arrows(found)
    finally:
        REPO = here
    assert arrows == ["gradshare/contract/plan.py:2 (contract, floor 1) imports gradshare.train.loop (train, floor 9)"]
    assert circles(found) == [["gradshare.contract.plan", "gradshare.train.loop"]]
    # the deferred import the allow-list would have to name, found as the module it loads
    assert deferred_imports(tmp_path) == [("gradshare/contract/plan.py", 2, "gradshare.train.loop")]


@pytest.mark.parametrize("module", ["gradshare.tracking.study_runs", "gradshare.train.loop", "entrypoints.cli"])
def test_a_module_imports_on_its_own(module):
    """Imported first, in a fresh interpreter: no circle hides behind the order of imports."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
