"""Training to a time budget: the plan, on a fake clock (no timing of real work)."""

from __future__ import annotations

import argparse
import re

import pytest
import torch

from annotated_transformer.cli.common import UsageError
from annotated_transformer.cli.training import time_budget
from annotated_transformer.time_budget import BudgetSchedule, Planner, parse_duration


def simulate(planner: Planner, step_seconds, eval_seconds: float, setup: float = 10.0,
             schedule: BudgetSchedule | None = None) -> dict:
    """Run ``planner`` as ``train`` does, on a fake clock: ``setup`` seconds before the
    first step, step ``n`` takes ``step_seconds(n)``, an evaluation and save
    ``eval_seconds`` (every ``eval_every`` steps, at the first plan and at the end).
    Returns the last step, the clock at the end and the rates of every step."""
    now = planner.started + setup
    step, total, rates = 0, 10**9, []
    schedule = schedule or BudgetSchedule(peak=1.0, warmup=planner.recipe_warmup, total=10**9)

    def evaluate() -> None:
        nonlocal now
        now += eval_seconds
        planner.eval_done(eval_seconds, save_seconds=eval_seconds / 4)

    while step < total:
        step += 1
        rates.append(schedule(step - 1))  # LambdaLR: step n trains at the factor of n - 1
        now += step_seconds(step)
        planner.step_done(step, step_seconds(step))
        evaluated = False
        if planner.wants_eval(step):
            evaluate()
            evaluated = True
        if planner.due(step, now):
            plan = planner.plan(step, now)
            schedule.replan(step, plan.total, plan.warmup)
            total = plan.total
        if step < total and planner.must_stop(step, now):
            total = step
        if (step % planner.eval_every == 0 or step == total) and not evaluated:
            evaluate()
    return {"step": step, "end": now, "rates": rates, "schedule": schedule}


def planner(budget: float = 1800.0, **changes) -> Planner:
    settings = dict(budget=budget, started=1000.0, eval_every=100, recipe_warmup=400,
                    recipe_steps=1500)
    return Planner(**{**settings, **changes})


def test_steps_fill_the_budget_and_the_rate_ends_at_the_deadline():
    p = planner()
    run = simulate(p, lambda n: 1.0, eval_seconds=5.0)
    first = p.plans[0]
    assert first.step == p.skip + p.measure and first.step_seconds == pytest.approx(1.0)
    # every step and evaluation fits before the deadline, with the margin left over...
    assert run["end"] <= p.deadline - 0.01 * p.budget
    # ...and the plan used the time: one more step and its share of an evaluation would not fit
    assert run["end"] + 1.0 + 5.0 / 100 > p.deadline - p.reserve() + 5.0
    assert run["step"] == p.plans[-1].total
    assert abs(p.plans[-1].total - first.total) <= 0.01 * first.total  # a steady machine
    schedule = run["schedule"]
    assert schedule(run["step"]) == 0.0 and min(run["rates"][1:]) > 0.0
    assert max(run["rates"]) == pytest.approx(1.0)  # the peak, at the recipe's warmup
    assert run["rates"].index(max(run["rates"])) == 400


def test_the_final_evaluation_and_average_are_reserved():
    fast_eval = simulate(p1 := planner(), lambda n: 1.0, eval_seconds=1.0)
    slow_eval = simulate(p2 := planner(), lambda n: 1.0, eval_seconds=60.0)
    assert p2.plans[-1].reserve_seconds >= 60.0 > p1.plans[-1].reserve_seconds
    assert slow_eval["end"] <= p2.deadline and fast_eval["end"] <= p1.deadline
    # 60 s more at the end, and 18 more evaluations of 59 s more each: fewer steps
    assert slow_eval["step"] < fast_eval["step"] - 60
    averaged = planner(average_checkpoints=5)
    simulate(averaged, lambda n: 1.0, eval_seconds=60.0)
    # average loads 5 checkpoints and saves one, each as long as a save (15 s)
    assert averaged.reserve() == pytest.approx(p2.reserve() + 6 * 15.0)


