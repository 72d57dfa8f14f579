"""The report as one figure of four panels."""

from __future__ import annotations

from pathlib import Path

from annotated_transformer.bench.contenders import CONTENDERS


def plot(report: dict, path: Path) -> None:
    """One figure: throughput ratios, utilisation, attention alone, the copy task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    colours = {"reference": "tab:blue", "fast": "tab:orange", "torch": "tab:gray"}
    labels = {"reference": "reference parts", "fast": "fast parts", "torch": "nn.Transformer"}
    shapes = list(report["throughput"])
    width = 0.8 / len(CONTENDERS)
    ax = axes[0, 0]
    for i, name in enumerate(CONTENDERS):
        stats = [report["throughput"][s]["contenders"][name] for s in shapes]
        base = [report["throughput"][s]["contenders"]["torch"]["median"] for s in shapes]
        values = [st["median"] / b for st, b in zip(stats, base, strict=True)]
        low = [v - st["min"] / b for v, st, b in zip(values, stats, base, strict=True)]
        high = [st["max"] / b - v for v, st, b in zip(values, stats, base, strict=True)]
        xs = [j + (i - 1) * width for j in range(len(shapes))]
        ax.bar(xs, values, width, yerr=[low, high], capsize=3, color=colours[name],
               label=labels[name])
        for x, v in zip(xs, values, strict=True):
            ax.text(x, v + 0.03, f"{v:.2f}", ha="center", fontsize=8)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(shapes)), shapes)
    ax.set_ylabel("training tokens/s relative to nn.Transformer")
    ax.set_title("Training throughput (median; bars: range over rounds)")
    ax.legend(fontsize=8)
    ax = axes[0, 1]
    for i, name in enumerate(CONTENDERS):
        values = [100 * report["throughput"][s]["contenders"][name]["utilisation"]
                  for s in shapes]
        xs = [j + (i - 1) * width for j in range(len(shapes))]
        ax.bar(xs, values, width, color=colours[name], label=labels[name])
        for x, v in zip(xs, values, strict=True):
            ax.text(x, v + 0.5, f"{v:.0f}", ha="center", fontsize=8)
    ax.set_xticks(range(len(shapes)), shapes)
    ax.set_ylabel("% of the measured fp32 matmul rate")
    ax.set_title(f"Utilisation (ceiling {report['ceiling']['gflops']:.0f} GFLOP/s)")
    ax = axes[1, 0]
    lengths = [int(n) for n in report["attention"]]
    for name, colour in (("reference", "tab:blue"), ("fast_explicit", "tab:orange"),
                         ("fused", "tab:green")):
        ax.plot(lengths, [report["attention"][str(n)][name]["median"] for n in lengths], "o-",
                color=colour, label={"fused": "F.scaled_dot_product_attention",
                                     "fast_explicit": "fast parts, explicit",
                                     "reference": "reference (Exercise 2.2)"}[name])
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_yscale("log")
    ax.set_xlabel("sequence length L")
    ax.set_ylabel("ms, forward + backward")
    ax.set_title("Attention alone (B=8, H=8, d_k=64)")
    ax.legend(fontsize=8)
    ax = axes[1, 1]
    copy = report["copy_task"]
    for parts_name, entry in copy["default"].items():
        for k, run in enumerate(entry["runs"]):
            ax.plot([0] + [p["seconds"] for p in run["curve"]],
                    [0] + [100 * p["exact_match"] for p in run["curve"]], "o-", ms=3,
                    color=colours["fast" if parts_name == "fast" else "reference"],
                    label=(f"default recipe, {labels.get(parts_name, 'reference parts')}, "
                           f"{len(entry['runs'])} seeds") if k == 0 else None)
    at = copy["annotated_transformer"]
    ax.plot([0] + [p["seconds"] for p in at["curve"]],
            [0] + [100 * p["exact_match"] for p in at["curve"]], "s--", ms=3,
            color=colours["torch"], label="Annotated Transformer's recipe, nn.Transformer")
    ax.axvline(20, color="black", lw=0.8, ls=":")
    ax.set_ylim(0, 102)
    ax.set_xlabel("training seconds (evaluation not counted)")
    ax.set_ylabel(f"% exact match, {copy['held_out']} held-out sequences")
    ax.set_title("The copy task")
    ax.legend(fontsize=8)
    env = report["environment"]
    fig.suptitle(f"{env['cpu']}, {env['threads']} threads, torch {env['torch']}"
                 + (f", {env['gpu']}" if env.get("gpu") else ""), fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)

