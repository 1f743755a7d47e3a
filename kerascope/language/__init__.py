"""Language models and transformers: token attributions and generated-text attribution."""
