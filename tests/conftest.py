"""The package's own tests: every test starts from the seed 0, and global torch settings
are restored after it. (The graded tests have the grading plugin, through their own
``graded/conftest.py``; the grader never reads this file.)

In parallel (``bash scripts/test.sh`` runs pytest-xdist with ``--dist loadgroup``), tests
go to the workers one by one, except those that must share one process, which go to one
worker together, file by file: a notebook's cells (each runs in the kernel that the
earlier cells left), a graded test file's tests (they share the process's pool of grading
workers) and the tests of a file that defines a fixture wider than one test (an expensive
grading run, a trained model), which is then built once. (xdist's own ``xdist_group`` marker renames
the tests, which pytest 9 no longer lets a plugin do: the groups are made here instead.)
"""

from __future__ import annotations

import ast
import random
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _isolated_torch_state() -> Iterator[None]:
    import torch

    torch.manual_seed(0)
    random.seed(0)
    dtype, grad = torch.get_default_dtype(), torch.is_grad_enabled()
    yield
    torch.set_default_dtype(dtype)
    torch.set_grad_enabled(grad)


def pytest_configure(config: pytest.Config) -> None:
    # Here, not in pyproject.toml, whose pytest settings the grading manifest holds.
    config.addinivalue_line(
        "markers", "alone: a slow test that CI runs with no other beside it: it loads the "
        "machine on purpose, starts parallel work of its own, measures speed or waits on a "
        "browser (.ci/run runs the other slow tests two at a time)")


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """With ``--dist loadgroup``: the scheduler that groups tests as the docstring says."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    root = config.rootpath

    class SharedFixturesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::")[0]
            return file if _runs_in_one_process(root / file, root) else nodeid

    return SharedFixturesTogether(config, log)


@cache
def _runs_in_one_process(path: Path, root: Path) -> bool:
    """Whether the tests of ``path`` must run in one process: a notebook, a graded test
    file, or a test file that has a fixture wider than a test."""
    if path.suffix == ".ipynb" or root / "tests" / "graded" in path.parents:
        return True
    return path.is_file() and _has_a_shared_fixture(path)


@cache
def _has_a_shared_fixture(path: Path) -> bool:
    """Whether ``path`` defines a fixture whose ``scope`` is not ``"function"``."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "pytest.fixture":
            scope = next((k.value for k in node.keywords if k.arg == "scope"), None)
            if scope is not None and not (isinstance(scope, ast.Constant)
                                          and scope.value == "function"):
                return True
    return False
