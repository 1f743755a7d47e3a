"""The differentiation core: the engine facade and its parts, inputs, targets, probes, output space."""
