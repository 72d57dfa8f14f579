"""The interactive figures' data and HTML (the browser checks: tests/repository/test_book.py in the
web book, tests/repository/test_jupyterlab.py in JupyterLab and Notebook 7)."""

from __future__ import annotations

import json
import re
import sys
import types

import pytest
import torch

from annotated_transformer.inspect_attention import AttentionMaps
from annotated_transformer.interactive import (
    PLOTLY_MIME,
    attention_figure,
    learning_rate_figure,
    positional_encoding_figure,
)


def fake_maps(layers: int = 2, heads: int = 3) -> AttentionMaps:
    torch.manual_seed(0)
    source, output = ["^", "ein", "</s>", "$"], ["^", "a", "a"]

    def weights(queries, keys):
        return [torch.softmax(torch.randn(heads, queries, keys), -1) for _ in range(layers)]

    return AttentionMaps(source, output, "a a", encoder=weights(4, 4), decoder=weights(3, 3),
                         cross=weights(3, 4))


def spec_of(html: str) -> dict:
    return json.loads(re.search(r"var spec = (.*);\n", html).group(1).replace("<\\/", "</"))


def test_the_slider_shows_one_layer_and_head_of_every_kind():
    figure = attention_figure(fake_maps(layers=2, heads=3), name="demo")
    spec = spec_of(figure.to_html())
    names = [trace["name"] for trace in spec["data"]]
    steps = spec["layout"]["sliders"][0]["steps"]
    assert [step["label"] for step in steps] == [f"L{l} H{h}" for l in (1, 2) for h in (1, 2, 3)]
    for step in steps:
        layer, head = step["label"][1:].split(" H")
        shown = [name for name, visible in zip(names, step["args"][0]["visible"], strict=True)
                 if visible]
        assert shown == [f"{kind}, layer {layer}, head {head}" for kind in
                         ("encoder self-attention", "decoder self-attention", "cross-attention")]
    first = [trace.get("visible") for trace in spec["data"]]
    assert first == steps[0]["args"][0]["visible"], "the figure opens on its first step"


def test_each_cell_names_its_query_key_and_weight():
    maps = fake_maps()
    spec = spec_of(attention_figure(maps).to_html())
    cross = next(t for t in spec["data"] if t["name"] == "cross-attention, layer 2, head 3")
    assert cross["text"][2][1] == "a → ein"
    assert cross["z"][2][1] == pytest.approx(maps.cross[1][2, 2, 1].item(), abs=1e-4)
    assert "%{text}" in cross["hovertemplate"] and "%{z:.3f}" in cross["hovertemplate"]


def test_the_html_block_is_stable_and_carries_no_library():
    first = attention_figure(fake_maps(), name="demo").to_html()
    assert first == attention_figure(fake_maps(), name="demo").to_html()
    assert 'id="interactive-demo"' in first
    assert first.count("</script>") == 1, "a token '</s>' must not close the script"
    assert "cdn" not in first.lower() and "<script src" not in first


def test_positional_encoding_and_learning_rate_hover():
    table = torch.randn(5, 4)
    heat = spec_of(positional_encoding_figure(table).to_html())["data"][0]
    assert heat["z"][3][2] == pytest.approx(table[3, 2].item(), abs=1e-4)
    assert all(f"%{{{key}" in heat["hovertemplate"] for key in ("x", "y", "z"))
    lines = spec_of(learning_rate_figure({"a": ([1, 2], [0.1, 0.2])}).to_html())["data"]
    assert lines[0]["x"] == [1, 2] and lines[0]["y"] == [0.1, 0.2]


@pytest.mark.parametrize("call, message", [
    (lambda: positional_encoding_figure(torch.zeros(3)), "positions, d_model"),
    (lambda: learning_rate_figure({}), "at least one curve"),
    (lambda: learning_rate_figure({"a": ([1, 2], [0.1])}), "2 steps but 1 rates"),
    (lambda: attention_figure(AttentionMaps([], [], "")), "no attention weights"),
    (lambda: attention_figure(fake_maps(), name="Bad name"), "lower-case"),
])
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_jupyterlab_and_vs_code_get_plotly_s_own_output_and_the_book_its_block():
    figure = attention_figure(fake_maps(), name="demo")
    bundle = figure._repr_mimebundle_()
    assert bundle["text/html"] == figure.to_html(), "the web book keeps its block"
    drawn = bundle[PLOTLY_MIME]  # what plotly's JupyterLab renderer draws
    assert drawn["data"] == json.loads(json.dumps(spec_of(figure.to_html())["data"]))
    assert drawn["layout"]["sliders"] and drawn["config"]["displaylogo"] is False
    json.dumps(bundle)  # a notebook stores it as JSON


def test_colab_gets_plotly_s_html_that_loads_plotly_js(monkeypatch):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    bundle = attention_figure(fake_maps(), name="demo")._repr_mimebundle_()
    assert set(bundle) == {"text/html"}, "Colab draws HTML only"
    page = bundle["text/html"]
    assert 'src="https://cdn.plot.ly/' in page and "Plotly.newPlot" in page
    assert 'id="interactive-demo"' in page


def test_token_labels_are_text_not_markup():
    """plotly reads tick labels as HTML: the end-of-sentence token ``</s>`` would be a
    closing tag, drawn as nothing, unless it is escaped."""
    spec = spec_of(attention_figure(fake_maps(), name="demo").to_html())
    labels = spec["layout"]["xaxis"]["ticktext"]
    assert "&lt;/s&gt;" in labels and "</s>" not in labels
