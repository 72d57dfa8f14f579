"""The instructor's tools: many learners' repositories graded into one class folder.

They use the grader (:func:`annotated_transformer.course.grading.engine.grade`); nothing the
grader runs uses them, so they are not among the files that decide a grade.

  - :mod:`.regrade`: ``python -m annotated_transformer regrade``: many submissions into
    one gradebook, each checked for changed grading files first.
  - :mod:`.class_folder`: ``regrade``'s other commands over a class's folder (``merge``,
    ``snapshot``, ``export``), its seed, and the flags that compare a learner with the
    class (the identical-file flag, another release than the class's).
  - :mod:`.releases`: what each learner is graded against: the release their repository
    records, read from the course's history, or the course as it is now.
  - :mod:`.submissions`: a submission read without trusting it: its exercise files
    copied out, everything else that could change a grade compared with the course's (or
    the learner's release's); what the copy check compares of each chapter file.
  - :mod:`.repositories`: a submission's repository at the commit to grade (branch,
    the deadline's snapshot), and the flags of what came after it.
  - :mod:`.snapshot`: each repository's branch and head seen at the deadline, with every
    branch's head, signed (``regrade snapshot``): git's own dates choose nothing.
  - :mod:`.gradebook`: the class's gradebook, its files, and how runs add up.
  - :mod:`.spreadsheet`: a result as the gradebook's line, and CSV whose learner text never
    runs as a formula.
  - :mod:`.class_summary`: what a whole class got right and wrong, beside the gradebook.
  - :mod:`.lms`: the roster, and the gradebook in the CSV that Canvas or Moodle imports.
"""
