"""Grading: run the graded tests (``tests/graded/``) on a learner's parts, report points.

These are the files that decide a grade (the grading manifest holds them); the
instructor's tools over many learners are :mod:`annotated_transformer.course.instructor`,
and the design is the instructor page's (``book/instructor.md``).

Two rooms and a door: a file's folder says in which process it runs. Everything the grading
worker (the process that imports and calls the learner's code) imports of the grader is
under :mod:`.worker`; everything else here is the trusted side, which never imports
``worker/`` (the supervisor starts it by its module's name). :mod:`.protocol` is the door,
the one module both import (``tests/grading/test_grader_design.py`` checks all three).

Running (the trusted side)
  - :mod:`.grade`: the command ``python -m annotated_transformer grade``.
  - :mod:`.engine`: the one entry, ``engine.grade`` (``grade``, ``regrade``, the course's tests).
  - :mod:`.exercise_id`: an exercise's id (``5.3``), read once.
  - :mod:`.runspec`: one grading run described once, handed to the graded tests as a file.
  - :mod:`.plugin`: the graded tests' pytest plugin.
  - :mod:`.results`: a graded test's record, an exercise's result, and their formats.
  - :mod:`.report`: a run's report and its formats (terminal, JSON, Markdown, JUnit).
  - :mod:`.manifest`: the sha256 of the files that decide a grade; the integrity checks.
  - :mod:`.cache`: the capstone's result kept while nothing it depends on changed.
  - :mod:`.dependencies`: what each exercise builds on, runs on stand-ins of, and called.
  - :mod:`.messages`: a mistake's sealed id, and what a learner reads for an exception.
  - :mod:`.source_rules`: what an exercise file may not do, read without running it.

Talking to the worker (the trusted side)
  - :mod:`.supervisor`: starts the worker and talks to it (``CodeUnderTest.run`` a probe).
  - :mod:`.boundary`: the operating-system boundary around the worker, and its CPU meter.
  - :mod:`.watch`: the deadlines of a call.
  - :mod:`.outcomes`: how a test ends, what else a call can end with, and whose fault it is.
  - :mod:`.limits`: a cgroup per worker (its memory and processes together), or why not.
  - :mod:`.output`: what the worker prints, drained as it comes and kept bounded.

The door and the worker
  - :mod:`.protocol`: the frames between the two, checked on arrival.
  - :mod:`.worker`: the worker process and what it imports (its own map).
"""
