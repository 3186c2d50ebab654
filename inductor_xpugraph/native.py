"""The package's compiled module: built when the package is installed, found at run time,
never waited for.

It holds three calls into torch's core that torch's Python API lacks outside CUDA builds
(``csrc/stale_outputs.cpp``; ``trees.invalidation`` says what they are for). A compiled
module fits the torch release it was built against, so its name carries that release:
``_stale_outputs_torch_2_13_0_cpu``. It is looked for in two places, in this order:

1. **The package's directory.** ``setup.py`` builds it there when the package is installed
   (``pip install --no-build-isolation``), against the torch of the environment it is
   installed into: the convention of torchvision, torchao and xformers (docs/design.md says
   why). Without torch, a compiler or headers at install time, the package installs
   without it.
2. **This environment's build cache**, ``~/.cache/inductor_xpugraph/native/<environment>/``
   (``$INDUCTOR_XPUGRAPH_CACHE_DIR``, else ``$XDG_CACHE_HOME``, name the root). The
   environment is named by the directory torch is installed in, so two virtual environments
   on one torch release never share, replace or wait on each other's build.

When neither holds one, ``load()`` returns None at once and the runtime takes the path that
needs no compiled module; ``missing()`` says, in one line, what is missing, what that costs
and how to fix it. If a compiler and the headers are there, ``start_background_build()``
builds one into the cache in a detached child process (this file, run as a script), for the
processes that start after it: no caller ever waits on a build, and a process never changes
its path half way. ``python -m inductor_xpugraph build`` builds in the foreground.

One build at a time per environment and torch: the builder holds an OS lock (``fcntl`` /
``msvcrt``) on ``<module>.lock``, which the kernel releases when the builder dies, so a build
killed half way stalls nobody; a process that finds the lock held starts nothing. A finished
build is moved into place in one rename, so a half-written module is never loaded. A failed
build leaves ``<module>.failed`` with its error, and no process retries it on its own.

This module imports only the standard library at its top (torch inside functions):
``setup.py`` loads it by path, without importing the package, and runs it as the builder.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

log = logging.getLogger("inductor_xpugraph")

PACKAGE_DIR = Path(__file__).resolve().parent
SOURCE = PACKAGE_DIR / "csrc" / "stale_outputs.cpp"
MODULE_PREFIX = "_stale_outputs_torch_"
# "0": never build in the background (the doctor's probe; a user who builds by hand).
BACKGROUND_BUILD_VARIABLE = "INDUCTOR_XPUGRAPH_BACKGROUND_BUILD"
BUILD_COMMAND = "python -m inductor_xpugraph build"


def torch_build() -> dict[str, str | None]:
    """The installed torch's ``version.py`` (``__version__``, and ``cuda`` / ``xpu``: the
    toolkit it was built for, or None), read without importing torch, which takes seconds."""
    text = (torch_directory() / "version.py").read_text()
    fields = re.findall(r"^(\w+)(?:\s*:[^=]*)?\s*=\s*(?:'([^']*)'|\"([^\"]*)\"|None)", text, re.M)
    return {name: single or double or None for name, single, double in fields}


def torch_version() -> str:
    """The installed torch's version: ``setup.py`` and the builder name the module before,
    or without, importing torch."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.__version__
    version = torch_build().get("__version__")
    if not version:
        raise RuntimeError(f"cannot read torch's version in {torch_directory()}")
    return version


def torch_directory() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("torch is not installed")
    return Path(spec.origin).resolve().parent


def module_name(version: str | None = None) -> str:
    """The compiled module's name for a torch release: "2.13.0+cpu" ->
    ``_stale_outputs_torch_2_13_0_cpu``."""
    return MODULE_PREFIX + re.sub(r"\W", "_", version or torch_version())


def environment_cache() -> Path:
    """Where builds for this environment go: one directory per torch installation."""
    root = os.environ.get("INDUCTOR_XPUGRAPH_CACHE_DIR")
    if not root:
        try:
            home_cache = os.path.join(Path.home(), ".cache")
        except RuntimeError:  # no home directory (some containers)
            home_cache = os.path.join(tempfile.gettempdir(), f"cache-{os.getuid()}")
        base = os.environ.get("XDG_CACHE_HOME") or home_cache
        root = os.path.join(base, "inductor_xpugraph")
    torch_dir = str(torch_directory())
    key = hashlib.sha256(torch_dir.encode()).hexdigest()[:16]
    return Path(root) / "native" / key


