"""What the course's maintainers write the course with.

- :mod:`.stubs`: ``exercises/`` generated from ``solutions/`` (each ``# BEGIN SOLUTION``
  block becomes a stub that raises ``NotImplementedError``), and the check that they
  are current (``python -m annotated_transformer stubs --check``).
"""
