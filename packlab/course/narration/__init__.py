"""Sentence-building for the chapters: each module turns one chapter's measurements into the words beside them.

A chapter's cells measure; the sentences that follow a measurement (which way a comparison
went, whether a guarantee held, how a duration of a few milliseconds is written) are built
here, so that the cells a reader sees hold only the code that measures, and the words
always follow the numbers. A cell that only passes such sentences to
:func:`packlab.course.prose.figures` is hidden in the book and in JupyterLab
(``tags: [remove-input]`` and ``jupyter: source_hidden: true``). ``chNN`` serves chapter
NN; its functions take measured values and return text, never measure anything.

Every verdict comes from :func:`packlab.bench.compare` (through ``verdict`` and
``ratio_words``): "clearly" appears only where it says so.
"""
