"""The report as Markdown tables (what the book's performance page shows), and the
machine it was measured on."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from annotated_transformer.bench.contenders import CONTENDERS
from annotated_transformer.bench.goals import NO_GPU, verdict
from annotated_transformer.bench.shapes import PAPER, PAPER_TOKENS


def environment(device: torch.device, threads: int, command: str) -> dict:
    """The machine, the versions and the command line of a run."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"torch": torch.__version__, "python": platform.python_version(), "cpu": cpu,
            "cpu_count": os.cpu_count(), "threads": threads, "device": str(device),
            "command": command}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def markdown(report: dict) -> str:
    """The figures as Markdown tables (what the book's performance page shows)."""
    env = report["environment"]
    out = [f"Measured by `{env['command']}` on {env['cpu']} ({env['cpu_count']} cores, "
           f"{env['threads']} threads), torch {env['torch']}, {report['rounds']} rounds, "
           f"{report['seconds'] / 60:.1f} minutes"
           + (f", {env['gpu']}" if env.get("gpu") else "") + ".", "",
           f"Matmul ceiling (fp32): **{report['ceiling']['gflops']:.0f} GFLOP/s** "
           f"(n = {report['ceiling']['size']}).", "",
           "| shape | contender | target tokens/s | range | vs nn.Transformer "
           "| utilisation | ms/step |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    labels = {"reference": "reference parts", "fast": "fast parts", "torch": "nn.Transformer",
              "solutions": "reference parts"}
    labels.update({f"{name}+compile": f"{label}, compiled" for name, label in labels.items()})
    for shape, entry in report["throughput"].items():
        for name, s in entry["contenders"].items():
            ratio = f"{s['ratio_to_torch']:.2f}x" if s["ratio_to_torch"] else "-"
            out.append(f"| {shape} | {labels.get(name, name)} | {s['median']:,.0f} | "
                       f"{s['min']:,.0f}-{s['max']:,.0f} | {ratio} | {s['utilisation']:.0%} | "
                       f"{s['step_ms']:.1f} |")
    out += ["", "| L | reference (Exercise 2.2) | fast parts, explicit | "
            "F.scaled_dot_product_attention |", "| ---: | ---: | ---: | ---: |"]
    for length, entry in report["attention"].items():
        out.append(f"| {length} | " + " | ".join(
            f"{entry[name]['median']:.2f} ms ({entry[name]['ratio_to_fused']:.2f}x)"
            for name in ("reference", "fast_explicit", "fused")) + " |")
    copy = report["copy_task"]
    out += ["", f"| copy task ({copy['held_out']} held-out sequences) | seeds | training "
            "seconds to 100% | steps | exact match reached |", "| --- | --- | ---: | ---: | ---: |"]
    for name, entry in copy["default"].items():
        runs = entry["runs"]
        seconds = ", ".join(f"{r['reached']['seconds']:.1f}" if r["reached"] else "-"
                            for r in runs)
        median = entry["median_seconds"]
        seconds += (f" (median {median:.1f})" if median is not None
                    else " (not every seed reached 100%)")
        steps = ", ".join(str(r["reached"]["step"]) if r["reached"] else "-" for r in runs)
        reached = ", ".join(f"{r['final_exact_match']:.1%}" for r in runs)
        out.append(f"| default recipe, {labels.get(name, name + ' parts')} | {len(runs)} | "
                   f"{seconds} | {steps} | {reached} |")
    at = copy["annotated_transformer"]
    out.append("| Annotated Transformer's recipe, nn.Transformer | 1 | "
               + (f"{at['reached']['seconds']:.1f}" if at["reached"] else
                  f"- ({at['seconds']:.1f} s trained)")
               + f" | {at['final_step']} | {at['final_exact_match']:.1%} |")
    out += [""] + gpu_lines(report.get("cuda"), labels)
    out += ["", "| goal | this run | |", "| --- | ---: | --- |"]
    for name, goal in report["goals"].items():
        shown = verdict(goal) if goal["met"] is not None else goal["note"] or "not measured"
        if goal["met"] is False:
            shown = "**not met**"
        out.append(f"| {name.replace('_', ' ')} | {goal['shown']} | {shown} |")
    return "\n".join(out) + "\n"


def gpu_lines(cuda: dict | None, labels: dict[str, str]) -> list[str]:
    """The GPU section as Markdown: the paper-scale step and the dates recipe."""
    title = (f"GPU, the paper's scale: the base model with a {PAPER.vocab:,}-token "
             f"vocabulary, about {PAPER_TOKENS:,} target tokens a step, bf16 autocast")
    if not cuda:
        return [f"{title}: {NO_GPU}.", "",
                "| contender | target tokens/s | vs nn.Transformer | model-FLOPs utilisation |",
                "| --- | ---: | ---: | ---: |"] + [
                    f"| {labels[name]}{compiled} | {NO_GPU} | - | - |"
                    for compiled in ("", ", compiled") for name in CONTENDERS]
    out = [f"{title} ({cuda['tokens_per_step']:,} in this run); {cuda['ceiling']['dtype']} "
           f"matmul "
           f"{cuda['ceiling']['gflops'] / 1000:,.0f} TFLOP/s:", "",
           "| contender | target tokens/s | vs nn.Transformer | model-FLOPs utilisation |",
           "| --- | ---: | ---: | ---: |"]
    for name, s in cuda["contenders"].items():
        ratio = f"{s['ratio_to_torch']:.2f}x" if s["ratio_to_torch"] else "-"
        out.append(f"| {labels.get(name, name)} | {s['median']:,.0f} | {ratio} | "
                   f"{s['mfu']:.0%} |")
    out += ["", "| dates recipe, fast parts, bf16 | seconds | held-out exact match |",
            "| --- | ---: | ---: |"]
    for name, d in cuda["dates"].items():
        out.append(f"| {name} | {d['seconds']:.1f} | {d['exact_match']:.1%} of "
                   f"{d['held_out']} |")
    return out

