"""The cost model: roofline bounds per op (``roofline``), measured-table calibration (``calibration``,
``validate``), measured peers of vLLM's own kernels (``peers``), the cost source of every kernel path vLLM runs
(``sources``), every assumed number (``assumptions``), time per OpTable row (``model``), the sensitivity of an
estimate to each assumption (``sensitivity``) and one kernel's predicted time (``kernel_time``). README.md says
which choices the model makes and why."""
