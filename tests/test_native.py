"""The compiled module (``inductor_xpugraph.native``): installed with the package, found per
torch release and per environment, never built inside a user's call nor waited on, and its
absence said in one line with its cost and fix."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from inductor_xpugraph import native

PACKAGE = Path(native.__file__).parent
# CUDA builds of torch make held outputs raise themselves (trees/invalidation.py).
TORCH_HAS_ITS_OWN_BINDING = hasattr(torch._C, "_set_storage_access_error_msg")


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """This environment's build cache, empty; no background build starts."""
    monkeypatch.setenv("INDUCTOR_XPUGRAPH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(native.BACKGROUND_BUILD_VARIABLE, "0")
    return native.environment_cache()


@pytest.fixture
def package_without_the_module(tmp_path):
    """A copy of the package as ``pip install`` leaves it where nothing could be compiled: a
    directory to put first on PYTHONPATH."""
    root = tmp_path / "site"
    shutil.copytree(
        PACKAGE,
        root / "inductor_xpugraph",
        ignore=shutil.ignore_patterns("__pycache__", native.MODULE_PREFIX + "*"),
    )
    return root


def run_python(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    """A fresh interpreter started in ``cwd`` (which comes first on its ``sys.path``)."""
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True, text=True, timeout=240, env={**os.environ, **env}, cwd=cwd,
    )  # fmt: skip


def test_the_installed_package_imports_its_compiled_module_without_building(empty_cache):
    """What ``pip install --no-build-isolation`` (the README's commands, and CI's) gives."""
    found = native.find()
    assert found is not None and found.parent == PACKAGE, (
        f"no compiled module for torch {torch.__version__} in {PACKAGE}: install the package "
        "as the README says (pip install --no-build-isolation ...)"
    )
    assert native.load() is not None
    assert not empty_cache.exists()  # nothing was built


def test_the_module_name_carries_the_torch_release():
    assert native.module_name("2.13.0+cpu") == "_stale_outputs_torch_2_13_0_cpu"
    assert native.module_name("2.15.0") != native.module_name("2.14.1")


def test_torchs_version_is_read_without_importing_torch():
    assert native.torch_build()["__version__"] == torch.__version__
    assert native.torch_build()["cuda"] == torch.version.cuda


def test_two_environments_on_one_torch_release_build_in_caches_of_their_own(
    empty_cache, monkeypatch, tmp_path
):
    """Each virtual environment's torch has its own cache directory and its own build lock:
    neither replaces, nor waits on, the other's build."""
    caches = []
    for venv in ("venv-a", "venv-b"):
        torch_dir = tmp_path / venv / "site-packages" / "torch"
        monkeypatch.setattr(native, "torch_directory", lambda torch_dir=torch_dir: torch_dir)
        caches.append(native.environment_cache())
    assert caches[0] != caches[1]
    with native.build_lock(caches[0]) as first, native.build_lock(caches[1]) as second:
        assert first and second


def test_a_build_under_way_makes_another_process_start_none(empty_cache, monkeypatch):
    monkeypatch.setenv(native.BACKGROUND_BUILD_VARIABLE, "1")
    monkeypatch.setattr(native, "find", lambda: None)
    monkeypatch.setattr(native, "missing_tools", lambda: [])
    started = []
    monkeypatch.setattr(native.subprocess, "Popen", lambda *a, **k: started.append(a))
    with native.build_lock(empty_cache) as taken:
        assert taken
        assert native.start_background_build() is False
    assert not started
    assert native.start_background_build() is True and len(started) == 1


def test_a_cache_that_cannot_be_made_starts_no_build_and_raises_nothing(empty_cache, monkeypatch):
    monkeypatch.setenv(native.BACKGROUND_BUILD_VARIABLE, "1")
    monkeypatch.setattr(native, "find", lambda: None)
    monkeypatch.setattr(native, "missing_tools", lambda: [])
    empty_cache.parent.parent.mkdir(parents=True)
    empty_cache.parent.write_text("a file where the cache's directory should be")
    assert native.start_background_build() is False


def test_a_lock_left_by_a_killed_build_stops_nobody(empty_cache):
    """The builder's lock is the OS's: the kernel drops it with its holder."""
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            sys.path.insert(0, {str(PACKAGE.parent)!r})
            from inductor_xpugraph import native
            from pathlib import Path
            with native.build_lock(Path({str(empty_cache)!r})) as taken:
                print(taken, flush=True)
                time.sleep(600)
        """)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "True"
        with native.build_lock(empty_cache) as taken:
            assert not taken  # a live build holds it
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    lock = empty_cache / f"{native.module_name()}.lock"
    assert lock.exists()  # what the killed build left
    started = time.monotonic()
    with native.build_lock(empty_cache) as taken:
        assert taken
    assert time.monotonic() - started < 1


def test_without_a_compiler_the_reason_names_it_and_the_fix(empty_cache, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setattr(native, "find", lambda: None)
    why = native.missing()
    assert not why.can_build
    assert "'no-such-compiler' is not on PATH" in why.what
    assert native.BUILD_COMMAND in why.fix
    assert native.start_background_build() is False


def test_a_module_built_for_another_torch_is_named_in_the_reason(empty_cache, monkeypatch):
    monkeypatch.setattr(native, "find", lambda: None)
    monkeypatch.setattr(native, "PACKAGE_DIR", empty_cache)
    empty_cache.mkdir(parents=True)
    suffix = native.importlib.machinery.EXTENSION_SUFFIXES[0]
    (empty_cache / f"{native.MODULE_PREFIX}2_12_0_cu130{suffix}").touch()
    assert "built for torch 2.12.0+cu130" in native.missing().what


def test_a_failed_build_is_recorded_and_not_retried_on_its_own(empty_cache, monkeypatch):
    monkeypatch.setenv(native.BACKGROUND_BUILD_VARIABLE, "1")
    monkeypatch.setattr(native, "find", lambda: None)
    monkeypatch.setattr(native, "missing_tools", lambda: [])

    def compiler_error(into):
        raise RuntimeError("error: stale_outputs.cpp:3: no member named ...")

    monkeypatch.setattr(native, "build", compiler_error)
    with pytest.raises(RuntimeError):
        native.build_into_cache()
    why = native.missing()
    assert "its build failed" in why.what and not why.can_build
    assert native.start_background_build() is False


def test_without_the_module_a_process_copies_kept_outputs_and_says_so_once(
    package_without_the_module, empty_cache
):
    """The path that needs no compiled module, in a fresh process: an output kept past its
    step keeps its values (torch >= 2.13 swaps storages), one warning says why and the fix,
    and nothing is built."""
    if not hasattr(torch.UntypedStorage, "_swap_data_ptr_"):
        pytest.skip("torch < 2.13 has no storage swap to copy with")
    if TORCH_HAS_ITS_OWN_BINDING:
        pytest.skip("this torch (a CUDA build) makes kept outputs raise without the module")
    code = """
        import logging, torch
        logging.basicConfig(format="%(message)s")
        import inductor_xpugraph
        inductor_xpugraph.enable("cpu")
        f = torch.compile(lambda x: (x * 2).sin(), mode="reduce-overhead")
        kept = [f(torch.full((4,), float(i))) for i in range(5)]
        for i, out in enumerate(kept):
            torch.testing.assert_close(out, (torch.full((4,), float(i)) * 2).sin())
        print("handovers", inductor_xpugraph.stats()["handovers"])
    """
    site = package_without_the_module
    done = run_python(["-c", textwrap.dedent(code)], {"PYTHONPATH": str(site)}, cwd=site)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "no compiled module" in line]
    assert len(warnings) == 1, done.stderr
    assert "outputs kept past their step are copied out" in warnings[0]
    assert native.BUILD_COMMAND in warnings[0]
    assert int(done.stdout.split()[-1]) > 0
    assert not empty_cache.exists()


@pytest.mark.slow
def test_doctor_without_module_compiler_or_live_lock_answers_in_seconds_failing_only_the_compiler(
    package_without_the_module, empty_cache, tmp_path
):
    """The first run of a user without a compiler whose earlier build was killed: the doctor
    says so in a WARN line and probes the emulator, building nothing and waiting on nothing;
    its one FAIL is the compiler the emulator's kernels need."""
    empty_cache.mkdir(parents=True)
    (empty_cache / f"{native.module_name()}.lock").write_text("12345\n")  # a dead build's
    bin_without_compilers = tmp_path / "bin"
    bin_without_compilers.mkdir()
    env = {
        "PYTHONPATH": str(package_without_the_module),
        "PATH": str(bin_without_compilers),
        "CXX": "c++",
        native.BACKGROUND_BUILD_VARIABLE: "1",
    }
    started = time.monotonic()
    doctor = ["-m", "inductor_xpugraph", "doctor", "--device", "cpu"]
    done = run_python(doctor, env, cwd=package_without_the_module)
    elapsed = time.monotonic() - started
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1 and "C++ compiler (cpu)" in failed[0], done.stdout + done.stderr
    assert done.returncode == 1, done.stdout + done.stderr
    stale = next(line for line in done.stdout.splitlines() if "stale-output" in line)
    if TORCH_HAS_ITS_OWN_BINDING and hasattr(torch.UntypedStorage, "_swap_data_ptr_"):
        assert stale.startswith("OK") and "torch's own binding" in stale, stale  # no module needed
    else:
        assert "WARN" in stale and "a C++ compiler" in stale, stale
    assert elapsed < 60, f"doctor took {elapsed:.0f} s"
    assert list(empty_cache.iterdir()) == [empty_cache / f"{native.module_name()}.lock"]
