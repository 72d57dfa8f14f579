"""Section 6: the goals, each met, not met, or not measured (and why)."""

from __future__ import annotations

NO_GPU = "not measured (no GPU)"


def goals(report: dict) -> dict:
    """The goals, checked against this run's figures: ``{name: {"value", "shown", "met",
    "note"}}`` with ``met`` None where this run did not measure the goal (``note`` says
    why). The first are the GPU issue's table; the last the earlier CPU goals."""
    t = report["throughput"]
    on_cpu = report["environment"]["device"].startswith("cpu")
    cuda = report.get("cuda")

    def ratio(shape: str, name: str, entry: dict | None = None) -> float | None:
        stats = (entry or t.get(shape, {})).get("contenders", {}).get(name)
        return stats["ratio_to_torch"] if stats else None

    def goal(value, threshold, shown, note=None, at_most=False) -> dict:
        met = None if value is None else value <= threshold if at_most else value >= threshold
        return {"value": value, "shown": "-" if value is None else shown.format(value),
                "met": met, "note": note if value is None else None}

    cpu_note = None if on_cpu else "not measured (this run was on a GPU)"
    copy = report.get("copy_task", {}).get("default", {})
    seconds = [e["median_seconds"] for e in copy.values() if e["median_seconds"] is not None]
    fast = [r for r in (ratio("copy", "fast"), ratio("copy", "fast+compile")) if r]
    dates = cuda and [d["seconds"] for d in cuda["dates"].values() if d["exact_match"] == 1.0]
    result = {
        "train_compile_every_task": {
            "value": None, "shown": "-", "met": None,
            "note": "checked by tests/library/test_compile.py (CPU) and "
                    "tests/library/test_cuda.py (GPU)"},
        "copy_task_100%_within_5s_cpu": goal(min(seconds) if seconds and on_cpu else None,
                                             5.0, "{:.1f} s", cpu_note, at_most=True),
        "fast_at_least_2x_copy_cpu": goal(max(fast) if fast and on_cpu else None, 2.0,
                                          "{:.2f}x", cpu_note),
        "reference_compiled_at_least_1x_cpu": goal(
            ratio("copy", "reference+compile") if on_cpu else None, 1.0, "{:.2f}x",
            cpu_note or "not measured (no compiled reference in this run)"),
        "reference_compiled_at_least_1x_gpu": goal(
            cuda and ratio("paper", "reference+compile", cuda), 1.0, "{:.2f}x", NO_GPU),
        "fast_compiled_bf16_mfu_at_least_40%_gpu": goal(
            cuda and cuda["contenders"].get("fast+compile", {}).get("mfu"), 0.40, "{:.0%}",
            NO_GPU),
        "dates_recipe_within_10s_gpu": goal(
            min(dates) if dates else None, 10.0, "{:.1f} s",
            "not measured (no run reached 100%)" if cuda else NO_GPU, at_most=True),
    }
    result["fast_multi30k_cpu_at_least_1.3x"] = goal(
        ratio("multi30k-cpu", "fast") if on_cpu else None, 1.3, "{:.2f}x",
        cpu_note or "not measured (no multi30k-cpu shape in this run)")
    decoding = report.get("decoding")
    result["beam4_test2016_within_20s_cpu"] = goal(
        decoding["cached"]["seconds"] if decoding and on_cpu else None, 20.0, "{:.1f} s",
        cpu_note or "not measured (no --decoding CHECKPOINT)", at_most=True)
    earlier = {"fast_copy_at_least_1.3x": (ratio("copy", "fast"), 1.3, "{:.2f}x"),
               "fast_medium_at_least_1.05x": (ratio("medium", "fast"), 1.05, "{:.2f}x"),
               "fast_base_at_least_1.05x": (ratio("base", "fast"), 1.05, "{:.2f}x"),
               "reference_at_least_0.95x": (
                   min((ratio(s, "reference") or 0.0) for s in t) if t else None, 0.95,
                   "{:.2f}x"),
               "fast_base_utilisation_at_least_65%": (
                   t.get("base", {}).get("contenders", {}).get("fast", {}).get("utilisation"),
                   0.65, "{:.0%}")}
    for name, (value, threshold, shown) in earlier.items():
        result[name] = goal(value, threshold, shown, "not measured")
    median = copy.get("solutions", {}).get("median_seconds")
    result["copy_default_recipe_100%_within_20s"] = goal(median, 20.0, "{:.1f} s",
                                                         "not measured", at_most=True)
    for name, measured in (("copy_task_100%_within_5s_cpu", on_cpu and copy),
                           ("copy_default_recipe_100%_within_20s", "solutions" in copy)):
        if measured and result[name]["value"] is None:  # a seed never reached 100%
            result[name].update(met=False, note=None)
    return result


def verdict(goal: dict) -> str:
    return {True: "met", False: "not met"}.get(goal["met"], goal["note"] or "not measured")

