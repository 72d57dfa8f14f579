"""The graded tests' options, fixtures and hooks are the grading plugin's
(:mod:`annotated_transformer.course.grading.plugin`): the run they are part of, the
``learner`` fixture (the code under test, run in a worker), seeding, and the records."""

from annotated_transformer.course.grading.plugin import *  # noqa: F403
