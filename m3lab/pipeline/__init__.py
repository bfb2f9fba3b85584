"""Pipelines: declarative lists of notebook steps, executed by papermill into a run folder.

- :mod:`m3lab.pipeline.spec`: the YAML pipeline files and where notebooks live;
- :mod:`m3lab.pipeline.params`: each notebook's ``parameters`` cell, and validation of ``-p`` overrides;
- :mod:`m3lab.pipeline.validate`: value checks of parameters through the library's own validators;
- :mod:`m3lab.pipeline.run_folder`: the run folder on disk (summary.json, folder names, the run lock);
- :mod:`m3lab.pipeline.runner`: executing a pipeline (progress, summary.json, failure, resume);
- :mod:`m3lab.pipeline.report`: the self-contained HTML report of a run;
- :mod:`m3lab.pipeline.sweep`: one run per point of a parameter grid, and the table comparing them.
"""
