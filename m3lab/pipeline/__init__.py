"""Pipelines: declarative lists of notebook steps, executed by papermill into a run folder.

- :mod:`m3lab.pipeline.spec`: the YAML pipeline files and where notebooks live;
- :mod:`m3lab.pipeline.params`: each notebook's ``parameters`` cell, and validation of ``-p`` overrides;
- :mod:`m3lab.pipeline.runner`: executing a pipeline (progress, summary.json, failure, resume);
- :mod:`m3lab.pipeline.report`: the self-contained HTML report of a run.
"""
