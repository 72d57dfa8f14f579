"""The ``fast`` parts: the chapters' modules on PyTorch's fused kernels.

``Parts("fast")`` (``--parts fast`` on the command line) takes every chapter from
here; ``Parts.reference().with_chapter(3, "fast")`` only chapter 3. Each
``chNN_*.py`` exports the same names as the reference (``solutions/``) and builds on
it: a class is the reference's subclass that overrides only the computation it makes
faster (``forward``), so its constructor arguments, argument checks, submodule names
and state-dict keys are the reference's by construction, and a checkpoint trained with
one set of parts loads into the other; a function hands inputs it does not handle
(shapes that do not fit, a query with no key) to the reference, which raises the
reference's errors. ``tests/library/test_fast_parts.py`` checks in float64 that every part
computes what the reference computes.

What is faster, and where:

- chapter 2: PyTorch's softmax (zeros for a query whose keys are all masked, as
  the reference gives);
- chapter 3: one packed projection for self-attention (``q_proj``, ``k_proj`` and
  ``v_proj`` concatenated at forward time, one matrix product instead of three;
  ``k_proj`` and ``v_proj`` packed for cross-attention), the mask turned into an
  additive bias once per mask rather than once per layer, PyTorch's softmax (its
  formula below 16 keys, where PyTorch's CPU kernel is slow), and
  ``F.scaled_dot_product_attention`` where it is faster (see
  :mod:`~annotated_transformer.fast_parts.ch03_multi_head`);
- chapter 5: ``F.layer_norm``, and no dropout call where dropout is off;
- chapter 6: ``F.cross_entropy`` with ``label_smoothing``; and ``model_loss``, which
  ``Model.loss`` calls: the generator inside the loss, in chunks of rows that stay in
  cache (``_projected_loss``), and, for an encoder-decoder of the fast parts in
  training, every position-wise operation on the positions that count only, packed
  without their padding (``_packed``);
- every dropout (chapters 1, 3 and 5): on a CPU, a random mask drawn four elements per
  64-bit draw instead of one Bernoulli draw per element (``_ops.dropout``): the same
  distribution to within ``2**-17`` at a fraction of the cost (PyTorch's dropout is a
  fifth of a small model's step).

Chapters 4 and 7 have nothing worth fusing: their files re-export the reference, as
chapter 1 does for all but the dropout of ``PositionalEncoding``.
The reference parts stay the readable ones the book teaches.
"""
