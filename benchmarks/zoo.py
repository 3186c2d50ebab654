"""The zoo: over 40 Hugging Face, timm and torchvision models, in inference and training, each
compiled by every implementation in a process of its own, checked against eager and timed, as
PyTorch's dashboard does for Inductor (README.md: how to run it, the summary's columns).

Each (model, mode, implementation) runs in a fresh process (``zoo_measure.py`` says what it
measures) with an empty Inductor and Triton cache and its share of the CPU. ``--jobs``
processes run at once, so that compiles overlap; a process times holding a lock on a file,
with the other processes paused (``zoo_measure.exclusive``), so that its times are its own. A
process past ``--timeout`` is killed; past ``--deadline`` no process starts (its row says "not
run", and ``--resume`` runs it later).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
import measure  # noqa: E402
import zoo_measure  # noqa: E402
import zoo_models  # noqa: E402
from measure import REPO_ROOT, default_device, git_commit  # noqa: E402
from zoo_report import IMPLS, MODES, markdown, summarize  # noqa: E402

# Four per device (inductor with --impls on cuda): 360 rows, about 40 minutes on an H100.
DEFAULT_IMPLS = {
    "cuda": ["eager", "upstream", "ours", "ours_owned"],
    "xpu": ["eager", "inductor", "ours", "ours_owned"],
    "cpu": ["eager", "inductor", "ours", "ours_owned"],
}


def select_models(
    suites: list[str], pattern: str | None, shard: tuple[int, int], heavy: bool = False
) -> list[str]:
    """The models of ``suites`` whose name matches ``pattern`` (the heavy ones only with
    ``heavy`` or a pattern), then every N-th from the K-th (``shard`` = (K, N)): the suites
    interleave across shards."""
    every, specs = heavy or pattern is not None, zoo_models.MODELS.items()
    names = [name for name, spec in specs if spec.suite in suites and (every or not spec.heavy)]
    names = [name for name in names if pattern is None or re.search(pattern, name)]
    k, n = shard
    return names[k - 1 :: n]


def parse_shard(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)/(\d+)", text)
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise argparse.ArgumentTypeError(f"--shard wants K/N with 1 <= K <= N, got {text!r}")
    return int(match[1]), int(match[2])


def split_list(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [item for item in items if item not in allowed]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {what} {unknown}; choose from {allowed}")
    return items


class ProcessGroups:
    """The process groups of the running rows, listed in ``<lock>.groups`` for the process
    that times to pause (``zoo_measure.exclusive``). No process starts while one times, and
    every process is continued when any ends: one that died timing continues none."""

    def __init__(self, lock: str) -> None:
        self.lock, self.path = lock, lock + ".groups"
        self.groups: set[int] = set()
        self.guard = threading.Lock()

    def start(self, command: list[str], env: dict[str, str]) -> subprocess.Popen:
        with open(self.lock, "a") as handle, self.guard:
            fcntl.flock(handle, fcntl.LOCK_EX)  # not while a process times
            try:
                env = dict(env, **{zoo_measure.LAUNCHED_AT: repr(time.time())})
                proc = subprocess.Popen(
                    command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    env=env, start_new_session=True,  # its compile workers share its group
                )  # fmt: skip
                self.groups.add(proc.pid)
                self._write()
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return proc

    def ended(self, proc: subprocess.Popen) -> None:
        with self.guard:
            self.groups.discard(proc.pid)
            self._write()
            zoo_measure.signal_groups(sorted(self.groups), signal.SIGCONT)

    def _write(self) -> None:
        with open(self.path + ".new", "w") as f:
            f.write(" ".join(map(str, sorted(self.groups))))
        os.replace(self.path + ".new", self.path)


def run_child(
    job: tuple[str, str, str], args, lock: str, groups: ProcessGroups, timeout: float
) -> dict[str, Any]:
    """One row in a fresh process with an empty compile cache; killed past ``timeout``."""
    model, mode, impl = job
    command = [sys.executable, os.path.abspath(__file__), "--child", model, mode, impl]
    command += ["--device", args.device, "--dtype", args.dtype, "--batch", str(args.batch)]
    command += ["--calls", str(args.calls), "--timed-calls", str(args.timed_calls)]
    command += ["--repeats", str(args.repeats), "--lock", lock]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="zoo_cache_") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
        env["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
        # The CPU shared out between the processes: each one's OpenMP threads and compile
        # workers. (With torch's default of one OpenMP thread per core in every process,
        # building a model on the host took minutes, its threads spinning against the others'.)
        share = str(max(1, os.cpu_count() // args.jobs))
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", share)
        env.setdefault("OMP_NUM_THREADS", share)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
        proc = groups.start(command, env)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            row = {"status": "timeout", "reason": f"killed after {timeout:.0f} s"}
        else:
            lines = stdout.strip().splitlines()
            try:
                row = json.loads(lines[-1])
            except (IndexError, json.JSONDecodeError):
                tail = (stderr.strip().splitlines() or ["(no output)"])[-1]
                row = {"status": "fail", "reason": f"exit {proc.returncode}: {tail[:300]}"}
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # compile workers left behind, if any
        groups.ended(proc)
    row = {"model": model, "mode": mode, "impl": impl, **row}
    row["wall_s"] = round(time.perf_counter() - start, 2)
    return row


def finished_rows(path: str | None) -> dict[tuple, dict]:
    """``--resume``: the rows of an earlier run that need no rerun (all but those a
    ``--deadline`` left out or cut short), by (model, mode, implementation)."""
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        rows = json.load(f)["rows"]
    cut = [r for r in rows if r["status"] == "not run" or "--deadline" in r.get("reason", "")]
    return {(r["model"], r["mode"], r["impl"]): r for r in rows if r not in cut}


def run_zoo(args, models: list[str], impls: list[str], meta: dict[str, Any]) -> list[dict]:
    # Training first (the longer compiles), the implementations of a model side by side.
    modes = sorted(args.modes, key=lambda mode: mode != "training")
    every = [(m, mode, impl) for mode in modes for m in models for impl in impls]
    done = finished_rows(args.resume)
    jobs = [job for job in every if job not in done]
    rows: list[dict] = [done[job] for job in every if job in done]
    written = threading.Lock()
    started = time.perf_counter()
    deadline = None if args.deadline is None else started + args.deadline
    fd, lock = tempfile.mkstemp(prefix="zoo_timing_", suffix=".lock")
    os.close(fd)
    groups = ProcessGroups(lock)

    def one(job):
        timeout = args.timeout
        if deadline is not None:
            left = deadline - time.perf_counter()
            if left <= 0:
                row = {"model": job[0], "mode": job[1], "impl": job[2], "status": "not run"}
                row["reason"] = f"--deadline {args.deadline:.0f} s passed before it started"
                return record(row)
            timeout = min(timeout, left + 30)
        row = run_child(job, args, lock, groups, timeout)
        if row["status"] == "timeout" and timeout < args.timeout:
            row["reason"] += f" (--deadline {args.deadline:.0f} s)"
        return record(row)

    def record(row):
        with written:
            row.setdefault("commit", meta["commit"])
            rows.append(row)
            count = f"[{len(rows)}/{len(every)}, {time.perf_counter() - started:.0f} s]"
            why = f" ({row['reason'][:100]})" if row.get("reason") else ""
            print(
                f"{count} {row['model']} {row['mode']} {row['impl']}: {row['status']}{why}",
                file=sys.stderr, flush=True,
            )  # fmt: skip
            if args.out:  # after every row: a run cut short keeps what it measured
                meta["wall_s"] = round(time.perf_counter() - started, 1)
                write_json(args.out, meta, rows)
        return row

    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            list(pool.map(one, jobs))
    finally:
        for path in (lock, groups.path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    meta["wall_s"] = round(time.perf_counter() - started, 1)
    order = {job: i for i, job in enumerate(every)}
    return sorted(rows, key=lambda r: order[(r["model"], r["mode"], r["impl"])])


def write_json(path: str, meta: dict[str, Any], rows: list[dict]) -> None:
    measure.write_json(path, {"meta": meta, "rows": rows, "summary": summarize(rows)})


def merge(paths: list[str]) -> tuple[dict[str, Any], list[dict]]:
    """The rows of several runs (shards); a row of a later file replaces the same
    (model, mode, implementation) of an earlier one."""
    meta: dict[str, Any] = {}
    by_key: dict[tuple, dict] = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        part = data.get("meta", {})
        if not meta:
            meta = {**part, "shards": []}
        meta["shards"].append({"file": path, **{k: part.get(k) for k in ("shard", "wall_s")}})
        meta["skipped_models"] = meta.get("skipped_models", {}) | part.get("skipped_models", {})
        for row in data["rows"]:
            if part.get("commit"):
                row.setdefault("commit", part["commit"])
            by_key[(row["model"], row["mode"], row["impl"])] = row
    return meta, list(by_key.values())


def emit(args, meta: dict[str, Any], rows: list[dict]) -> None:
    text = markdown(meta, rows)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.out:
        write_json(args.out, meta, rows)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--device", choices=("cuda", "xpu", "cpu"), default=None)
    add("--models", default=None, help="a regular expression on model names")
    add("--suite", default="hf,timm,torchvision", help=f"comma list of {zoo_models.SUITES}")
    add("--modes", default=",".join(MODES))
    add("--impls", default=None, help="comma list; default: DEFAULT_IMPLS of the device")
    add("--list", action="store_true", help="print the models and exit")
    add("--heavy", action="store_true", help="also the models marked heavy")
    add("--dtype", choices=("fp32", "bf16"), default="fp32")
    add("--batch", type=int, default=4)
    add("--calls", type=int, default=6, help="calls checked against eager")
    add("--timed-calls", type=int, default=10, help="calls per timing repeat")
    add("--repeats", type=int, default=3)
    add("--jobs", type=int, default=max(1, min(8, os.cpu_count() or 1)))
    add("--timeout", type=float, default=300.0, help="seconds per process")
    add("--deadline", type=float, default=None, help="start no process after this many s")
    add("--shard", type=parse_shard, default=(1, 1), metavar="K/N")
    add("--out", default=None, help="JSON: meta, rows, summary")
    add("--resume", default=None, metavar="JSON", help="keep its rows; run only the rest")
    add("--markdown", default=None, help="also write the tables here")
    add("--commit", default=None, help="the commit to report (default: this tree's HEAD)")
    add("--summarize", nargs="+", metavar="JSON", help="merge runs, print the summary")
    add("--child", nargs=3, metavar=("MODEL", "MODE", "IMPL"), help=argparse.SUPPRESS)
    add("--lock", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        args.suites = split_list(args.suite, zoo_models.SUITES, "suite")
        args.modes = split_list(args.modes, MODES, "mode")
        if args.impls is not None:
            args.impls = split_list(args.impls, IMPLS, "implementation")
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child:
        import zoo_measure

        args.model, args.mode, args.impl = args.child
        print(json.dumps(zoo_measure.measure(args)))
        return
    if args.summarize:
        meta, rows = merge(args.summarize)
        emit(args, meta, rows)
        return
    if args.list:  # every model, the heavy ones marked
        models = select_models(args.suites, args.models, args.shard, heavy=True)
        for name in models:
            spec = zoo_models.MODELS[name]
            missing = zoo_models.missing_dependency(spec)
            notes = ["heavy: run with --heavy or --models"] if spec.heavy else []
            notes += [f"skipped: {missing}"] if missing else []
            print(f"{name:32} {spec.suite:12} {'; '.join(notes)}".rstrip())
        print(f"{len(models)} models")
        return
    models = select_models(args.suites, args.models, args.shard, args.heavy)
    import torch

    args.device = args.device or default_device()
    impls = args.impls or DEFAULT_IMPLS[args.device]
    if args.device != "cuda" and "upstream" in impls:
        print("upstream: Inductor's CUDA Graph Trees run on cuda only; left out", file=sys.stderr)
        impls = [i for i in impls if i != "upstream"]
    skipped = {}
    for name in models:
        missing = zoo_models.missing_dependency(zoo_models.MODELS[name])
        if missing:
            skipped[name] = missing
    meta = {
        "device": args.device, "torch": torch.__version__, "commit": args.commit or git_commit(),
        "dtype": args.dtype, "batch": args.batch, "calls": args.calls,
        "timed_calls": args.timed_calls, "repeats": args.repeats, "jobs": args.jobs,
        "shard": f"{args.shard[0]}/{args.shard[1]}", "impls": impls, "modes": args.modes,
        "models": [m for m in models if m not in skipped], "skipped_models": skipped,
    }  # fmt: skip
    rows = run_zoo(args, meta["models"], impls, meta)
    names = {r.get("device_name") for r in rows if r.get("device_name")}
    meta["device_name"] = sorted(names)[0] if names else args.device
    emit(args, meta, rows)


if __name__ == "__main__":
    main()
