"""Tasks, generated offline and deterministically from a seed: nothing is downloaded."""

from annotated_transformer.data.copy import BOS, EOS, PAD, CopyTask

__all__ = ["BOS", "EOS", "PAD", "CopyTask"]
