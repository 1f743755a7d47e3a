"""One module per family of scenarios; each registers its own with ``bench.scenario.scenario``."""
