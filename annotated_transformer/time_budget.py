"""Training to a time budget: as many steps as fit before a deadline, re-planned as the
run measures itself, and a learning rate that reaches zero at the last of them.

A recipe's number of steps takes twice as long on a processor half as fast; a budget of
wall time does not. ``train --time-budget 30m`` (``--model cpu``'s default) works so:

1. **Measure.** After the first step the run evaluates and saves once, which times what
   every later evaluation costs. The first :attr:`Planner.skip` steps are not timed (the
   allocator, the caches and the thread pool warm up); the next :attr:`Planner.measure`
   are (fewer when they take more than 5% of the budget).
2. **Plan** (:meth:`Planner.plan`). What is left of the budget, less a reserve for the
   final evaluation and checkpoint (half as long again as the measured one), for
   ``average`` when the run keeps checkpoints (``--keep-last N``: N loads and one save,
   each as long as a save) and a margin (1% of the budget and 2 seconds), buys steps at
   the measured time each, plus an evaluation every ``eval_every`` of them. The warmup is
   the recipe's, or as large a share of the planned steps as the recipe's is of its own
   when fewer steps fit.
3. **Re-plan** every :attr:`Planner.replan_every` steps or 5% of the budget, whichever
   comes first, from the steps since the last plan (a machine that slows down or speeds
   up moves the end), and stop at once when the next step would not leave time for the
   final evaluation.

The rate (:class:`BudgetSchedule`, a ``LambdaLR`` factor) rises linearly to the recipe's
peak (chapter 6's Noam rate at the recipe's warmup) and falls linearly to zero at the
planned last step; a re-plan stretches or shrinks what is left of that line from the
current rate, so the rate never jumps.

Everything here reads time only from the numbers it is given, so that tests run it on a
fake clock (``tests/library/test_time_budget.py``).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")


def parse_duration(text: str) -> float:
    """Seconds of ``"30m"``, ``"90s"``, ``"1h"``, ``"1h30m"`` or ``"2m30s"``; ``ValueError``
    naming the text for anything else (a bare number is refused: minutes or seconds?)."""
    match = _DURATION.fullmatch(text.strip().lower())
    if not text.strip() or match is None or not any(match.groups()):
        raise ValueError(f"a duration is a number with a unit, h, m or s (30m, 90s, 1h30m), "
                         f"got {text!r}")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    total = 3600 * hours + 60 * minutes + seconds
    if total <= 0:
        raise ValueError(f"a time budget must be longer than zero, got {text!r}")
    return total


def format_duration(seconds: float) -> str:
    """``1 h 02 min 05 s``, ``29 min 40 s``, ``48 s``: a duration for the log."""
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min {seconds:02d} s"
    return f"{minutes} min {seconds:02d} s" if minutes else f"{seconds} s"


@dataclass
class BudgetSchedule:
    """The rate factor of a budgeted run, for ``torch.optim.lr_scheduler.LambdaLR``.

    From the anchor ``(anchor_step, anchor_lr)`` the rate goes linearly to ``peak`` at
    ``warmup`` (while the anchor is before it), then linearly to zero at ``total``. It
    starts anchored at ``(0, 0)``; :meth:`replan` moves the anchor to the current step and
    rate, so the rate is continuous whatever the new plan. ``LambdaLR`` saves an object's
    attributes in its ``state_dict``, so a checkpoint keeps the plan."""

    peak: float
    warmup: int
    total: int
    anchor_step: int = 0
    anchor_lr: float = 0.0

    def __call__(self, step: int) -> float:
        step = max(step, 1)  # step 0 counts as step 1 (as noam_lr does)
        if step <= self.warmup and self.anchor_step < self.warmup:
            start, rate = self.anchor_step, self.anchor_lr
            return rate + (self.peak - rate) * (step - start) / (self.warmup - start)
        start, rate = ((self.warmup, self.peak)
                       if self.anchor_step < self.warmup or self.anchor_step == 0
                       else (self.anchor_step, self.anchor_lr))
        if self.total <= start:
            return 0.0
        return rate * max(0.0, (self.total - step) / (self.total - start))

    def replan(self, step: int, total: int, warmup: int | None = None) -> None:
        """From ``step`` on, end at ``total`` (and warm up to ``warmup``, if given)."""
        self.anchor_lr, self.anchor_step = self(step), step
        self.total = total
        if warmup is not None:
            self.warmup = warmup
        if step < self.warmup and total <= self.warmup:  # no time left to finish warming up:
            self.warmup = step  # decay from the rate reached, to zero at the new end


@dataclass
class Plan:
    """One plan: at ``step`` (``seconds`` into the budget), ``total`` steps in all."""

    step: int
    seconds: float
    total: int
    warmup: int
    step_seconds: float  # measured: the mean over the steps since the last plan
    measured_steps: int
    eval_seconds: float  # measured: the last evaluation and checkpoint save
    eval_every: int
    reserve_seconds: float  # kept for the end: the final evaluation, average, margin
    budget: float
    average_checkpoints: int = 0  # `average` of this many checkpoints is in the reserve

    def describe(self) -> str:
        """Why this many steps, in one line."""
        steps = f"{self.measured_steps} step{'s' if self.measured_steps != 1 else ''}"
        return (f"{self.step_seconds:.3f} s a step (the mean of {steps}), "
                f"{self.eval_seconds:.1f} s an evaluation and save (every {self.eval_every} "
                f"steps), {self.reserve_seconds:.0f} s kept for the end (the last evaluation "
                f"and save, "
                + (f"average --last {self.average_checkpoints}, " if self.average_checkpoints
                   else "")
                + f"a margin): {self.total:,} steps in all (warmup {self.warmup:,}) in "
                f"{format_duration(self.budget)}")


@dataclass
class Planner:
    """How many steps fit in ``budget`` seconds from ``started`` (a clock's reading: the
    caller's clock, real or fake), for a run that evaluates every ``eval_every`` steps.

    ``recipe_warmup`` and ``recipe_steps`` are the recipe's: the warmup is kept when the
    plan has at least ``recipe_steps`` steps, and otherwise the same share of the plan.
    ``average_checkpoints``: the run keeps this many checkpoints for ``average``, whose
    time is reserved. The training loop calls :meth:`step_done` after each step,
    :meth:`eval_done` after each evaluation and save, asks :meth:`wants_eval` and
    :meth:`due` whether to evaluate or plan, and :meth:`must_stop` whether to end now."""

    budget: float
    started: float
    eval_every: int
    recipe_warmup: int
    recipe_steps: int
    average_checkpoints: int = 0
    skip: int = 2
    measure: int = 20
    replan_every: int = 50
    plans: list[Plan] = field(default_factory=list)
    _durations: list[float] = field(default_factory=list)
    _untimed: list[float] = field(default_factory=list)
    _eval_seconds: float | None = None
    _save_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not self.budget > 0:
            raise ValueError(f"budget must be positive, got {self.budget}")
        if self.eval_every < 1 or self.skip < 0 or self.measure < 1 or self.replan_every < 1:
            raise ValueError("eval_every, measure and replan_every must be at least 1, skip "
                             "at least 0")

    @property
    def deadline(self) -> float:
        return self.started + self.budget

    def step_done(self, step: int, seconds: float) -> None:
        """Step ``step`` took ``seconds`` (without any evaluation)."""
        if step > self.skip:
            self._durations.append(seconds)
        else:  # not timed for the plan, but the best guess of a step until one is
            self._untimed.append(seconds)

    def eval_done(self, seconds: float, save_seconds: float = 0.0) -> None:
        """An evaluation and checkpoint save took ``seconds`` in all, the save
        ``save_seconds`` of them."""
        self._eval_seconds, self._save_seconds = seconds, save_seconds

    def wants_eval(self, step: int) -> bool:
        """Whether to evaluate after ``step`` to time it: after the first step, if no
        evaluation has been timed yet (an untrained model decodes to the longest length:
        an upper bound), so that every decision to stop knows what the end costs."""
        return step >= 1 and self._eval_seconds is None

    def due(self, step: int, now: float) -> bool:
        """Whether to (re-)plan after ``step`` (``now`` on the caller's clock): first after
        :attr:`measure` timed steps (or fewer, at least 3, once they took 5% of the
        budget), then every :attr:`replan_every` steps or 5% of the budget, whichever
        comes first."""
        if self.plans:
            last = self.plans[-1]
            return (step - last.step >= self.replan_every
                    or now - self.started - last.seconds >= 0.05 * self.budget)
        timed = len(self._durations)
        return timed >= self.measure or (timed >= 3 and sum(self._durations)
                                         >= 0.05 * self.budget)

    def reserve(self) -> float:
        """Seconds kept for the end: the final evaluation and save (half as long again as
        the last one measured: the one piece of work that cannot be cut short, and a busy
        machine slows it), ``average``'s loads and save, and a margin (1% and 2 s)."""
        evaluation = 1.5 * (self._eval_seconds or 0.0)
        average = (self.average_checkpoints + 1) * self._save_seconds \
            if self.average_checkpoints else 0.0
        return evaluation + average + 0.01 * self.budget + 2.0

    def step_seconds(self) -> float:
        """The mean time of the steps measured since the last plan."""
        if not self._durations:
            raise ValueError("no step has been timed yet")
        return sum(self._durations) / len(self._durations)

    def plan(self, step: int, now: float) -> Plan:
        """The plan at ``step``, ``now`` on the caller's clock: the total number of steps
        (at least ``step``: zero more when nothing more fits) and the warmup. Starts a new
        measurement window."""
        per_step = self.step_seconds()
        evaluation = self._eval_seconds or 0.0
        available = self.deadline - now - self.reserve()
        more = max(0, math.floor(available / (per_step + evaluation / self.eval_every)))
        total = step + more
        share = round(self.recipe_warmup * total / self.recipe_steps)
        warmup = self.plans[0].warmup if self.plans else min(
            self.recipe_warmup, max(share, step + 1))
        plan = Plan(step=step, seconds=now - self.started, total=total, warmup=warmup,
                    step_seconds=per_step, measured_steps=len(self._durations),
                    eval_seconds=evaluation, eval_every=self.eval_every,
                    reserve_seconds=self.reserve(), budget=self.budget,
                    average_checkpoints=self.average_checkpoints)
        self.plans.append(plan)
        self._durations = []
        return plan

    def must_stop(self, step: int, now: float) -> bool:
        """Whether the step after ``step`` would leave too little time for the final
        evaluation (a sudden slowdown between two plans)."""
        per_step = self.plans[-1].step_seconds if self.plans else 0.0
        recent = self._durations[-10:] or ([] if self.plans else self._untimed[-1:])
        if recent:  # the steps since the last plan, if they are slower
            per_step = max(per_step, sum(recent) / len(recent))
        return per_step > 0 and self.deadline - now - self.reserve() < per_step

    def record(self) -> dict:
        """What the checkpoint and the metrics keep: the budget and every plan."""
        return {"budget_seconds": self.budget, "plans": [asdict(p) for p in self.plans]}
