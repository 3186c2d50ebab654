"""A fixture for tests of the recording-mode probe: no forced native recording, and no probe
result kept from another test, before or after."""

import pytest

from inductor_xpugraph.trees.backends import recording_probe
from inductor_xpugraph.trees.backends.xpu_recording import FORCE_NATIVE


@pytest.fixture(autouse=True)
def fresh_probes(monkeypatch):
    monkeypatch.delenv(FORCE_NATIVE, raising=False)
    recording_probe.forget_probes()
    yield
    recording_probe.forget_probes()
