"""What a layer has learned: feature visualisation."""
