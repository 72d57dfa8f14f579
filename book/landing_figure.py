"""Draw the landing page's figure: the cross-attention of a Transformer trained to reverse.

    python book/landing_figure.py            # writes book/images/attention_map.png (under a minute)
    python book/landing_figure.py FILE.png   # writes FILE.png instead
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from annotated_transformer.data.copy import BOS, EOS, PAD, CopyTask  # noqa: E402
from annotated_transformer.plots import heatmap, use_course_style  # noqa: E402
from annotated_transformer.train import TrainConfig, train_copy_task  # noqa: E402

OUT = Path(__file__).resolve().parent / "images" / "attention_map.png"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=Path, default=OUT,
                        help=f"the image to write (default: {OUT})")
    out: Path = parser.parse_args(argv).out
    torch.set_num_threads(1)
    task = CopyTask(reverse=True)
    model, history = train_copy_task(config=TrainConfig(seed=0), task=task, log=None)
    print(f"held-out exact match: {history.exact_match[-1]:.1%}")
    src = torch.tensor([[3 + i for i in range(9)] + [EOS]])  # the symbols a b c ... i, EOS
    model.eval()
    output = model.generate(src, max_len=12)  # [1, Lt], BOS first
    sources, queries, attention = model.read_attention(src, output)
    weights = attention["cross"][-1].mean(0)  # the last layer's heads averaged: [Lt, Ls]
    names = {BOS: "BOS", EOS: "EOS", PAD: "PAD"}
    label = [names.get(t, "abcdefghijklmnopqrstuvwxyz"[t - 3]) for t in range(13)]
    use_course_style()
    fig, ax = plt.subplots(figsize=(5.6, 4.6))
    heatmap(ax, weights, "Cross-attention of a trained Transformer, reversing a b c ... i",
            xlabel="source token (key)", ylabel="decoder input (query)", cmap="viridis",
            symmetric=False, xticklabels=[label[t] for t in sources],
            yticklabels=[label[t] for t in queries])
    ax.title.set_fontsize(9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
