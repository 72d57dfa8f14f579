"""``train --model auto`` (annotated_transformer.recipe_fit): the rung chosen from given step
times, what the log, the metrics and the checkpoint say of it, and the command's errors.
No timing is asserted: the speeds are given."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from annotated_transformer import checkpoint, cli, recipe_fit, recipes
from annotated_transformer.recipes import CPU_LADDER, CPU_TRANSLATION, Rung

TINY_DE_EN = Path(__file__).resolve().parents[2] / "chapters" / "data" / "tiny-de-en"
LADDER = (Rung("large", CPU_TRANSLATION, min_steps=2000),
          Rung("medium", CPU_TRANSLATION, min_steps=1200),
          Rung("small", CPU_TRANSLATION))


def timed(seconds: dict[str, float], asked: list[str]):
    """A step-time function that answers ``seconds[rung.name]`` and notes what it timed."""
    def step_seconds(rung: Rung) -> float:
        asked.append(rung.name)
        return seconds[rung.name]
    return step_seconds


@pytest.mark.parametrize("large, medium, chosen, asked", [
    (0.5, 0.4, "large", ["large"]),  # 1,500 s buy 3,000 steps of the large model
    (1.0, 0.6, "medium", ["large", "medium"]),  # 1,500 of the large, 2,500 of the medium
    (2.0, 1.5, "small", ["large", "medium", "small"]),  # 750 and 1,000: the last rung
])
def test_the_first_rung_that_fits_its_fewest_steps_is_chosen(large, medium, chosen, asked):
    seen: list[str] = []
    choice = recipe_fit.choose(LADDER, timed({"large": large, "medium": medium,
                                              "small": 0.9}, seen), 1500.0)
    assert choice.rung.name == chosen and seen == asked  # the rungs after it are not timed
    last = choice.trials[-1]
    assert last.steps == int(1500.0 // last.step_seconds) and last.name == chosen
    assert all(t.steps < t.min_steps for t in choice.trials[:-1])


def test_the_boundary_counts_whole_steps():
    at = recipe_fit.choose(LADDER, lambda rung: 0.75, 1500.0)  # exactly 2,000 steps
    below = recipe_fit.choose(LADDER, lambda rung: 0.7501, 1500.0)  # 1,999
    assert (at.rung.name, below.rung.name) == ("large", "medium")


def test_the_record_and_the_line_say_what_was_chosen_and_why():
    choice = recipe_fit.choose(LADDER, timed({"large": 1.0, "medium": 0.6}, []), 1500.0)
    record = choice.record()
    assert record["chosen"] == "medium" and record["model"] == CPU_TRANSLATION.model
    assert record["training_seconds"] == 1500.0
    assert [(t["name"], t["steps"], t["min_steps"]) for t in record["trials"]] == [
        ("large", 1500, 2000), ("medium", 2500, 1200)]
    assert json.loads(json.dumps(record)) == record  # it goes into the metrics as it is
    line = choice.describe()
    assert line.startswith("medium, for 25.0 minutes of steps")
    assert "large: 1.000 s a step, 1,500 steps (fewer than its 2,000)" in line
    assert "medium: 0.600 s a step, 2,500 steps)" in line


@pytest.mark.parametrize("ladder, seconds, message", [
    ((), 0.5, "at least one rung"), (LADDER, 0.0, "must be positive")])
def test_bad_ladders_and_times_are_refused(ladder, seconds, message):
    with pytest.raises(ValueError, match=message):
        recipe_fit.choose(ladder, lambda rung: seconds, 100.0)


def test_the_cpu_ladder_goes_down_in_size_and_keeps_the_cpu_run():
    assert CPU_LADDER[0].recipe == CPU_TRANSLATION  # the largest rung is --model cpu
    sizes = [rung.recipe.model for rung in CPU_LADDER]
    costs = [s["num_layers"] * s["d_model"] ** 2 for s in sizes]
    assert costs == sorted(costs, reverse=True) and len(set(costs)) == len(costs)
    assert [r.min_steps for r in CPU_LADDER][-1] == 0  # the last is always there to take
    for rung in CPU_LADDER:  # only the model differs: the vocabulary, batches and schedule
        assert rung.recipe.train == CPU_TRANSLATION.train
        assert rung.recipe.vocab_size == CPU_TRANSLATION.vocab_size


def test_a_trial_trains_its_steps_and_stops_at_its_limit(monkeypatch):
    from annotated_transformer import Parts
    from annotated_transformer.data import make_task

    task = make_task("translation", dataset=str(TINY_DE_EN), vocab_size=300)
    rung = dataclasses.replace(CPU_TRANSLATION, model=dict(
        CPU_TRANSLATION.model, num_layers=1, d_model=32, d_ff=64))
    calls = []
    real = recipe_fit.train_step
    monkeypatch.setattr(recipe_fit, "train_step", lambda *a, **k: calls.append(1) or real(*a, **k))
    args = (rung.model_config(task), dataclasses.replace(rung.train, max_tokens=256), task,
            Parts("fast"), recipe_fit.torch.device("cpu"))
    assert recipe_fit.time_steps(*args, steps=3, skip=1) > 0 and len(calls) == 4
    calls.clear()
    assert recipe_fit.time_steps(*args, steps=3, skip=1, limit=0.0) > 0 and len(calls) == 2


def test_train_model_auto_records_its_choice(tmp_path, capsys, monkeypatch):
    """The command times each rung (here: given times), trains the one chosen, and says so
    in the log, the metrics and the checkpoint."""
    small = dict(CPU_TRANSLATION.model, num_layers=1, d_model=32, d_ff=64)
    ladder = (Rung("wide", CPU_TRANSLATION, min_steps=10**6),
              Rung("narrow", dataclasses.replace(CPU_TRANSLATION, model=small)))
    monkeypatch.setattr(recipes, "CPU_LADDER", ladder)
    monkeypatch.setattr(recipe_fit, "time_steps", lambda model_config, *a, **k:
                        0.5 if model_config.d_model == 32 else 9.0)
    status = cli.main(["train", "--task", "translation", "--dataset", str(TINY_DE_EN),
                       "--vocab-size", "300", "--model", "auto", "--time-budget", "8s",
                       "--max-tokens", "256", "--eval-size", "10", "--device", "cpu",
                       "--out", str(tmp_path), "--no-progress"])
    out = capsys.readouterr().out
    assert status == 0
    assert "--model auto chose narrow, for " in out and "wide: 9.000 s a step" in out
    assert "1 layers, d_model 32" in out
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    chosen = [r["recipe"] for r in records if "recipe" in r]
    assert len(chosen) == 1 and chosen[0]["chosen"] == "narrow" and chosen[0]["model"] == small
    state = checkpoint.load(tmp_path / checkpoint.FILE_NAME)
    assert state["history"]["recipe"] == chosen[0]
    assert state["model_config"]["d_model"] == 32


@pytest.mark.parametrize("argv, message", [
    (["--task", "copy", "--model", "auto"], "for --task translation"),
    (["--task", "translation", "--model", "auto", "--d-model", "128"], "--d-model goes with"),
    (["--task", "translation", "--model", "auto", "--steps", "10"], "give --time-budget"),
])
def test_model_auto_refuses_what_it_cannot_do(tmp_path, capsys, argv, message):
    status = cli.main(["train", *argv, "--dataset", str(TINY_DE_EN), "--out", str(tmp_path)]
                      if "translation" in argv else ["train", *argv, "--out", str(tmp_path)])
    assert status == 2 and message in capsys.readouterr().err
