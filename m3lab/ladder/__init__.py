"""The write-up's optimisation ladder: its fixes as data (:mod:`~m3lab.ladder.fixes`), how m3lab represents the state
before a fix that vLLM 0.33.0 has no switch for (:mod:`~m3lab.ladder.before`), the estimate of one rung
(:mod:`~m3lab.ladder.evaluate`), the ladder itself (:mod:`~m3lab.ladder.ladder`) and the advisor that ranks the fixes
a deployment has not applied yet (:mod:`~m3lab.ladder.advise`)."""
