"""`set_determinism`: PyTorch's deterministic switch, set the same whether or not the process
compiles, and Inductor imported (and its flag set) only where it compiles. Each case runs in a
fresh interpreter: whether `torch._inductor` was imported is a fact of the whole process."""
from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys, torch
from gradshare.util.sources import set_determinism
out = []
for enabled in (True, False, True):  # each time the opposite of before, to see it change
    set_determinism(enabled, compiles={compiles})
    seen = {{"enabled": torch.are_deterministic_algorithms_enabled(),
             "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
             "inductor_imported": "torch._inductor" in sys.modules}}
    if {compiles}:
        seen["inductor_deterministic"] = sys.modules["torch._inductor.config"].deterministic
    out.append(seen)
print(json.dumps(out))
"""


def _probe(compiles: bool) -> list[dict]:
    # a fresh interpreter, which has imported torch and not Inductor when the probe begins
    done = subprocess.run([sys.executable, "-c", PROBE.format(compiles=compiles)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_process_that_compiles_nothing_gets_the_switch_without_importing_inductor():
    assert _probe(compiles=False) == [{"enabled": on, "warn_only": True, "inductor_imported": False}
                                      for on in (True, False, True)]


def test_a_process_that_compiles_gets_the_switch_and_inductors_flag():
    assert _probe(compiles=True) == [{"enabled": on, "warn_only": True, "inductor_imported": True,
                                      "inductor_deterministic": on} for on in (True, False, True)]
