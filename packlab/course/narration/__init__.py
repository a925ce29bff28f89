"""The sentences the chapters build from their measurements, one module per chapter.

A chapter's cells measure; the words around the numbers (which of two sentences applies,
how a verdict reads, how a duration of a few milliseconds is written) live here, so
that the code a learner reads in a chapter is the code that measures. A cell that only
passes such sentences to :func:`packlab.course.prose.figures` is hidden in the book and
in JupyterLab (``tags: [remove-input]`` and ``jupyter: source_hidden: true``).

``chNN`` serves chapter NN; every function returns text (or a dict of texts) and takes
the measured values, never measures anything itself.
"""
