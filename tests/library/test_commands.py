"""The one command tree: every command answers through ``python -m annotated_transformer``,
the console script is the same entry, and the grader's ``--impl`` is ``--parts``."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from annotated_transformer import __main__ as tree
from annotated_transformer import cli, commands
from annotated_transformer.commands import COURSE_COMMANDS, all_commands
from annotated_transformer.course.grading import grade

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = all_commands()


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "annotated_transformer", *argv],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_every_model_command_of_cli_is_in_the_tree():
    """The model commands are read from the model command line's parser
    (annotated_transformer/cli), not listed a second time."""
    subcommands = cli.build_parser()._subparsers._group_actions[0].choices
    assert list(subcommands) == [c.name for c in COMMANDS.values()][:len(subcommands)]
    assert set(COMMANDS) == set(subcommands) | {c.name for c in COURSE_COMMANDS}
    assert {"train", "evaluate", "translate", "attention", "export", "grade", "stubs",
            "release", "classroom", "regrade", "bench"} <= set(COMMANDS)


def test_a_command_added_in_cli_joins_the_tree(monkeypatch, capsys):
    """A new ``add_X(sub)`` in the model command line's list (``cli.COMMANDS``) is a
    command of the tree, with its help."""

    def add_distill(sub) -> None:
        sub.add_parser("distill", help="train a small model to imitate a checkpoint")

    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, add_distill))
    assert all_commands()["distill"].help == "train a small model to imitate a checkpoint"
    assert tree.main(["--help"]) == 0 and "distill" in capsys.readouterr().out


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_answers_help(name):
    """Each command's help shows the one launch form, and no other way to start a tool."""
    result = run(name, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: python -m annotated_transformer {name} ")
    assert "-h, --help" in result.stdout
    assert "-m annotated_transformer." not in " ".join(result.stdout.split())


def test_the_top_level_help_lists_every_command_with_its_line(capsys):
    assert tree.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in COMMANDS.values():
        assert any(line.split() == [command.name, *command.help.split()]
                   for line in out.splitlines()), f"no line for {command.name}"


def test_a_student_release_lists_only_the_commands_that_work_there(monkeypatch, tmp_path):
    monkeypatch.setattr(commands, "SOLUTIONS_DIR", tmp_path / "solutions")  # none: a release
    listed = commands.overview(all_commands())
    for command in COURSE_COMMANDS:
        assert (f"  {command.name} " in listed) != command.maintainers, command.name
    assert {"grade", "regrade", "hint"} <= {c.name for c in COURSE_COMMANDS
                                           if not c.maintainers}


def test_an_unknown_command_lists_the_commands_and_exits_2():
    result = run("trian")
    assert result.returncode == 2 and result.stdout == ""
    assert "error: unknown command 'trian'" in result.stderr
    assert all(f"  {name} " in result.stderr for name in COMMANDS)
    assert run().returncode == 2


def test_the_console_script_is_the_same_entry():
    """pyproject.toml's [project.scripts], as installed: annotated-transformer runs the
    same main as python -m annotated_transformer."""
    (script,) = entry_points(group="console_scripts", name="annotated-transformer")
    assert script.load() is tree.main


def run_module(module: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"annotated_transformer.{module}", *argv],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_the_old_grade_module_still_answers():
    """``python -m annotated_transformer.grade``, which learners' older workflows run."""
    old = run_module("grade", "--help")
    assert old.returncode == 0 and old.stdout == run("grade", "--help").stdout


@pytest.mark.parametrize("module", ["train", "bench", "model", "course.instructor.regrade"])
def test_running_a_module_names_the_command_instead_of_doing_nothing(module):
    """One launch form: ``python -m annotated_transformer.train`` would import the module
    and exit 0 having done nothing; it stops with status 2 and the command to run."""
    result = run_module(module, "--task", "copy")
    assert result.returncode == 2 and result.stdout == ""
    assert f"`python -m annotated_transformer.{module}` runs no command" in result.stderr
    assert f"`python -m annotated_transformer {module.rsplit('.', 1)[-1]}`" in result.stderr


@pytest.mark.parametrize("flags", [["-Im"], ["-I", "-m"], ["-OOm"], ["-W", "ignore", "-m"],
                                   ["-Wignore", "-Xutf8", "-m"],
                                   ["--check-hash-based-pycs", "default", "-m"]])
def test_interpreter_flags_do_not_hide_a_module_run(flags):
    """The guard reads Python's own command line, option clusters and option arguments
    included: ``python -Im annotated_transformer.train`` stops like the plain form."""
    result = subprocess.run([sys.executable, *flags, "annotated_transformer.train", "--help"],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 2 and result.stdout == "", (flags, result.stderr)
    assert "`python -m annotated_transformer train`" in result.stderr


def test_python_m_elsewhere_is_left_alone():
    """Only ``python -m`` on a module of the package stops: pytest, the package itself and
    a script that imports it run as before."""
    assert run("--help").returncode == 0
    assert subprocess.run([sys.executable, "-c", "import annotated_transformer"], cwd=ROOT,
                          timeout=300).returncode == 0


def test_the_graders_impl_is_its_parts():
    parser = grade.build_parser()
    assert parser.parse_args(["--impl", "../exercises"]).parts == "../exercises"
    assert parser.parse_args(["--parts", "../exercises"]).parts == "../exercises"
    assert parser.parse_args([]).parts == "exercises"
    assert "--parts" in parser.format_help() and "--impl" not in parser.format_help()


def test_the_graded_tests_take_impl_as_parts():
    """pytest's option: both spellings collect the same tests against the same parts."""
    def collected(option: str) -> list[str]:
        done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                               "-p", "no:randomly", f"{option}=exercises",
                               "tests/graded/test_ch01_positional_encoding.py"],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert done.returncode == 0, done.stdout + done.stderr
        return [line for line in done.stdout.splitlines() if "::" in line]

    parts = collected("--parts")
    assert parts and all("[exercises" in test for test in parts)
    assert collected("--impl") == parts
