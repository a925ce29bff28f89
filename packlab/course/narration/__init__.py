"""Sentence-building for the chapters: each module turns one chapter's measurements into the words beside them.

A chapter's cells measure; the sentences that follow a measurement (which way a comparison
went, whether a guarantee held) are built here, so that the cells a reader sees hold only
the code that measures, and the words always follow the numbers.
"""
