"""The cost model: roofline bounds per op (``roofline``), measured-table calibration (``calibration``,
``validate``), per-kind launch floors and default efficiencies (``kernel_defaults``), time per OpTable row
(``model``) and one kernel's predicted time (``kernel_time``)."""
