"""Checklist views over the OpTable that return DataFrames: repetition (step 2) and byte planes (step 3)."""
