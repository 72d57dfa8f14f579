"""The course's tools, apart from the library they grade and ship.

- :mod:`~annotated_transformer.course.grading`: run the graded tests on a learner's
  parts and report points (``grade``), the worker and its rules: the files that decide
  a grade.
- :mod:`~annotated_transformer.course.instructor`: many learners graded into one class
  folder (``regrade``), the gradebook and its exports.
- :mod:`~annotated_transformer.course.authoring`: what maintainers write the course with
  (``stubs``: the exercises generated from the reference).
- :mod:`~annotated_transformer.course.hints`: three hints per exercise, one level at a
  time (``hint``), and the book's page of them.
- :mod:`~annotated_transformer.course.distribution`: what goes to learners (``release``:
  the course without its answers; ``classroom``: the GitHub Classroom workflow).

Each is a command of ``python -m annotated_transformer`` (:mod:`annotated_transformer.commands`).
Where the course keeps its files is :mod:`annotated_transformer.layout`.
"""