def _module_file(directory: Path, name: str) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = directory / (name + suffix)
        if candidate.is_file():
            return candidate
    return None


def find() -> Path | None:
    """The compiled module for this torch: the package's own, else this environment's build."""
    name = module_name()
    return _module_file(PACKAGE_DIR, name) or _module_file(environment_cache(), name)


def built_for_other_releases() -> list[str]:
    """The torch releases of the compiled modules in the package's directory, as torch spells
    them ("2.14.1+cu130" from ``_stale_outputs_torch_2_14_1_cu130``)."""
    tags = set()
    for path in PACKAGE_DIR.glob(MODULE_PREFIX + "*"):
        if any(path.name.endswith(suffix) for suffix in importlib.machinery.EXTENSION_SUFFIXES):
            tags.add(path.name[len(MODULE_PREFIX) :].split(".")[0])
    tags.discard(module_name()[len(MODULE_PREFIX) :])
    releases = []
    for tag in sorted(tags):
        parts = tag.split("_")
        local = "_".join(parts[3:])
        releases.append(".".join(parts[:3]) + (f"+{local}" if local else ""))
    return releases


@functools.cache
def load() -> ModuleType | None:
    """The compiled module, imported; None at once when there is none for this torch (never
    builds, never waits)."""
    path = find()
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location(module_name(), path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as error:  # e.g. a module built by hand against another torch
        log.warning(
            "inductor_xpugraph: the compiled module %s does not load (%s); running without "
            "it. Remove it and run `%s`.",
            path,
            error,
            BUILD_COMMAND,
        )
        return None
    return module


# -- what is missing, and how to fix it ------------------------------------------------------


def missing_tools() -> list[str]:
    """What a build needs and this machine lacks: a C++ compiler, torch's C++ headers,
    Python's headers (the module is a Python extension)."""
    lacking = []
    compiler = os.environ.get("CXX") or ("cl" if sys.platform == "win32" else "c++")
    if shutil.which(compiler) is None:
        lacking.append(f"a C++ compiler ({compiler!r} is not on PATH)")
    try:
        headers = torch_directory() / "include" / "torch" / "extension.h"
    except ModuleNotFoundError:
        return [*lacking, "torch"]
    if not headers.is_file():
        lacking.append(f"torch's C++ headers ({headers} is missing)")
    python_headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not python_headers.is_file():
        lacking.append(f"Python's headers ({python_headers} is missing; python3-dev)")
    return lacking


@dataclass(frozen=True)
class Missing:
    """Why this process runs without the compiled module: ``what`` is missing, ``fix`` says
    what to do; ``can_build``: a build here would have what it needs."""

    what: str
    fix: str
    can_build: bool

    def line(self, cost: str) -> str:
        return f"inductor_xpugraph: {self.what}; {cost}. {self.fix}"


def missing() -> Missing | None:
    """Why there is no compiled module for this torch, or None when there is one."""
    if find() is not None:
        return None
    version = torch_version()
    others = built_for_other_releases()
    if others:
        what = (
            f"no compiled module for torch {version} (the package's was built for torch "
            f"{', '.join(others)})"
        )
    else:
        what = f"no compiled module for torch {version} (the package was installed without it)"
    failed = failure_record()
    lacking = missing_tools()
    if lacking:
        return Missing(
            f"{what}, and this machine lacks {', '.join(lacking)}",
            f"Install {' and '.join(lacking)}, then run `{BUILD_COMMAND}` (or reinstall "
            "the package with `pip install --no-build-isolation`).",
            can_build=False,
        )
    if failed is not None:
        return Missing(
            f"{what}; its build failed (see {failed})",
            f"Run `{BUILD_COMMAND}` to see why and build it again.",
            can_build=False,
        )
    return Missing(
        what,
        f"Run `{BUILD_COMMAND}` (under a minute), or reinstall the package with "
        "`pip install --no-build-isolation` after torch.",
        can_build=True,
    )


# -- building --------------------------------------------------------------------------------


def extension(qualified_name: str | None = None, source: str | None = None):
    """The setuptools ``Extension`` of the compiled module (``setup.py``'s, and the builder's).
    ``qualified_name``: where it goes, by default the package's directory; ``source``: the
    C++ file's path as the caller names it (``setup.py`` must give one relative to itself)."""
    from torch.utils.cpp_extension import CppExtension

    name = qualified_name or f"inductor_xpugraph.{module_name()}"
    return CppExtension(name, [source or str(SOURCE)], extra_compile_args=["-O2", "-g0"])


def build(into: Path) -> Path:
    """Compile the module for this torch into ``into`` (created) and return its path; the
    compiler's output goes to this process's. The module appears in one rename, so nobody
    loads it half written. Raises on failure."""
    from setuptools import Distribution
    from torch.utils.cpp_extension import BuildExtension

    name = module_name()
    into.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="build-", dir=into) as scratch:
        distribution = Distribution(
            {
                "name": "inductor_xpugraph_native",
                "ext_modules": [extension(name)],
                "cmdclass": {"build_ext": BuildExtension},
                "script_name": "setup.py",
                "script_args": ["build_ext", "--build-lib", scratch, "--build-temp", scratch],
            }
        )
        distribution.parse_command_line()
        distribution.run_commands()
        built = _module_file(Path(scratch), name)
        if built is None:
            raise RuntimeError(f"the build of {name} produced no module in {scratch}")
        target = into / built.name
        os.replace(built, target)
    return target


