"""The course's reference datasets, one module per storage format.

Chapters build each of these up step by step and then show the version here; the
grader, the benchmark and later chapters import them from here.
"""
