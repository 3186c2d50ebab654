"""``benchmarks/zoo.py`` end to end on the CPU emulator (``--device cpu``): the smoke model
``mlp`` in inference and training with eager and ours, each in its own process;
the model list; shards and their merge (``--summarize``); a process past its timeout; and the
summary's arithmetic on rows with known times."""

import contextlib
import io
import json
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO_ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import zoo  # noqa: E402
import zoo_measure  # noqa: E402
import zoo_models  # noqa: E402
import zoo_report  # noqa: E402

SMOKE_IMPLS = ("eager", "ours")  # Inductor's default mode differs from ours by one argument


def run_zoo(*argv: str) -> str:
    """``zoo.py --device cpu`` with ``argv`` in this process (each row still runs in a process
    of its own); what it printed."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        zoo.main(["--device", "cpu", *argv])
    return printed.getvalue()


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One run of the zoo on ``mlp``: (the JSON it wrote, the Markdown it printed)."""
    directory = tmp_path_factory.mktemp("zoo")
    out, markdown = directory / "smoke.json", directory / "smoke.md"
    printed = run_zoo(
        "--suite", "smoke", "--models", "^mlp$", "--impls", ",".join(SMOKE_IMPLS),
        "--jobs", "2", "--calls", "4", "--timed-calls", "3", "--repeats", "1",
        "--out", str(out), "--markdown", str(markdown),
    )  # fmt: skip
    assert markdown.read_text().strip() == printed.strip()
    return json.loads(out.read_text()), printed


@pytest.mark.slow
def test_the_smoke_run_has_one_row_per_mode_and_implementation(smoke):
    data, _ = smoke
    keys = sorted((r["model"], r["mode"], r["impl"]) for r in data["rows"])
    expected = sorted(("mlp", mode, impl) for mode in zoo.MODES for impl in SMOKE_IMPLS)
    assert keys == expected


@pytest.mark.slow
def test_every_smoke_row_matches_eager_within_the_tolerance(smoke):
    data, _ = smoke
    for row in data["rows"]:
        assert row["status"] == "pass", row
        assert row["error_score"] <= 1, row
        assert row["tolerance"] == zoo_measure.TOLERANCE["fp32"][row["mode"]], row
        assert row["reference"] == "float64", row
        assert row["calls_checked"] == 4 and len(row["first_calls_s"]) == 3, row


@pytest.mark.slow
def test_ours_replays_a_graph_per_call_forward_and_backward(smoke):
    data, _ = smoke
    ours = {r["mode"]: r for r in data["rows"] if r["impl"] == "ours"}
    assert ours["inference"]["graph_launches_per_call"] == 1, ours["inference"]
    assert ours["training"]["graph_launches_per_call"] == 2, ours["training"]  # fwd + bwd
    for row in ours.values():
        assert "emulator" in row["graph_launches_counted_by"]
        assert row["graphs"]["fallbacks"] == 0 and row["graphs"]["replays"] > 0, row


@pytest.mark.slow
def test_the_summary_has_every_field_per_mode_and_implementation(smoke):
    data, _ = smoke
    summary = {(e["mode"], e["impl"]): e for e in data["summary"]}
    assert sorted(summary) == sorted((m, i) for m in zoo.MODES for i in SMOKE_IMPLS)
    for (mode, impl), entry in summary.items():
        assert (entry["models"], entry["passed"], entry["pass_rate"]) == (1, 1, 1.0)
        assert entry["speedup_pipelined"] > 0 and entry["speedup_synchronized"] > 0
        if impl != "eager":  # against upstream: none on the CPU, the fields are there
            for key in ("time_vs_upstream_pipelined", "compile_vs_upstream_median"):
                assert key in entry and entry[key] is None
            assert entry["peak_above_upstream_2mib"] == 0
    assert summary[("inference", "ours")]["replaying"] == 1


@pytest.mark.slow
def test_the_markdown_names_the_device_torch_and_commit_and_says_cpu_timings_mean_nothing(smoke):
    data, markdown = smoke
    meta = data["meta"]
    assert meta["device"] == "cpu" and meta["commit"]
    first = markdown.splitlines()[0]
    assert first.startswith("## Zoo — cpu (emulator), torch ") and meta["torch"] in first
    assert "timings mean nothing" in markdown
    assert "| mlp |" in markdown and "### Summary" in markdown


