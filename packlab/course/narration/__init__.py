"""The sentences the chapters build from their measurements, one module per chapter.

A chapter's cell measures; a hidden cell after it passes the numbers to
:func:`packlab.course.prose.figures`, and the words around them come from here: the module
of that chapter (``chNN``) turns spreads and verdicts into clauses. Keeping the sentence
logic here, not in the notebooks, leaves the code a learner reads to the code that
measures, and lets ``tests/`` check that every sentence reads right for every verdict
(clearly more, clearly less, no clear difference).

Every verdict comes from :func:`packlab.bench.compare` (through ``verdict`` and
``ratio_words``): "clearly" appears only where it says so.
"""
