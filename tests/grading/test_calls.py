"""Which exercises a probe's code called: the worker's record of the chapter files'
functions entered (``worker.calls``) and the trusted side's reading of it
(``dependencies.Declared.called``), on a chapter module loaded here."""

from __future__ import annotations

import importlib.util
import sys

import torch

from annotated_transformer.course.grading.dependencies import Declared
from annotated_transformer.course.grading.worker.calls import Observed

CHAPTER = '''
import torch
from torch import nn


class Base(nn.Module):  # a base whose forward two parts share
    def forward(self, x):
        return helper(x)


class MyNorm(Base):  # bound to LayerNorm below, as a learner may write it
    pass


class MyResidual(Base):  # bound to ResidualConnection, never called
    pass


def helper(x):
    return x - x.mean(-1, keepdim=True)


def make_feed_forward():
    class Inner(nn.Module):
        def forward(self, x):
            return x * 2
    return Inner


def my_softmax(x):
    return x


LayerNorm = MyNorm
ResidualConnection = MyResidual
PositionwiseFeedForward = make_feed_forward()
softmax = my_softmax
'''
TITLES = {"5.1": "LayerNorm: per-position statistics",
          "5.2": "PositionwiseFeedForward: two layers",
          "5.3": "ResidualConnection: a residual",
          "5.9": "softmax: a function bound by another name"}


def test_a_part_bound_under_its_exercise_s_name_is_that_exercise_s(tmp_path):
    path = tmp_path / "ch05_layers.py"
    path.write_text(CHAPTER)
    spec = importlib.util.spec_from_file_location("_test_calls_ch05_layers", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        with Observed() as seen:
            module.LayerNorm()(torch.ones(2, 3))
            module.PositionwiseFeedForward()(torch.ones(2, 3))
            module.softmax(torch.ones(2))
        names = seen.names()
    finally:
        del sys.modules[spec.name]
    assert "ch05_layers.py:LayerNorm.forward" in names and "ch05_layers.py:Base.forward" in names
    assert "ch05_layers.py:PositionwiseFeedForward.forward" in names, names
    # ResidualConnection shares Base's forward but was never called: never named
    assert Declared(TITLES).called(names) == {"5.1", "5.2", "5.9"}, names


def test_without_the_module_loaded_only_the_names_entered_are_given(tmp_path):
    path = tmp_path / "ch05_layers.py"
    path.write_text(CHAPTER)
    spec = importlib.util.spec_from_file_location("_test_calls_ch05_layers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not in sys.modules: its bindings are not read
    with Observed() as seen:
        module.LayerNorm()(torch.ones(2, 3))
    assert Declared(TITLES).called(seen.names()) == set()
