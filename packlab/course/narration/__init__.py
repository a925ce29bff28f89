"""Sentence-building for the chapters: one module per chapter (``ch11`` for chapter 11), so the
code a learner reads in a chapter is the code that measures, and the words that follow a
measurement are chosen here, from the measurement and the course's verdict rule
(:func:`packlab.bench.compare`)."""
