"""Rule-based propagation: DeepLIFT and LRP rules, their walks and composites, batch-norm folding, the fused tiers."""
