"""The stub generator: exercises/ is exactly what solutions/ generates, and stubs teach."""

from __future__ import annotations

import importlib.util
import inspect
import re

import pytest

from annotated_transformer.course.authoring import stubs

SOURCE = '''"""A chapter."""
import torch


def double(x):
    """Return 2x."""
    # BEGIN SOLUTION 9.1
    return 2 * x
    # END SOLUTION


class Scale(torch.nn.Module):
    def __init__(self, k):
        super().__init__()
        # BEGIN SOLUTION 9.2
        self.k = k
        # END SOLUTION

    def forward(self, x):
        # BEGIN SOLUTION 9.2
        return self.k * x
        # END SOLUTION
'''


def test_committed_stubs_are_what_the_generator_makes():
    problems = stubs.stale_files()
    assert not problems, (
        "exercises/ is out of date with solutions/: " + "; ".join(problems)
        + ". Regenerate with `python -m annotated_transformer stubs`. (A learner's edits to "
        "exercises/ also show here: grade them with `python -m annotated_transformer grade`.)"
    )


def test_regions_become_stubs_that_name_the_exercise():
    stub = stubs.make_stub(SOURCE)
    assert "return 2 * x" not in stub and "self.k = k" not in stub
    assert '"""Return 2x."""' in stub and "def double(x):" in stub and "super().__init__()" in stub
    assert 'raise NotImplementedError("Exercise 9.1: double is not implemented yet")' in stub
    assert "Exercise 9.2: Scale.__init__ is not implemented yet" in stub
    assert 'raise NotImplementedError("Exercise 9.2: Scale.forward is not implemented yet")' in stub
    assert "        # TODO Exercise 9.2: write Scale.forward (see its docstring).\n" in stub
    compile(stub, "<stub>", "exec")


@pytest.mark.parametrize("broken, complaint", [
    ("def f():\n    # BEGIN SOLUTION 1.1\n    return 1\n", "never closed"),
    ("def f():\n    return 1\n    # END SOLUTION\n", "without a BEGIN"),
    ("# BEGIN SOLUTION 1.1\nx = 1\n# END SOLUTION\n", "inside a function"),
    ("def f():\n    # BEGIN SOLUTION 1.1\n    # BEGIN SOLUTION 1.2\n    pass\n",
     "inside the region"),
])
def test_malformed_markers_are_reported_with_their_line(broken, complaint):
    with pytest.raises(stubs.StubError, match=complaint):
        stubs.make_stub(broken, "x.py")


GIVEN = {"embeddings"}  # public helpers the files give whole (chapter 5's, for 5.8 and 8.5)


def test_every_public_name_of_a_fresh_stub_raises_not_implemented(tmp_path):
    for path in stubs.write_stubs(tmp_path):
        spec = importlib.util.spec_from_file_location(f"fresh_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        solution = (stubs.SOLUTIONS_DIR / path.name).read_text()
        regions = len(re.findall(r"# BEGIN SOLUTION", solution))
        assert path.read_text().count('raise NotImplementedError("Exercise ') == regions
        for name in module.__all__:
            obj = getattr(module, name)
            if name in GIVEN:
                assert "NotImplementedError" not in inspect.getsource(obj), name
                continue
            arguments = [8] * len(inspect.signature(obj).parameters)
            with pytest.raises(NotImplementedError, match=r"^Exercise \d+\.\d+: "):
                obj(*arguments)


def test_regenerating_never_overwrites_a_learners_edits(tmp_path):
    (written,) = [p for p in stubs.write_stubs(tmp_path) if p.name.startswith("ch01")]
    assert stubs.is_untouched(written.read_text())
    written.write_text(written.read_text().replace("raise NotImplementedError", "return 1 #", 1))
    with pytest.raises(FileExistsError, match=written.name):
        stubs.write_stubs(tmp_path)
    stubs.write_stubs(tmp_path, force=True)
    assert stubs.is_untouched(written.read_text())


def test_check_names_the_stale_file_and_fails(tmp_path, capsys):
    stubs.write_stubs(tmp_path)
    assert stubs.main(["--check", "--out", str(tmp_path)]) == 0
    target = next(tmp_path.glob("ch01_*.py"))
    target.write_text(target.read_text() + "\n# changed\n")
    assert stubs.main(["--check", "--out", str(tmp_path)]) == 1
    assert target.name in capsys.readouterr().err
