"""Inductor's FX graph cache and AOTAutograd cache never hand back a stale wrapper.

Each step runs in a fresh Python process sharing one cache directory, as two runs of a
user's program would. The probe compiles the same function with mode="reduce-overhead" on
the CPU, with or without the extension, and reports whether the wrapper it loaded (from a
cache hit or a fresh compile) contains our graph-tree calls, plus the cache counters.
"""

import concurrent.futures
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import json, sys
import torch
from torch._dynamo.utils import counters
from torch._inductor.codecache import PyCodeCache

if sys.argv[1] == "extension":
    import inductor_xpugraph
    inductor_xpugraph.enable("cpu")

def f(x, w):
    return (x @ w).relu() + 1

compiled = torch.compile(f, mode="reduce-overhead")
x, w = torch.randn(4, 8), torch.randn(8, 8)
for _ in range(3):
    torch.testing.assert_close(compiled(x, w), f(x, w))
sources = [open(m.__file__).read() for m in PyCodeCache.modules if getattr(m, "__file__", None)]
print(json.dumps({
    "graphified": any("_graph_trees.graphify(" in s for s in sources),
    "fx_hits": counters["inductor"]["fxgraph_cache_hit"],
    "aot_hits": counters["aot_autograd"]["autograd_cache_hit"],
}))
"""


def run_probe(mode: str, cache_dir: Path) -> dict:
    env = dict(
        os.environ,
        TORCHINDUCTOR_CACHE_DIR=str(cache_dir),
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        INDUCTOR_XPUGRAPH_DEVICES="",
    )
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, mode], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# Two runs of a user's program each, in fresh processes sharing one cache directory.
SCENARIOS = {
    "enable-after-stock-run": ("stock", "extension"),
    "disable-after-extension-run": ("extension", "stock"),
    "same-setting-twice": ("extension", "extension"),
}


@pytest.fixture(scope="module")
def probes(tmp_path_factory) -> dict[str, list[dict] | Exception]:
    """Each scenario's two probe results (or why a probe failed, raised by its test). The
    scenarios run two at a time: a probe is a fresh process of about 10 s on one core."""

    # Made here, not in the threads: pytest's temporary-directory factory is not thread-safe.
    cache_dirs = {name: tmp_path_factory.mktemp(name) for name in SCENARIOS}

    def run(name: str) -> tuple[str, list[dict] | Exception]:
        cache_dir = cache_dirs[name]
        try:
            return name, [run_probe(mode, cache_dir) for mode in SCENARIOS[name]]
        except Exception as error:  # AssertionError from run_probe, a timeout
            return name, error

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(run, SCENARIOS))


def results(probes: dict, scenario: str) -> list[dict]:
    found = probes[scenario]
    if isinstance(found, Exception):
        raise found
    return found


@pytest.mark.parametrize("scenario", ["enable-after-stock-run", "disable-after-extension-run"])
def test_switching_the_extension_never_reuses_the_other_wrapper(probes, scenario):
    (first, second), (before, after) = SCENARIOS[scenario], results(probes, scenario)
    assert before["graphified"] is (first == "extension")
    assert after["graphified"] is (second == "extension")


def test_same_setting_hits_the_cache_and_keeps_graph_calls(probes):
    _, again = results(probes, "same-setting-twice")
    assert again["graphified"]
    assert again["fx_hits"] + again["aot_hits"] >= 1
