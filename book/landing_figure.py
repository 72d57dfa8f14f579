"""Draw the landing page's figure: the cross-attention of a Transformer trained to reverse.

    python book/landing_figure.py     # writes book/images/attention_map.png (about a minute)
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from annotated_transformer.data.copy import BOS, EOS, PAD, CopyTask  # noqa: E402
from annotated_transformer.plots import heatmap, use_course_style  # noqa: E402
from annotated_transformer.train import TrainConfig, train_copy_task  # noqa: E402

OUT = Path(__file__).resolve().parent / "images" / "attention_map.png"


def main() -> None:
    torch.set_num_threads(1)
    task = CopyTask(reverse=True)
    model, history = train_copy_task(config=TrainConfig(seed=0), task=task, log=None)
    print(f"held-out exact match: {history.exact_match[-1]:.1%}")
    src = torch.tensor([[3 + i for i in range(9)] + [EOS]])  # the symbols a b c ... i, EOS
    model.eval()
    with torch.no_grad():
        out = model.parts.greedy_decode(model, src, (src != PAD)[:, None, None], 12, BOS, EOS,
                                        PAD)
        model(src, out, (src != PAD)[:, None, None],
              torch.ones(out.size(1), out.size(1), dtype=torch.bool).tril())
    weights = model.decoder_layers[-1].cross_attn.attention_weights[0].mean(0)  # [Lt, Ls]
    names = {BOS: "BOS", EOS: "EOS", PAD: "PAD"}
    label = [names.get(t, "abcdefghijklmnopqrstuvwxyz"[t - 3]) for t in range(13)]
    use_course_style()
    fig, ax = plt.subplots(figsize=(5.6, 4.6))
    heatmap(ax, weights, "Cross-attention of a trained Transformer, reversing a b c ... i",
            xlabel="source token (key)", ylabel="decoder input (query)", cmap="viridis",
            symmetric=False, xticklabels=[label[t] for t in src[0].tolist()],
            yticklabels=[label[t] for t in out[0].tolist()])
    ax.title.set_fontsize(9)
    fig.tight_layout()
    OUT.parent.mkdir(exist_ok=True)
    fig.savefig(OUT)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
