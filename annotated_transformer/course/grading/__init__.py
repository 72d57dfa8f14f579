"""Grading: run the graded tests (``tests/graded/``) on a learner's parts, report points.

These are the files that decide a grade (the grading manifest holds them); the
instructor's tools over many learners are :mod:`annotated_transformer.course.instructor`.

Two rooms and a door: a file's folder says in which process it runs. Everything the grading
worker (the process that imports and calls the learner's code) imports of the grader is
under :mod:`.worker`; everything else here is the trusted side, which never imports
``worker/`` (the supervisor starts it by its module's name). :mod:`.protocol` is the door,
the one module both import (``tests/grading/test_grader_design.py`` checks all three).

Running (the trusted side)
  - :mod:`.grade`: ``python -m annotated_transformer grade``: the command over the engine.
  - :mod:`.engine`: the one entry, ``engine.grade``: runs pytest on the graded tests in a
    fresh interpreter and turns its records into points per exercise (``grade``, the
    instructor's ``regrade`` and the course's own tests all go through it).
  - :mod:`.exercise_id`: an exercise's id (``5.3``), read once.
  - :mod:`.runspec`: one grading run described once (sources, seed, CPU seconds, sandbox,
    exercises, where the records go), handed to the graded tests as one file.
  - :mod:`.plugin`: the graded tests' pytest plugin (their ``conftest.py`` loads it): the
    run, the code under test (``learner``), the source rules' gate, seeding, the records.
  - :mod:`.results`: a graded test's record (JSON), and an exercise's result, the one shape
    the report, the gradebook and the class's summary share, and its formats (JSON, the
    gradebook's line and CSV).
  - :mod:`.report`: a run's :class:`~.report.Report` and its formats (terminal, JSON,
    Markdown, JUnit).
  - :mod:`.manifest`: the sha256 of the files that decide a grade, and the integrity
    checks (a submission's grading files and workflows against the course's).
  - :mod:`.cache`: the capstone's result kept while nothing it depends on changed.
  - :mod:`.dependencies`: what each exercise builds on, read from the graded tests.
  - :mod:`.calls`: which exercises a probe's code called, from the names the worker observed
    (the blame of :mod:`.dependencies` follows them).
  - :mod:`.standins`: which earlier exercises a test runs on the grader's own versions of
    them (the worker builds those), so that each exercise is graded on its own code.
  - :mod:`.messages`: the sealed id of the mistake a message names, what a learner reads for
    an exception, and a message shown as data.

Talking to the worker (the trusted side)
  - :mod:`.supervisor`: starts the worker and talks to it (``CodeUnderTest.run`` a probe).
  - :mod:`.boundary`: the operating-system boundary around the worker (bubblewrap) and
    its CPU meter.
  - :mod:`.watch`: the deadlines of a call (CPU seconds, waiting without computing, a reply).
  - :mod:`.outcomes`: how a test ends (:class:`~.outcomes.Outcome`, ordered by priority),
    what a call can end with besides its value, and whose fault it is.
  - :mod:`.limits`: a cgroup per worker (its memory and processes together), or why not.
  - :mod:`.output`: what the worker prints, drained as it comes and kept bounded.

The door
  - :mod:`.protocol`: the frames between the two (plain data, ``weights_only``), the
    worker's :class:`~.protocol.Reply`, checked on arrival, how long a message may be, and
    which stand-ins a request may ask for.

The worker (where the learner's code runs)
  - :mod:`.worker`: the worker process and what it imports (its own map).

Rules
  - :mod:`.source_rules`: what an exercise file may not do, read without running it.
"""