def test_a_slowdown_is_replanned_and_the_schedule_still_ends_at_the_deadline():
    steady = simulate(planner(), lambda n: 1.0, eval_seconds=5.0)
    p = planner()
    run = simulate(p, lambda n: 1.0 if n <= 600 else 2.0, eval_seconds=5.0)
    assert p.plans[-1].total < p.plans[0].total  # re-planned down
    assert p.plans[-1].step_seconds == pytest.approx(2.0)
    assert run["step"] < steady["step"] and run["end"] <= p.deadline
    assert run["schedule"](run["step"]) == 0.0  # the decay was shrunk to the new end
    # and never jumped: consecutive rates differ by at most one step's warmup increment
    rates = run["rates"]
    assert max(abs(a - b) for a, b in zip(rates, rates[1:], strict=False)) <= 1.0 / 400 + 1e-12


def test_a_speedup_stretches_the_plan():
    p = planner()
    simulate(p, lambda n: 2.0 if n <= 600 else 1.0, eval_seconds=5.0)
    assert p.plans[-1].total > p.plans[0].total


def test_slow_steps_are_replanned_every_5_percent_of_the_budget():
    """Steps of 8 s in a 2-minute budget: far fewer than 50 between plans; the steps then
    speed up to 2 s, and the plan follows."""
    p = planner(budget=120.0)
    run = simulate(p, lambda n: 8.0 if n <= 6 else 2.0, eval_seconds=5.0, setup=20.0)
    assert len(p.plans) >= 3 and p.plans[-1].total > p.plans[0].total
    assert all(b.step - a.step < 50 for a, b in zip(p.plans, p.plans[1:], strict=False))
    assert run["end"] <= p.deadline


def test_a_sudden_slowdown_between_plans_stops_in_time():
    p = planner(replan_every=10**6)  # no re-plan after the first
    run = simulate(p, lambda n: 1.0 if n <= 1500 else 30.0, eval_seconds=5.0)
    assert run["step"] < p.plans[0].total and run["end"] <= p.deadline


def test_a_short_budget_warms_up_for_the_recipes_share_of_its_steps():
    p = planner(budget=300.0)
    run = simulate(p, lambda n: 1.0, eval_seconds=2.0, setup=20.0)
    plan = p.plans[0]
    assert plan.total < 1500 and plan.warmup == round(400 * plan.total / 1500)
    assert run["schedule"](run["step"]) == 0.0 and run["end"] <= p.deadline


def test_a_short_budget_plans_after_fewer_timed_steps():
    p = planner(budget=30.0)
    run = simulate(p, lambda n: 1.0, eval_seconds=2.0, setup=10.0)
    # 3 timed steps took 5% of the budget: the plan comes then, not after 20
    assert p.plans[0].step == p.skip + 3 and run["step"] == p.plans[-1].total
    assert run["end"] <= p.deadline and run["schedule"](run["step"]) == 0.0


def test_a_budget_spent_before_the_first_plan_stops_at_once():
    p = planner(budget=30.0)
    run = simulate(p, lambda n: 1.0, eval_seconds=2.0, setup=24.0)
    assert not p.plans and run["step"] <= p.skip + 2


def test_the_schedule_is_continuous_and_kept_by_lambdalr():
    schedule = BudgetSchedule(peak=2.0, warmup=10, total=100)
    assert schedule(5) == pytest.approx(1.0) and schedule(10) == pytest.approx(2.0)
    assert schedule(55) == pytest.approx(1.0) and schedule(100) == 0.0
    before = schedule(60)
    schedule.replan(60, total=80)
    assert schedule(60) == pytest.approx(before) and schedule(80) == 0.0
    assert schedule(70) == pytest.approx(before / 2)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    restored = torch.optim.lr_scheduler.LambdaLR(
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0),
        BudgetSchedule(peak=1.0, warmup=1, total=1))
    restored.load_state_dict(scheduler.state_dict())
    assert restored.lr_lambdas[0] == schedule


