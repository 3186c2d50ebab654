"""A ``mode="reduce-overhead"`` graph compiled for a device this package is not enabled for:
``stats()`` says once, in the log, what is missing, and ``report()`` and the doctor say it
too."""

import logging

import pytest
import torch
from torch._dynamo.utils import counters

import inductor_xpugraph
from inductor_xpugraph.diagnostics import doctor
from inductor_xpugraph.trees import stats as runtime_stats


@pytest.fixture
def cpu_not_enabled(monkeypatch):
    """The CPU (emulator) not enabled, fresh counters, and nothing said yet."""
    was_enabled = "cpu" in inductor_xpugraph.enabled_devices()
    inductor_xpugraph.disable("cpu")
    torch._dynamo.reset()
    inductor_xpugraph.reset()
    monkeypatch.setitem(counters, "inductor", counters["inductor"].copy())
    counters["inductor"].clear()
    monkeypatch.setattr(runtime_stats, "_said", set())
    yield
    torch._dynamo.reset()
    if was_enabled:
        inductor_xpugraph.enable("cpu")


def test_graphs_compiled_for_a_device_not_enabled_are_hinted_at_once(cpu_not_enabled, caplog):
    compiled = torch.compile(lambda x: (x * 2).sin(), mode="reduce-overhead")
    with caplog.at_level(logging.WARNING, logger="inductor_xpugraph"):
        for _ in range(3):
            compiled(torch.randn(4))
            assert inductor_xpugraph.stats()["records"] == 0
    hints = [r.getMessage() for r in caplog.records if "captured nothing" in r.getMessage()]
    assert len(hints) == 1 and 'inductor_xpugraph.enable("cpu")' in hints[0], hints
    assert "enable(" in inductor_xpugraph.report().hint
    assert "hint: Inductor skipped its device graphs" in str(inductor_xpugraph.report())
    findings = doctor.diagnose(probe=False)
    assert any(f.check == "registration" and "captured nothing" in f.detail for f in findings)


def test_no_hint_where_this_package_captures(emulator):
    compiled = torch.compile(lambda x: (x * 2).sin(), mode="reduce-overhead")
    for _ in range(3):
        compiled(torch.randn(4))
    assert inductor_xpugraph.stats()["replays"] >= 1
    assert inductor_xpugraph.report().hint is None