@contextlib.contextmanager
def build_lock(directory: Path) -> Iterator[bool]:
    """Hold this environment's build lock for this torch, if nobody holds it: yields whether
    it was taken. An OS lock: released by the kernel when its holder dies."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{module_name()}.lock"
    with open(path, "a+") as lock_file:
        try:
            _lock(lock_file)
        except OSError:
            yield False
            return
        try:
            lock_file.seek(0)
            lock_file.truncate()
            lock_file.write(f"{os.getpid()}\n")
            lock_file.flush()
            yield True
        finally:
            _unlock(lock_file)


if sys.platform == "win32":
    import msvcrt

    def _lock(lock_file) -> None:
        lock_file.seek(0)
        msvcrt.locking(lock_file.fileno(), msvcrt.LK_NBLCK, 1)

    def _unlock(lock_file) -> None:
        lock_file.seek(0)
        msvcrt.locking(lock_file.fileno(), msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _lock(lock_file) -> None:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _unlock(lock_file) -> None:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)


def failure_record() -> Path | None:
    """The record a failed build of this environment left, if any."""
    path = environment_cache() / f"{module_name()}.failed"
    return path if path.is_file() else None


def build_into_cache() -> Path | None:
    """Build into this environment's cache under its lock. None when another process holds
    the lock (it is building); raises (and records the failure) when the build fails."""
    cache = environment_cache()
    with build_lock(cache) as taken:
        if not taken:
            return None
        existing = _module_file(cache, module_name())
        if existing is not None:
            return existing
        started = time.monotonic()
        failed = cache / f"{module_name()}.failed"
        try:
            path = build(cache)
        except BaseException as error:
            failed.write_text(f"{type(error).__name__}: {error}\n")
            raise
        with contextlib.suppress(FileNotFoundError):
            failed.unlink()
        log.info("inductor_xpugraph: built %s in %.0f s", path, time.monotonic() - started)
        return path


# The background builder runs this file as ``__main__`` (not ``python file.py``, which would
# put the package's directory first on ``sys.path``).
_BUILDER = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"


def background_builds_allowed() -> bool:
    return os.environ.get(BACKGROUND_BUILD_VARIABLE, "1").strip().lower() not in (
        "0",
        "false",
        "no",
        "off",
    )


def start_background_build() -> bool:
    """Start building this torch's module into the cache in a detached child process (it
    outlives this one), unless builds here are switched off, lack a tool, failed before, or
    one is under way. Returns whether one was started; never waits."""
    why = missing()
    if why is None or not why.can_build or not background_builds_allowed():
        return False
    cache = environment_cache()
    try:
        with build_lock(cache) as free:
            if not free:
                return False
        with open(cache / f"{module_name()}.log", "w") as output:
            subprocess.Popen(
                [sys.executable, "-c", _BUILDER, str(Path(__file__).resolve())],
                cwd=cache,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, BACKGROUND_BUILD_VARIABLE: "0"},
            )
    except OSError as error:  # a cache directory this user cannot write, ...
        log.info("inductor_xpugraph: no background build of the compiled module: %s", error)
        return False
    return True


if __name__ == "__main__":  # the background builder (``start_background_build``)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        result = build_into_cache()
    except Exception as error:  # recorded in <module>.failed by build_into_cache
        print(f"build failed: {error}", file=sys.stderr)
        sys.exit(1)
    print(result or "another process holds the build lock; nothing built")
