"""The SYCL-rules API of ``inductor_xpugraph.sycl_rules.sycl``, over Intel's real SYCL runtime.

Drives real ``sycl_ext_oneapi_graph`` graphs on the OpenCL CPU device, so that the pure-Python
stand-in can be checked against the runtime it models
(tests/sycl_rules/test_sycl_rules_differential.py).
dpctl provides queues, USM memory and an OpenCL C kernel; ``shim.cpp`` (built here with g++ on
first use) provides the graph API and every call whose SYCL exception text dpctl would lose.

Run as a script, in a Python that has the pinned packages, it executes scenarios of
``scenarios.py`` and prints one JSON object, ``{"outcomes": {name: observations}}``, where a
scenario that failed outside SYCL's rules gives ``{"harness_error": traceback}``; or ``{"skip":
reason}`` where this machine cannot run it::

    python tests/sycl_rules/sycl_cpu/real_runtime.py [scenario_name ...]

It imports neither torch nor inductor_xpugraph: the Python with the SYCL packages need not
have them.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

# shim.cpp calls libsycl by mangled name and relies on this release's object layouts.
PINNED = {"intel-sycl-rt": "2026.2.0", "intel-opencl-rt": "2026.2.0", "dpctl": "0.22.1"}
PIP_INSTALL = "pip install " + " ".join(f"{name}=={version}" for name, version in PINNED.items())

SHIM_SOURCE = Path(__file__).with_name("shim.cpp")
COMPILE = ["g++", "-O1", "-shared", "-fPIC", "-std=c++17"]

# The OpenCL C kernel behind Counter.increment: one work item per element.
KERNEL_SOURCE = "__kernel void increment(__global int* data) { data[get_global_id(0)] += 1; }"
COUNTER_ELEMENTS = 16


class SyclError(RuntimeError):
    """A ``sycl::exception``; ``str()`` is exactly its ``what()``."""


class Unavailable(Exception):
    """This machine cannot run the real runtime; the message says what is missing."""


# ----------------------------------------------------------------------------- set-up


def _installed_library(distribution: str, name: str) -> Path:
    """The absolute path of a file the wheel ``distribution`` installed (libraries go to
    ``<prefix>/lib``, outside site-packages)."""
    for file in importlib.metadata.files(distribution) or ():
        if file.name == name:
            return Path(file.locate()).resolve()
    raise Unavailable(f"{distribution} installed no {name}")


def check_packages() -> None:
    """Raises Unavailable unless the pinned packages are installed in this Python."""
    for name, version in PINNED.items():
        try:
            found = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            raise Unavailable(
                f"{name} is not installed in {sys.executable}: {PIP_INSTALL}"
            ) from None
        if found != version:
            raise Unavailable(
                f"{name} {found} is installed; the shim is written for {version}: {PIP_INSTALL}"
            )


def configure_process_environment() -> None:
    """Environment the SYCL stack reads when it starts: call before importing dpctl.

    OCL_ICD_FILENAMES: the OpenCL CPU runtime of intel-opencl-rt (the ``.icd`` file of its wheel
    names a placeholder path). DPCTL_VERBOSITY: dpctl prints the text of a failed kernel
    submission only from level "warning" on; Queue.submit reads it back.
    """
    driver = str(_installed_library("intel-opencl-rt", "libintelocl.so"))
    listed = os.environ.get("OCL_ICD_FILENAMES", "")
    if driver not in listed.split(":"):
        os.environ["OCL_ICD_FILENAMES"] = f"{driver}:{listed}" if listed else driver
    os.environ["DPCTL_VERBOSITY"] = "warning"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "inductor_xpugraph" / "sycl_cpu"


def build_shim() -> Path:
    """The compiled shim, built once per source and compiler command into the cache."""
    source = SHIM_SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join(COMPILE).encode()).hexdigest()[:16]
    library = cache_dir() / key / "libshim.so"
    if library.exists():
        return library
    if shutil.which("g++") is None:
        raise Unavailable(
            "g++ is not installed (needed to build tests/sycl_rules/sycl_cpu/shim.cpp)"
        )
    library.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: concurrent builds never load a half-written file.
    fd, partial = tempfile.mkstemp(dir=library.parent, suffix=".so")
    os.close(fd)
    try:
        result = subprocess.run(
            [*COMPILE, str(SHIM_SOURCE), "-o", partial, "-ldl"], capture_output=True, text=True
        )
        if result.returncode != 0:
            raise RuntimeError(f"building {SHIM_SOURCE.name} failed:\n{result.stderr}")
        os.chmod(partial, 0o755)
        os.replace(partial, library)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return library


def _load_shim(path: Path) -> ctypes.CDLL:
    shim = ctypes.CDLL(str(path))
    handle, out = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
    signatures = {
        "shim_init": [ctypes.c_char_p],
        "shim_graph_new": [handle, out],
        "shim_graph_begin_recording": [handle, handle],
        "shim_graph_end_recording": [handle, handle],
        "shim_graph_finalize": [handle, out],
        "shim_queue_submit_graph": [handle, handle, out],
        "shim_queue_submit_barrier": [handle, ctypes.POINTER(handle), ctypes.c_size_t, out],
        "shim_queue_wait": [handle],
        "shim_queue_state": [handle, ctypes.POINTER(ctypes.c_int)],
        "shim_event_wait": [handle],
        "shim_event_status": [handle, ctypes.POINTER(ctypes.c_int)],
        "shim_device_wait": [handle],
    }
    for name, argtypes in signatures.items():
        function = getattr(shim, name)
        function.argtypes, function.restype = argtypes, ctypes.c_int
    shim.shim_handle_destroy.argtypes, shim.shim_handle_destroy.restype = [handle], None
    shim.shim_error.argtypes, shim.shim_error.restype = [], ctypes.c_char_p
    if shim.shim_init(str(_installed_library("intel-sycl-rt", "libsycl.so.9")).encode()):
        raise Unavailable(f"the shim cannot bind libsycl: {shim.shim_error().decode()}")
    return shim


# ----------------------------------------------------------------------------- the API


class Runtime:
    """``rt`` of the shared API: queues, counters and graphs on the OpenCL CPU device."""

    def __init__(self):
        check_packages()
        configure_process_environment()
        import dpctl
        import dpctl.memory
        import dpctl.program

        self._dpctl = dpctl
        self._shim = _load_shim(build_shim())
        # Every queue is made from this device and shares its default context, where the
        # counters' memory and the kernel live.
        try:
            self._home = self.new_queue()
        except dpctl.SyclQueueCreationError as error:
            raise Unavailable(f"no OpenCL CPU device: {error}") from error
        program = dpctl.program.create_program_from_source(self._home._queue, KERNEL_SOURCE)
        self._kernel = program.get_sycl_kernel("increment")

    def _call(self, name: str, *args) -> None:
        """Calls a shim function; raises SyclError with SYCL's text when it threw."""
        status = getattr(self._shim, name)(*args)
        if status == 1:
            raise SyclError(self._shim.shim_error().decode())
        if status != 0:
            raise RuntimeError(f"{name}: {self._shim.shim_error().decode()}")

    def _adopt_event(self, handle: ctypes.c_void_p) -> Event:
        """Wraps a sycl::event made by the shim in a dpctl event (dpctl copies it)."""
        capsule = _capsule_new(handle, _EVENT_CAPSULE_NAME, None)
        event = self._dpctl.SyclEvent(capsule)
        self._shim.shim_handle_destroy(handle)
        return Event(self, event)

    def new_queue(self) -> Queue:
        return Queue(self, self._dpctl.SyclQueue("opencl:cpu", property="in_order"))

    def new_counter(self) -> Counter:
        return Counter(self)

    def new_graph(self, queue: Queue) -> Graph:
        handle = ctypes.c_void_p()
        self._call("shim_graph_new", queue._ref, ctypes.byref(handle))
        return Graph(self, handle)

    def device_wait(self) -> None:
        device = self._home._queue.sycl_device
        self._call("shim_device_wait", ctypes.c_void_p(device.addressof_ref()))


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_new.restype = ctypes.py_object
_EVENT_CAPSULE_NAME = b"SyclEventRef"  # the name dpctl.SyclEvent accepts