def test_list_names_at_least_40_models_across_the_three_suites(capsys):
    zoo.main(["--list"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == f"{len(lines) - 1} models" and len(lines) - 1 >= 40
    suites = [line.split()[1] for line in lines[:-1]]
    for suite in ("hf", "timm", "torchvision"):
        assert suites.count(suite) >= 10, suites
    assert "smoke" not in suites  # the smoke models only with --suite smoke
    assert sum("heavy" in line for line in lines) == len(zoo_models.HEAVY)


def test_the_default_run_has_at_least_40_models_without_the_heavy_ones():
    default = zoo.select_models(["hf", "timm", "torchvision"], None, (1, 1))
    assert len(default) >= 40 and not set(default) & set(zoo_models.HEAVY)
    assert "tv_densenet121" in zoo.select_models(["torchvision"], "densenet", (1, 1))


def test_shards_split_the_models_without_overlap():
    every = zoo.select_models(["hf", "timm", "torchvision"], None, (1, 1))
    halves = [zoo.select_models(["hf", "timm", "torchvision"], None, (k, 2)) for k in (1, 2)]
    assert not set(halves[0]) & set(halves[1])
    assert sorted(halves[0] + halves[1]) == sorted(every)
    assert abs(len(halves[0]) - len(halves[1])) <= 1


def _shard_file(path, smoke_data, mode, shard):
    rows = [r for r in smoke_data["rows"] if r["mode"] == mode]
    meta = {**smoke_data["meta"], "shard": shard}
    path.write_text(json.dumps({"meta": meta, "rows": rows, "summary": []}))
    return str(path)


@pytest.mark.slow
def test_summarize_merges_two_shards_into_one_summary(smoke, tmp_path, capsys):
    data, _ = smoke
    first = _shard_file(tmp_path / "a.json", data, "inference", "1/2")
    second = _shard_file(tmp_path / "b.json", data, "training", "2/2")
    zoo.main(["--summarize", first, second, "--out", str(tmp_path / "merged.json")])
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert len(merged["rows"]) == len(data["rows"])
    assert merged["summary"] == data["summary"]
    assert [s["shard"] for s in merged["meta"]["shards"]] == ["1/2", "2/2"]
    printed = capsys.readouterr().out
    assert "shard 1/2" in printed and "shard 2/2" in printed


def test_summarize_keeps_the_later_file_s_row_of_a_model_run_twice(tmp_path, capsys):
    row = {"model": "mlp", "mode": "inference", "impl": "eager", "status": "timeout"}
    again = {**row, "status": "pass", "pipelined_ms": 1.0, "synchronized_ms": 2.0}
    paths = []
    for name, rows in (("a.json", [row]), ("b.json", [again])):
        (tmp_path / name).write_text(json.dumps({"meta": {"device": "cpu"}, "rows": rows}))
        paths.append(str(tmp_path / name))
    zoo.main(["--summarize", *paths, "--out", str(tmp_path / "merged.json")])
    assert json.loads((tmp_path / "merged.json").read_text())["rows"] == [again]


def test_the_summary_divides_eager_by_each_time_and_each_ratio_by_upstream():
    def row(impl, pipelined, synchronized, compile_s, allocated, status="pass"):
        return {
            "model": "m", "mode": "inference", "impl": impl, "status": status,
            "pipelined_ms": pipelined, "synchronized_ms": synchronized, "compile_s": compile_s,
            "peak_allocated_mib": allocated, "peak_reserved_mib": 2 * allocated,
            "graph_launches_per_call": 1 if impl in zoo_report.GRAPHED else None,
        }  # fmt: skip

    rows = [row("eager", 8.0, 12.0, 0.5, 10.0), row("upstream", 2.0, 4.0, 10.0, 20.0)]
    rows += [row("ours", 1.0, 3.0, 5.0, 23.0), row("ours_owned", 1.0, 3.0, 5.0, 1.0, "fail")]
    summary = {e["impl"]: e for e in zoo_report.summarize(rows)}
    ours = summary["ours"]
    assert ours["speedup_pipelined"] == pytest.approx(8.0)
    assert ours["speedup_synchronized"] == pytest.approx(4.0)
    assert ours["time_vs_upstream_pipelined"] == pytest.approx(0.5)
    assert ours["time_vs_upstream_synchronized"] == pytest.approx(0.75)
    assert ours["compile_vs_upstream_median"] == pytest.approx(0.5)
    assert ours["peak_allocated_vs_upstream"] == pytest.approx(1.15)
    assert ours["peak_reserved_vs_upstream"] == pytest.approx(1.15)
    assert ours["peak_above_upstream_2mib"] == 1 and ours["replaying"] == 1
    owned = summary["ours_owned"]
    assert (owned["passed"], owned["vs_upstream_models"], owned["speedup_pipelined"]) == (
        0,
        0,
        None,
    )


def test_the_summary_gives_the_largest_compile_ratio_beside_the_median():
    def row(model, impl, compile_s):
        return {
            "model": model, "mode": "inference", "impl": impl, "status": "pass",
            "pipelined_ms": 1.0, "synchronized_ms": 1.0, "compile_s": compile_s,
            "peak_allocated_mib": 1.0, "peak_reserved_mib": 1.0, "graph_launches_per_call": 1,
        }  # fmt: skip

    rows = [row(m, "upstream", 10.0) for m in "abc"]
    rows += [row("a", "ours", 9.0), row("b", "ours", 10.0), row("c", "ours", 13.0)]
    ours = next(e for e in zoo_report.summarize(rows) if e["impl"] == "ours")
    assert ours["compile_vs_upstream_median"] == pytest.approx(1.0)
    assert ours["compile_vs_upstream_max"] == pytest.approx(1.3)


def test_a_process_past_its_timeout_is_killed_and_reported(tmp_path):
    out = tmp_path / "timeout.json"
    run_zoo(
        "--suite", "smoke", "--models", "^mlp$", "--impls", "eager", "--modes", "inference",
        "--timeout", "0.2", "--out", str(out),
    )  # fmt: skip
    (row,) = json.loads(out.read_text())["rows"]
    assert row["status"] == "timeout" and "killed after" in row["reason"]


def test_rows_past_the_deadline_are_not_run_and_left_out_of_the_summary(tmp_path):
    out = tmp_path / "deadline.json"
    printed = run_zoo(
        "--suite", "smoke", "--models", "^mlp$", "--impls", "eager", "--deadline", "0",
        "--out", str(out),
    )  # fmt: skip
    data = json.loads(out.read_text())
    assert [r["status"] for r in data["rows"]] == ["not run", "not run"]
    assert data["summary"] == []
    assert "mlp training eager: not run" in printed


def test_resume_keeps_the_finished_rows_and_runs_the_rest(tmp_path):
    out = tmp_path / "resumed.json"
    kept = {"model": "mlp", "mode": "inference", "impl": "eager", "status": "pass"}
    kept.update(pipelined_ms=1.0, synchronized_ms=1.0)
    cut = {"model": "mlp", "mode": "training", "impl": "eager", "status": "not run"}
    out.write_text(json.dumps({"meta": {}, "rows": [kept, cut]}))
    run_zoo(
        "--suite", "smoke", "--models", "^mlp$", "--impls", "eager", "--deadline", "0",
        "--resume", str(out), "--out", str(out),
    )  # fmt: skip
    rows = {r["mode"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["inference"] == kept
    assert rows["training"]["status"] == "not run" and "--deadline" in rows["training"]["reason"]


def test_a_stale_result_fails_where_eager_rounding_passes():
    """Compared as the dashboard does: against float64, allowing for eager's own error."""
    import torch

    torch.manual_seed(0)
    precise, earlier = torch.randn(4, 10, dtype=torch.float64), torch.randn(4, 10)
    eager = precise.float()
    tol = zoo_measure.TOLERANCE["fp32"]["inference"]
    rounded = zoo_measure.compare([eager, eager], [eager, eager], [precise, precise], tol)
    assert rounded["score"] < 1e-3
    stale = zoo_measure.compare([eager, earlier], [eager, eager], [precise, precise], tol)
    assert stale["score"] > 100 and stale["at"] == 1 and stale["error"] > 1


def test_a_gradient_zero_in_exact_arithmetic_is_judged_against_the_others_scale():
    """Rounding noise of a gradient that is 0 in float64 (a bias before a batch norm) is no
    error: it is measured against 1% of the median tensor's RMS, not against its own."""
    import torch

    torch.manual_seed(0)
    grads = [torch.randn(100, dtype=torch.float64) for _ in range(3)]
    zero = torch.zeros(10, dtype=torch.float64)
    eager = [g.float() for g in grads] + [torch.full((10,), 1e-9)]
    noisy = [g.float() for g in grads] + [torch.full((10,), 4e-9)]  # 4× eager's noise
    tol = zoo_measure.TOLERANCE["fp32"]["training"]
    assert zoo_measure.compare(noisy, eager, [*grads, zero], tol)["score"] < 1e-3


def test_every_model_builder_names_a_known_suite_and_package():
    for spec in zoo_models.MODELS.values():
        assert spec.suite in zoo_models.SUITES, spec
        assert spec.requires in (None, "transformers", "timm", "torchvision"), spec


def _state(pid: int) -> str:
    """The process's state letter from /proc (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _becomes(pid: int, wanted, seconds: float = 10.0) -> bool:
    """Whether the process's state satisfies ``wanted`` within ``seconds`` (a signal is
    delivered a moment after it is sent)."""
    deadline = time.monotonic() + seconds
    while not wanted(_state(pid)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states in /proc")
def test_the_process_that_times_pauses_the_others_and_continues_them_after(tmp_path):
    lock = tmp_path / "timing.lock"
    lock.touch()
    groups = zoo.ProcessGroups(str(lock))
    other = groups.start([sys.executable, "-c", "import time; time.sleep(60)"], env={})
    try:
        with zoo_measure.exclusive(str(lock)):
            assert _becomes(other.pid, lambda state: state == "T")
        assert _becomes(other.pid, lambda state: state != "T")
    finally:
        other.kill()
        other.communicate()
        groups.ended(other)


def test_each_row_says_how_long_each_phase_took(smoke):
    rows, _ = smoke
    for row in rows["rows"]:
        assert set(row["phase_s"]) >= {"start", "build", "compile and first calls", "timing"}
        assert all(seconds >= 0 for seconds in row["phase_s"].values())
