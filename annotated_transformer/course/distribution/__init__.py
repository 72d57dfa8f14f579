"""What goes to learners and instructors.

- :mod:`.release`: a student release, the course's repository without its answers
  (``python -m annotated_transformer release OUT``).
- :mod:`.release_record`: what a release is (its commit, exercises, points and hashes),
  written into it, and read again from the course's history for ``regrade``.
- :mod:`.classroom`: ``.github/workflows/classroom.yml``, one GitHub Classroom step per
  exercise, generated from the graded tests (``python -m annotated_transformer classroom``).
"""
