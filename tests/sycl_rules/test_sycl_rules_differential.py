"""The stand-in SYCL runtime (``inductor_xpugraph.sycl_rules.sycl``) against Intel's real one.

Each scenario of tests/sycl_rules/sycl_cpu/scenarios.py runs on both: on the real SYCL
runtime (the OpenCL CPU device, through dpctl and tests/sycl_rules/sycl_cpu/shim.cpp, in one
subprocess for all scenarios) and on the stand-in; their observations, SYCL's exception
texts included, must be equal.

The real side needs a Python with the pinned packages and g++ (to build the shim once, into
~/.cache/inductor_xpugraph/sycl_cpu). That Python is ``$INDUCTOR_XPUGRAPH_SYCL_PYTHON``, or the
one running the tests; it needs neither torch nor this package::

    python -m venv /tmp/syclvenv
    /tmp/syclvenv/bin/pip install intel-sycl-rt==2026.2.0 intel-opencl-rt==2026.2.0 dpctl==0.22.1
    INDUCTOR_XPUGRAPH_SYCL_PYTHON=/tmp/syclvenv/bin/python python -m pytest \\
        tests/sycl_rules/test_sycl_rules_differential.py

Without them the module is skipped, with the reason.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent / "sycl_cpu"
RUNNER = HERE / "real_runtime.py"
TIMEOUT_S = 120


def _load_scenarios():
    spec = importlib.util.spec_from_file_location("sycl_cpu_scenarios", HERE / "scenarios.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


scenarios = _load_scenarios()
SCENARIOS = scenarios.all_scenarios()


@pytest.fixture(scope="module")
def real_outcomes() -> dict:
    """name -> observations of every scenario on the real SYCL runtime."""
    python = os.environ.get("INDUCTOR_XPUGRAPH_SYCL_PYTHON") or sys.executable
    try:
        result = subprocess.run(
            [python, str(RUNNER)], capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired as timeout:
        pytest.fail(f"the real SYCL runtime's scenarios ran past {TIMEOUT_S} s:\n{timeout.stderr}")
    lines = result.stdout.splitlines()
    if result.returncode != 0 or not lines:
        pytest.fail(
            f"{RUNNER.name} exited with {result.returncode} (a crash in SYCL or the shim):\n"
            f"{result.stderr[-4000:]}"
        )
    report = json.loads(lines[-1])
    if "skip" in report:
        pytest.skip(
            f"no real SYCL runtime ({report['skip']}); set INDUCTOR_XPUGRAPH_SYCL_PYTHON to a "
            "Python that has the packages"
        )
    return report["outcomes"]


def test_real_runtime_runs_every_scenario(real_outcomes):
    assert list(real_outcomes) == list(SCENARIOS)
    failed = {
        name: outcome["harness_error"]
        for name, outcome in real_outcomes.items()
        if isinstance(outcome, dict)
    }
    assert not failed, "\n".join(f"{name}:\n{error}" for name, error in failed.items())


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_stand_in_matches_real_runtime(real_outcomes, name):
    sycl = pytest.importorskip("inductor_xpugraph.sycl_rules.sycl")
    expected = real_outcomes[name]
    if isinstance(expected, dict):
        pytest.fail(f"the scenario failed on the real runtime:\n{expected['harness_error']}")
    assert SCENARIOS[name](sycl.Runtime()) == expected