@pytest.mark.parametrize(("text", "seconds"), [("30m", 1800), ("90s", 90), ("1h30m", 5400),
                                               ("2m30s", 150), ("0.5h", 1800)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["30", "", "abc", "0m", "5 minutes", "m"])
def test_bad_durations_are_named(text):
    with pytest.raises(ValueError, match=re.escape(repr(text))):
        parse_duration(text)


def args(**given) -> argparse.Namespace:
    return argparse.Namespace(**{"time_budget": None, "steps": None, "decay": None,
                                 "resume": False, **given})


def test_the_command_line_budget():
    assert time_budget(args(time_budget="2m"), None) == 120
    assert time_budget(args(), 1740) == 1740  # the recipe's
    assert time_budget(args(steps=100), 1740) is None  # --steps instead
    for given, message in ((dict(time_budget="2m", steps=5), "give one"),
                           (dict(time_budget="2m", decay="noam"), "--decay noam"),
                           (dict(resume=True), "--steps N"),
                           (dict(time_budget="2"), "--time-budget")):
        with pytest.raises(UsageError, match=message):
            time_budget(args(**given), 1740)


class FakeClock:
    """``time.perf_counter`` that advances ``tick`` seconds a reading: a run's steps
    "take" the same time on every machine."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 0.0, tick

    def perf_counter(self) -> float:
        self.now += self.tick
        return self.now


def test_train_to_a_budget_on_a_fake_clock(tmp_path, monkeypatch, capsys):
    """The command plans, decays the rate to zero at the planned end, evaluates and saves
    the last step, and reports the budget and its plans in the log, the metrics and the
    checkpoint."""
    import json

    from annotated_transformer import checkpoint, cli
    from annotated_transformer import train as train_module
    from annotated_transformer.cli import training

    clock = FakeClock(0.05)
    monkeypatch.setattr(train_module, "time", clock)
    monkeypatch.setattr(training, "time", clock)
    monkeypatch.setattr(training, "process_started", clock.perf_counter)
    status = cli.main(["train", "--task", "copy", "--out", str(tmp_path), "--time-budget",
                       "15s", "--batch-size", "16", "--eval-size", "20", "--device", "cpu",
                       "--threads", "1", "--no-progress"])
    out = capsys.readouterr().out
    assert status == 0
    assert "as many steps as fit in 15 s (time budget)" in out
    assert re.search(r"time budget: planned at step \d+ \(", out)
    assert "time budget 15 s: finished in" in out
    state = checkpoint.load(tmp_path / checkpoint.FILE_NAME)
    plans = state["history"]["budget"]["plans"]
    steps = state["history"]["step"]
    assert state["history"]["budget"]["budget_seconds"] == 15.0
    assert state["train_config"]["time_budget"] == 15.0
    assert state["step"] == steps[-1] == state["train_config"]["steps"]
    # the planned end, or a step or two before it when the next would not have fitted
    assert plans[-1]["total"] - 2 <= steps[-1] <= plans[-1]["total"]
    assert 25 < steps[-1] < 400  # not the recipe's 400 steps: what 15 fake seconds buy
    assert state["history"]["eval_step"][0] == 1  # an evaluation timed for the plan
    assert state["history"]["eval_step"][-1] == steps[-1]
    lrs = state["history"]["lr"]
    assert lrs[-1] < 0.05 * max(lrs)  # the last step's rate is near zero: the decay ended
    assert state["scheduler"]["lr_lambdas"][0]["total"] == plans[-1]["total"]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["plan"]["total"] for r in records if "plan" in r] == [p["total"] for p in plans]


def test_the_budget_counts_from_the_process_start():
    """The interpreter's start and the imports are in the budget: the process started
    before now, and not long before (a process older than a minute counts from now)."""
    import time

    from annotated_transformer.cli.training import process_started

    now = time.perf_counter()
    assert now - 60 <= process_started() <= time.perf_counter()


def test_the_untimed_steps_stand_for_a_step_until_one_is_timed():
    """A budget spent by the first step and the timed evaluation stops right after them
    (their evaluated checkpoint is the run's), without waiting for a timed step."""
    p = planner(budget=30.0)
    run = simulate(p, lambda n: 3.0, eval_seconds=5.0, setup=15.0)
    assert run["step"] == 1 and not p.plans and run["end"] <= p.deadline


def test_a_plan_cut_short_during_warmup_still_decays_to_zero_at_its_end():
    """Planned with a warm-up of 80 steps, re-planned at step 50 to end at 70: the rate
    falls from where it was to zero at step 70, never climbing on to the peak."""
    from annotated_transformer.time_budget import BudgetSchedule

    schedule = BudgetSchedule(peak=1.0, warmup=80, total=400)
    at_50 = schedule(50)
    schedule.replan(50, 70)
    rates = [schedule(step) for step in range(50, 71)]
    assert rates[0] == at_50 and rates[-1] == 0
    assert all(a >= b for a, b in zip(rates, rates[1:], strict=False))
