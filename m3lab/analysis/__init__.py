"""Checklist views over the OpTable that return DataFrames: local shapes over a workload (step 1,
:mod:`m3lab.analysis.shapes`), repetition (step 2) and byte planes (step 3)."""