class Kernel:
    """A kernel with its arguments bound: what Queue.submit launches."""

    def __init__(self, sycl_kernel, arguments: list, global_range: list[int]):
        self.sycl_kernel, self.arguments, self.global_range = sycl_kernel, arguments, global_range


class Counter:
    """16 int32 in USM shared memory; ``increment`` adds 1 to each."""

    def __init__(self, rt: Runtime):
        memory = rt._dpctl.memory.MemoryUSMShared(4 * COUNTER_ELEMENTS, queue=rt._home._queue)
        self.memory = memory
        self._elements = memoryview(memory).cast("B").cast("i")
        for index in range(COUNTER_ELEMENTS):
            self._elements[index] = 0
        self.increment = Kernel(rt._kernel, [memory], [COUNTER_ELEMENTS])

    @property
    def value(self) -> int:
        """Element 0, read from the host without waiting on anything."""
        return self._elements[0]


class Event:
    """What a submission returns: a dpctl event (a copy of the sycl::event)."""

    def __init__(self, rt: Runtime, sycl_event):
        self._rt, self._event = rt, sycl_event

    @property
    def _ref(self) -> ctypes.c_void_p:
        return ctypes.c_void_p(self._event.addressof_ref())

    def wait(self) -> None:
        self._rt._call("shim_event_wait", self._ref)

    @property
    def complete(self) -> bool:
        status = ctypes.c_int()
        self._rt._call("shim_event_status", self._ref, ctypes.byref(status))
        return status.value == 0  # info::event_command_status::complete


