"""The worker's room: every module of the grader that the grading worker imports.

The grading worker is the process that imports and calls the learner's code (inside the
boundary of :mod:`~annotated_transformer.course.grading.boundary`). Nothing here decides a
grade, and nothing here is trusted: the learner's code can change anything in this process.
These modules import, of the grader, only each other and the door,
:mod:`~annotated_transformer.course.grading.protocol`; besides, the library the learner's
code builds with (:mod:`annotated_transformer.parts` and the modules outside
``annotated_transformer.course``), the standard library and PyTorch. The trusted side never
imports them: the supervisor starts the worker by its module's name
(``supervisor.WORKER_BOOT``). ``tests/grading/test_grader_design.py`` checks both from the
imports, ``tests/grading/test_sandbox.py`` from what a worker holds. (The graded test files,
which a grading worker loads for their probes, import at their top what their pytest side
uses: the exceptions of :mod:`~annotated_transformer.course.grading.outcomes` and the words
of :mod:`~annotated_transformer.course.grading.messages`, two modules that import no other
part of the grader. A grading worker holds them too, and never calls them.)

  - :mod:`.process`: the worker process: its limits, its loop of requests and replies, a
    probe run with the chapter module under test; installs the parts policy of
    :mod:`.confinement`.
  - :mod:`.confinement`: every source means the learner's folder; blocked chapters.
  - :mod:`.allowed_ops`: the aten ops a guarded exercise's code may reach (an allow-list),
    refused at PyTorch's dispatcher whatever name reached the others.
  - :mod:`.switches`: every other way to PyTorch's mode stacks taken out of reach, and no
    new thread or process in the worker (seccomp).
  - :mod:`.standins`: the grader's own versions of the exercises a later one builds on,
    built for one request and revoked when it ends.
  - :mod:`.trusted`: what those stand-ins compute with, the only code whose ops the guard
    exempts (by its code objects).
  - :mod:`.calls`: the chapters' functions a probe's code entered, sent back with its reply.
"""
