"""Explanation quality metrics: faithfulness, localisation and sanity checks, and Quantus's metric families
(complexity, localisation, faithfulness, robustness, randomisation, axiomatic; see docs/evaluation.md).

Each metric takes the model (where it needs one), the inputs, the
attributions (or an :class:`~kerascope.Explanation`) and targets, and returns
a small result object with per-sample ``scores`` and an ``aggregate``.

Example:
    >>> import numpy as np
    >>> from kerascope import metrics
    >>> a = np.zeros((1, 4, 4)); a[0, 0, 0] = 1.0
    >>> m = np.zeros((1, 4, 4), bool); m[0, :2, :2] = True
    >>> metrics.pointing_game(a, m).aggregate
    1.0
"""

from kerascope.metrics._common import MetricResult, to_maps
from kerascope.metrics.axiomatic import completeness, input_invariance, non_sensitivity, shifted_copy
from kerascope.metrics.complexity_metrics import complexity, effective_complexity, sparseness
from kerascope.metrics.faithfulness import (
    CurveResult,
    average_drop,
    average_increase,
    deletion,
    insertion,
    mu_fidelity,
)
from kerascope.metrics.faithfulness_curves import (
    faithfulness_estimate,
    monotonicity,
    pixel_flipping,
    region_perturbation,
    selectivity,
)
from kerascope.metrics.faithfulness_sampled import faithfulness_correlation, infidelity, irof, sensitivity_n
from kerascope.metrics.localisation import (
    attribution_localisation,
    auc,
    boxes_to_masks,
    energy_pointing_game,
    focus,
    pointing_game,
    relevance_mass_accuracy,
    relevance_rank_accuracy,
    top_k_intersection,
)
from kerascope.metrics.mprt import discrete_entropy, efficient_mprt, mprt, smooth_mprt
from kerascope.metrics.pic import pic
from kerascope.metrics.randomisation import random_logit, ssim_1d
from kerascope.metrics.road import linear_imputation, road
from kerascope.metrics.robustness import (
    avg_sensitivity,
    consistency,
    local_lipschitz_estimate,
    max_sensitivity,
    relative_input_stability,
    relative_output_stability,
)
from kerascope.metrics.sanity import (
    SanityResult,
    copy_model,
    data_randomisation,
    model_randomisation,
    randomise_layer,
    spearman,
    ssim,
    weighted_layers,
)

__all__ = [
    "CurveResult",
    "MetricResult",
    "SanityResult",
    "attribution_localisation",
    "auc",
    "average_drop",
    "average_increase",
    "avg_sensitivity",
    "boxes_to_masks",
    "completeness",
    "complexity",
    "consistency",
    "copy_model",
    "data_randomisation",
    "deletion",
    "discrete_entropy",
    "effective_complexity",
    "efficient_mprt",
    "energy_pointing_game",
    "faithfulness_correlation",
    "faithfulness_estimate",
    "focus",
    "infidelity",
    "input_invariance",
    "insertion",
    "irof",
    "linear_imputation",
    "local_lipschitz_estimate",
    "max_sensitivity",
    "model_randomisation",
    "monotonicity",
    "mprt",
    "mu_fidelity",
    "non_sensitivity",
    "pic",
    "pixel_flipping",
    "pointing_game",
    "random_logit",
    "randomise_layer",
    "region_perturbation",
    "relative_input_stability",
    "relative_output_stability",
    "relevance_mass_accuracy",
    "relevance_rank_accuracy",
    "road",
    "selectivity",
    "sensitivity_n",
    "shifted_copy",
    "smooth_mprt",
    "sparseness",
    "spearman",
    "ssim",
    "ssim_1d",
    "to_maps",
    "top_k_intersection",
    "weighted_layers",
]