class Queue:
    """An in-order queue."""

    def __init__(self, rt: Runtime, sycl_queue):
        self._rt, self._queue = rt, sycl_queue

    @property
    def _ref(self) -> ctypes.c_void_p:
        return ctypes.c_void_p(self._queue.addressof_ref())

    def submit(self, kernel: Kernel, depends_on=()) -> Event:
        dpctl = self._rt._dpctl
        with _stderr_captured() as stderr:
            try:
                event = self._queue.submit_async(
                    kernel.sycl_kernel,
                    kernel.arguments,
                    kernel.global_range,
                    dEvents=[dependency._event for dependency in depends_on],
                )
            except dpctl.SyclKernelSubmitError:
                event = None
        message, rest = _split_submission_error(stderr.text)
        if rest:
            sys.stderr.write(rest)
        if event is not None:
            return Event(self._rt, event)
        if message is None:
            raise RuntimeError(f"dpctl's submission failed without a SYCL message: {rest!r}")
        raise SyclError(message)

    def memcpy(self, target: Counter, source: Counter, depends_on=()) -> Event:
        """``queue::memcpy``: the source counter's elements into the target's (no wait)."""
        event = self._queue.memcpy_async(
            target.memory,
            source.memory,
            4 * COUNTER_ELEMENTS,
            dEvents=[dependency._event for dependency in depends_on],
        )
        return Event(self._rt, event)

    def submit_barrier(self, events=()) -> Event:
        """``ext_oneapi_submit_barrier(events)``; with no events, the overload without a list
        (a barrier after everything submitted before)."""
        handles = (ctypes.c_void_p * len(events))(*(event._ref for event in events))
        result = ctypes.c_void_p()
        self._rt._call(
            "shim_queue_submit_barrier", self._ref, handles, len(events), ctypes.byref(result)
        )
        return self._rt._adopt_event(result)

    def submit_graph(self, exec_graph: ExecGraph) -> Event:
        result = ctypes.c_void_p()
        self._rt._call(
            "shim_queue_submit_graph", self._ref, exec_graph._handle, ctypes.byref(result)
        )
        return self._rt._adopt_event(result)

    def wait(self) -> None:
        self._rt._call("shim_queue_wait", self._ref)

    @property
    def state(self) -> str:
        state = ctypes.c_int()
        self._rt._call("shim_queue_state", self._ref, ctypes.byref(state))
        return ("executing", "recording")[state.value]


