"""How fast the course's Transformer trains, beside PyTorch's own, measured in one run.

    python -m annotated_transformer bench [--quick] [--json PATH] [--plot PATH] [--rounds N]
        [--max-tokens N] [--shapes copy,medium,base] [--profile] [--recipe-shape [--dataset DIR]]

One module a job:
:mod:`~.shapes` (the sizes trained at and their FLOPs), :mod:`~.contenders` (the three
models and their training step), :mod:`~.timing` (clocks and the matmul ceiling), the
sections :mod:`~.throughput`, :mod:`~.copy_task`, :mod:`~.decoding` (a
translation checkpoint's beam search) and :mod:`~.gpu`, :mod:`~.goals`,
:mod:`~.report` (Markdown), :mod:`~.plot`, :mod:`~.profiling` and :mod:`~.command` (the
options, and every section in order).

What it measures, in this order (the book's performance page shows the latest figures):

1. **The matmul ceiling**: the best fp32 matrix-product rate of this machine (GFLOP/s,
   the best of a few timings of square products of a few sizes), against which
   utilisation is reported.
2. **Training throughput** of three contenders of the same size, post-LN, ReLU, dropout
   0.1, label smoothing 0.1, the same masks, tied embeddings, sinusoidal positions and a
   generator: the model built from the reference parts, the one built from the fast parts
   (:mod:`annotated_transformer.fast_parts`), and ``torch.nn.Transformer`` wrapped in the
   same embeddings and generator. One step is forward, loss, backward, gradient clipping
   and Adam (:func:`~annotated_transformer.train.adam`: the paper's settings, PyTorch's
   fused kernel, the same for all three). The contenders take turns round by round (a
   slow spell of the machine hits all of them), and the figure is target tokens per
   second: median and range over the rounds, and its ratio to ``nn.Transformer``'s
   median. Three shapes:
   the copy task's (``d_model=64``), a middle one (``d_model=256``) and the paper's base
   model (``d_model=512``). At the copy shape every contender also runs under
   ``torch.compile`` (the whole model, its one static shape; ``--quick`` traces with the
   ``eager`` backend only), the reference parts compiled among them.
3. **Attention alone**, forward and backward, ``B=8, H=8, d_k=64``, ``L = 64, 256, 1024``:
   the reference (Exercise 2.2) against ``F.scaled_dot_product_attention``, and the fast
   parts' explicit formula.
4. **The copy task**: the training time until greedy decoding reproduces all of 1,000
   held-out sequences, with the course's default recipe (``recipes.RECIPES["copy"]``),
   three seeds, the reference and the fast parts; beside it the Annotated Transformer's
   recipe on ``nn.Transformer`` (Adam at ``0.5 x`` Noam, warmup 400, batch 80, 400 steps,
   post-LN, two layers, no label smoothing) and the exact match it reaches. Evaluation
   is not counted in the time; sampling the batches is. ``--max-tokens N``: the default
   recipe trains on batches by a token budget of ``N`` instead of 128 sequences.
5. **On a CUDA device** (the rest runs there unchanged), the paper's scale: the base
   model with a 37,000-token vocabulary at about 25,000 target tokens a step
   (``--max-tokens`` changes it) in bf16 autocast, every contender eager and
   ``torch.compile``-d, with its model-FLOPs utilisation against the bf16 matrix-product
   rate measured on the same GPU; and the dates recipe (fast parts, bf16) eager and
   compiled, as ``train`` reports its time. Without a GPU these rows say
   "not measured (no GPU)".
6. **The goals**, one line each: met, not met, or not measured (and why).

``--recipe-shape`` instead measures only the CPU recipe's step (``--model cpu`` on
Multi30k: :mod:`~.recipe_shape`): the fast parts against ``nn.Transformer`` on one thread
and on two, interleaved in one run, on the recipe's real batches and their padding
(:mod:`~.recipe_batches`: the lengths of Multi30k's batches by the recipe's tokens, committed;
``--dataset DIR`` draws them from a corpus), with the ratio, each contender's GFLOP/s
against the matmul ceiling measured with as many threads, the share of each part of a
step, and the machine's load.

``--profile`` instead profiles the copy recipe's training step with ``torch.profiler``
(:func:`~.profiling.profile_step`): the time of each phase and of the busiest operators.

**How FLOPs are counted.** Only matrix products, ``2·m·n·k`` each, as the model's
arithmetic requires them: the projections, the feed-forward layers, the generator, and
both attention products over the full ``Lq x Lk`` square (masked entries included, as
every kernel here computes them). The backward pass counts twice the forward (one product
for the input's gradient, one for the weight's). Softmax, LayerNorm, dropout, the loss
and Adam are not counted. The same count serves all contenders, so utilisation compares
them on the work the model needs, not on the work an implementation chose to do.

``--quick`` runs every section with tiny rounds in under a minute (a smoke test: its
numbers mean nothing). ``--json PATH`` writes every figure; ``--plot PATH`` a PNG.
"""
