"""The zoo's summary and tables, from its rows (``zoo.py`` runs them, ``zoo_measure.py`` says
what a row holds): per (mode, implementation), and per model.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

IMPLS = ("eager", "inductor", "upstream", "ours", "ours_owned")
MODES = ("inference", "training")

GRAPHED = ("upstream", "ours", "ours_owned")
ABOVE_MIB = 2.0  # peak allocated above upstream's by more than this is counted


def geomean(values) -> float | None:
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(rows: list[dict]) -> list[dict[str, Any]]:
    """One entry per (mode, implementation) present in ``rows``."""
    by_key = {(r["model"], r["mode"], r["impl"]): r for r in rows}

    def passed(model, mode, impl):
        row = by_key.get((model, mode, impl))
        return row if row is not None and row["status"] == "pass" else None

    entries = []
    for mode in MODES:
        for impl in IMPLS:
            mine = [r for r in rows if (r["mode"], r["impl"]) == (mode, impl)]
            mine = [r for r in mine if r["status"] not in ("skipped", "not run")]
            if not mine:
                continue
            good = [r for r in mine if r["status"] == "pass"]
            entry: dict[str, Any] = {"mode": mode, "impl": impl, "models": len(mine)}
            entry["passed"], entry["pass_rate"] = len(good), len(good) / len(mine)
            if impl in GRAPHED:
                launches = [r.get("graph_launches_per_call") or 0 for r in good]
                entry["replaying"] = sum(1 for n in launches if n > 0)
            pairs = [(r, passed(r["model"], mode, "eager")) for r in good]
            for timing in ("pipelined", "synchronized"):
                key = f"{timing}_ms"
                entry[f"speedup_{timing}"] = geomean(
                    e[key] / r[key] for r, e in pairs if e and r.get(key) and e.get(key)
                )
            if impl == "upstream":
                entries.append(entry)
                continue
            ups = [(r, u) for r in good if (u := passed(r["model"], mode, "upstream"))]
            entry["vs_upstream_models"] = len(ups)
            for timing in ("pipelined", "synchronized"):
                key = f"{timing}_ms"
                entry[f"time_vs_upstream_{timing}"] = geomean(
                    r[key] / u[key] for r, u in ups if r.get(key) and u.get(key)
                )
            compiles = sorted(r["compile_s"] / u["compile_s"] for r, u in ups if u.get("compile_s"))
            entry["compile_vs_upstream_median"] = statistics.median(compiles) if compiles else None
            entry["compile_vs_upstream_max"] = compiles[-1] if compiles else None
            for kind in ("allocated", "reserved"):
                key = f"peak_{kind}_mib"
                entry[f"peak_{kind}_vs_upstream"] = geomean(
                    r[key] / u[key] for r, u in ups if r.get(key) and u.get(key)
                )
            key = "peak_allocated_mib"
            entry["peak_above_upstream_2mib"] = sum(
                1 for r, u in ups if r.get(key) and u.get(key) and r[key] - u[key] > ABOVE_MIB
            )
            entries.append(entry)
    return entries


def _x(value, spec=".2f", suffix="") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def markdown(meta: dict[str, Any], rows: list[dict]) -> str:
    device = meta.get("device", "?")
    lines = [
        f"## Zoo — {meta.get('device_name', device)}, torch {meta.get('torch')}, "
        f"commit {meta.get('commit', 'unknown')}",
        "",
        f"{meta.get('dtype')}, batch {meta.get('batch')}; {meta.get('calls')} calls checked "
        f"against eager, each with fresh inputs; times in ms per call, the median of "
        f"{meta.get('repeats')} × {meta.get('timed_calls')} calls; {meta.get('jobs')} processes "
        f"at once, one timing at a time.",
    ]
    if device == "cpu":
        lines += [
            "",
            "**CPU: ours runs on the emulator, whose replays re-run the kernels on "
            "the host: these timings mean nothing. No upstream, no memory figures.**",
        ]
    elif device == "xpu":
        lines += ["", "xpu has no upstream trees: ours is compared with eager and Inductor."]
    shards = meta.get("shards") or [{"shard": meta.get("shard"), "wall_s": meta.get("wall_s")}]
    lines.append(
        "Runs: " + ", ".join(f"shard {s.get('shard')} in {s.get('wall_s')} s" for s in shards)
    )
    summary = summarize(rows)
    upstream = any(r["impl"] == "upstream" for r in rows)
    lines += ["", "### Summary", ""]
    header = ["mode", "impl", "pass", "graphs replay", "speedup pipelined", "synchronized"]
    if upstream:
        header += [
            "time / upstream, pipelined", "synchronized", "compile / upstream (median, max)",
            "peak allocated / upstream", "peak reserved / upstream", "> upstream + 2 MiB",
        ]  # fmt: skip
    lines += ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for e in summary:
        cells = [
            e["mode"], e["impl"], f"{e['passed']}/{e['models']}",
            f"{e['replaying']}/{e['passed']}" if "replaying" in e else "-",
            _x(e["speedup_pipelined"], ".2f", "×"), _x(e["speedup_synchronized"], ".2f", "×"),
        ]  # fmt: skip
        if upstream:
            vs = e["impl"] != "upstream" and e.get("vs_upstream_models")
            cells += [
                _x(e.get("time_vs_upstream_pipelined")) if vs else "-",
                _x(e.get("time_vs_upstream_synchronized")) if vs else "-",
                f"{_x(e.get('compile_vs_upstream_median'))}, {_x(e.get('compile_vs_upstream_max'))}"
                if vs
                else "-",
                _x(e.get("peak_allocated_vs_upstream"), ".3f") if vs else "-",
                _x(e.get("peak_reserved_vs_upstream"), ".3f") if vs else "-",
                str(e.get("peak_above_upstream_2mib")) if vs else "-",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    by_key = {(r["model"], r["mode"], r["impl"]): r for r in rows}
    impls = [i for i in IMPLS if any(r["impl"] == i for r in rows)]
    versus = upstream and "ours" in impls
    for mode in MODES:
        models = list(dict.fromkeys(r["model"] for r in rows if r["mode"] == mode))
        if not models:
            continue
        legend = "Cells: speedup over eager, pipelined / synchronized (graph launches per call)."
        if versus:
            legend += (
                " Ours against upstream: synchronized time ratio, compile-time ratio, peak "
                "allocated MiB above upstream's."
            )
        lines += ["", f"### {mode}", "", legend, ""]
        header = ["model", "eager ms", *[i for i in impls if i != "eager"]]
        if versus:
            header += ["ours / upstream", "compile ours / upstream", "peak ours − upstream MiB"]
        lines += ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
        for model in models:
            eager = by_key.get((model, mode, "eager"))
            cells = [model, _eager_cell(eager)]
            for impl in impls:
                if impl != "eager":
                    cells.append(_cell(by_key.get((model, mode, impl)), eager))
            if versus:
                ours = by_key.get((model, mode, "ours"))
                cells += _versus(ours, by_key.get((model, mode, "upstream")))
            lines.append("| " + " | ".join(cells) + " |")
    problems = [r for r in rows if r["status"] not in ("pass", "skipped")]
    if problems:
        lines += ["", "### Not passing", ""]
        for r in problems:
            lines.append(
                f"- {r['model']} {r['mode']} {r['impl']}: {r['status']}: {r.get('reason', '')}"
            )
    skipped = dict(meta.get("skipped_models") or {})
    skipped.update({r["model"]: r.get("reason", "") for r in rows if r["status"] == "skipped"})
    if skipped:
        lines += ["", "### Skipped models", ""]
        lines += [f"- {model}: {why}" for model, why in sorted(skipped.items())]
    return "\n".join(lines)


def _eager_cell(row) -> str:
    if row is None:
        return "-"
    if row["status"] != "pass":
        return row["status"]
    return f"{_x(row.get('pipelined_ms'))} / {_x(row.get('synchronized_ms'))}"


def _cell(row, eager) -> str:
    if row is None:
        return "-"
    if row["status"] != "pass":
        return row["status"]
    if eager is None or eager["status"] != "pass":
        text = f"{_x(row.get('pipelined_ms'))} / {_x(row.get('synchronized_ms'))} ms"
    else:
        speed = [
            eager[f"{t}_ms"] / row[f"{t}_ms"] if row.get(f"{t}_ms") else None
            for t in ("pipelined", "synchronized")
        ]
        text = f"{_x(speed[0], '.2f', '×')} / {_x(speed[1], '.2f', '×')}"
    if row["impl"] in GRAPHED and row.get("graph_launches_per_call") is not None:
        text += f" ({row['graph_launches_per_call']})"
    return text


def _versus(ours, up) -> list[str]:
    if not (ours and up and ours["status"] == up["status"] == "pass"):
        return ["-", "-", "-"]
    time_ratio = ours["synchronized_ms"] / up["synchronized_ms"]
    compile_ratio = ours["compile_s"] / up["compile_s"] if up.get("compile_s") else None
    peak = None
    if ours.get("peak_allocated_mib") is not None and up.get("peak_allocated_mib") is not None:
        peak = ours["peak_allocated_mib"] - up["peak_allocated_mib"]
    return [_x(time_ratio), _x(compile_ratio), _x(peak, "+.1f")]
