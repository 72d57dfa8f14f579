"""Probes of the worker's own tests (tests/grading/test_sandbox.py,
tests/grading/test_sandbox_limits.py, tests/grading/test_boundary.py): in a folder of their
own, the only one of tests/ that those workers are shown."""


def call(impl, name, x):
    """``impl.<name>(x)``: a function of the chapter file under test, called in the worker."""
    return getattr(impl, name)(x)


def grader_modules(impl):
    """The modules of the course's tools that the worker holds, the chapter module under
    test imported."""
    import sys

    return sorted(m for m in sys.modules if m.startswith("annotated_transformer.course"))