class Graph:
    """A modifiable command_graph. Its handle lives until ``release()`` (never collected)."""

    def __init__(self, rt: Runtime, handle: ctypes.c_void_p):
        self._rt, self._handle = rt, handle

    def _live(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise RuntimeError("this graph handle was released")
        return self._handle

    def begin_recording(self, queue: Queue) -> None:
        self._rt._call("shim_graph_begin_recording", self._live(), queue._ref)

    def end_recording(self, queue: Queue | None = None) -> None:
        target = None if queue is None else queue._ref
        self._rt._call("shim_graph_end_recording", self._live(), target)

    def finalize(self) -> ExecGraph:
        handle = ctypes.c_void_p()
        self._rt._call("shim_graph_finalize", self._live(), ctypes.byref(handle))
        return ExecGraph(self._rt, handle)

    def release(self) -> None:
        """Destroys this handle (the graph itself goes with its last handle)."""
        self._rt._shim.shim_handle_destroy(self._live())
        self._handle = None


class ExecGraph:
    """An executable command_graph. Its handle lives until ``release()`` (never collected)."""

    def __init__(self, rt: Runtime, handle: ctypes.c_void_p):
        self._rt, self._handle = rt, handle

    def release(self) -> None:
        """Destroys this handle: the executable graph goes with its last handle."""
        if self._handle is None:
            raise RuntimeError("this executable graph handle was released")
        self._rt._shim.shim_handle_destroy(self._handle)
        self._handle = None


class _Captured:
    text = ""


@contextlib.contextmanager
def _stderr_captured():
    """Collects what native code writes to fd 2 in the block (dpctl writes its errors there)."""
    captured = _Captured()
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured.text = sink.read().decode(errors="replace")


# What dpctl prints (DPCTL_VERBOSITY=warning) when a kernel submission throws:
# "[ERR] <what()> in DPCTLQueue_SubmitRange at <its source file>:<line>".
_DPCTL_ERROR = re.compile(r"\[ERR\] (.*?) in DPCTLQueue_SubmitRange at [^\n]*\n?", re.DOTALL)


def _split_submission_error(stderr: str) -> tuple[str | None, str]:
    """SYCL's text of a failed kernel submission (None if there is none), and the rest."""
    found = _DPCTL_ERROR.search(stderr)
    if found is None:
        return None, stderr
    return found.group(1), stderr[: found.start()] + stderr[found.end() :]


# ----------------------------------------------------------------------------- the runner


def run_scenarios(names: list[str]) -> dict:
    """Runs the named scenarios (all when empty), in order, on one Runtime."""
    sys.path.insert(0, str(Path(__file__).parent))
    import scenarios

    known = scenarios.all_scenarios()
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise SystemExit(f"unknown scenarios: {', '.join(unknown)}")
    try:
        rt = Runtime()
    except Unavailable as missing:
        return {"skip": str(missing)}
    outcomes = {}
    for name, scenario in known.items():
        if names and name not in names:
            continue
        try:
            outcomes[name] = scenario(rt)
        except Exception:
            outcomes[name] = {"harness_error": traceback.format_exc()}
    return {"outcomes": outcomes}


def main(argv: list[str]) -> int:
    # The result is stdout's last line: native code may print before it.
    print(json.dumps(run_scenarios(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
