"""The light processes load no torch (5 s of import): the MLflow plugin, which MLflow loads into
every process that imports mlflow; the `gradshare` dispatch and its --help; the train driver and
its launcher; and the steps that only read and write records. Each is imported first in a fresh
interpreter, as the process that runs it would."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

LIGHT = ["entrypoints.mlflow_plugin", "entrypoints.cli", "gradshare.train.driver", "gradshare.train.launch",
         "entrypoints.train", "entrypoints.prepare", "entrypoints.commit", "entrypoints.analyze",
         "entrypoints.study", "entrypoints.project", "entrypoints.preflight", "entrypoints.guard",
         "entrypoints.server", "entrypoints.upload"]


def loaded_after(code: str) -> set[str]:
    """The top-level modules a fresh interpreter holds after running `code` in the repository."""
    proc = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sys.modules))"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {m.split(".")[0] for m in proc.stdout.split()}


def test_no_light_process_imports_torch():
    """One interpreter imports them in turn, noting after each whether torch came in: the module
    whose import brought it is the one named (none that comes before it loads torch)."""
    code = ("import importlib, sys\nbrought = []\n"
            f"for m in {LIGHT!r}:\n"
            "    had = 'torch' in sys.modules\n"
            "    importlib.import_module(m)\n"
            "    if not had and 'torch' in sys.modules:\n"
            "        brought.append(m)\n"
            "print('BROUGHT', ' '.join(brought))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("BROUGHT", 1)[1].split() == []


def test_importing_mlflow_with_the_plugin_registered_loads_neither_torch_nor_the_study():
    """The plugin as MLflow loads it, through its entry point, in a process that runs no study."""
    from importlib.metadata import entry_points

    if not [e for e in entry_points(group="mlflow.default_experiment_provider") if e.name == "gradshare"]:
        pytest.skip("gradshare is not installed here: MLflow would not load its plugin")
    loaded = loaded_after("import mlflow\nimport entrypoints.mlflow_plugin")
    assert "torch" not in loaded and "transformers" not in loaded
    gradshare = loaded_after("import mlflow\nimport sys\nassert 'entrypoints.mlflow_plugin' in sys.modules")
    assert "gradshare" not in gradshare  # the checks and the plan wait for `mlflow run`


def test_gradshare_help_loads_no_step():
    proc = subprocess.run([sys.executable, "-c", "import sys\nfrom entrypoints import cli\n"
                           "try:\n    cli.main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
                           "print('MODULES', ' '.join(sys.modules))"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    help_text, _, modules = proc.stdout.rpartition("MODULES")
    assert proc.returncode == 0 and "gradshare preflight" in help_text, proc.stderr[-2000:]
    loaded = set(modules.split())
    assert "torch" not in loaded and not {m for m in loaded if m.startswith(("gradshare", "entrypoints.train"))}
