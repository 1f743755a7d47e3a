"""Concept explanations of a layer: TCAV (Kim et al. 2018) and CRAFT (Fel et al. 2023)."""
