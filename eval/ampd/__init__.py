"""`harness cluster bench`: AMPD against its baselines in virtual time (`bench`), its regime
map over deployments and ITL SLOs (`regime`) and the SLO-attainment plot (`plot`)."""
