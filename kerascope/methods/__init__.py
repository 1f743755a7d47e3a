"""Explanation methods, one module per family, the name -> class registry and the method factory."""

# ruff: noqa: F401 - the imports below ARE the public API; `__all__` is computed from the catalogue

from kerascope.catalog import METHODS
from kerascope.methods.base import Method
from kerascope.methods.cam import CAM, GradCAM, GuidedGradCAM
from kerascope.methods.cam_library_variants import FEM, KPCACAM, EigenGradCAM, GradCAMElementWise
from kerascope.methods.cam_perturbation import AblationCAM, ScoreCAM
from kerascope.methods.cam_variants import EigenCAM, GradCAMPlusPlus, HiResCAM, LayerCAM, XGradCAM
from kerascope.methods.coalitions import LIME, FeatureAblation, KernelSHAP, ShapleyExact, ShapleySampling
from kerascope.methods.conductance import InternalInfluence, LayerConductance, NeuronConductance
from kerascope.methods.deeplift import DeepLIFT, DeepLiftShap
from kerascope.methods.fullgrad import FullGrad
from kerascope.methods.gradients import Deconvnet, GradientXInput, GuidedBackprop, Saliency
from kerascope.methods.guided_paths import BlurIG, GuidedIG
from kerascope.methods.integrated import ExpectedGradients, GradientSHAP, IntegratedGradients
from kerascope.methods.lrp import LRP
from kerascope.methods.perturbation import RISE, Occlusion
from kerascope.methods.registry import available, build, describe, get, register
from kerascope.methods.rollout import AttentionRollout, GradientRollout
from kerascope.methods.sensitivity import HSIC, Sobol
from kerascope.methods.shapley_cam import ShapleyCAM
from kerascope.methods.smoothing import SmoothGrad, SmoothGradSquared, VarGrad
from kerascope.methods.xrai import XRAI

# One source for the method names: the catalogue (which tests/test_cli_startup.py checks against the registry);
# `kerascope.__all__` is built from it too. Below: the names that are not registered methods.
__all__ = sorted(
    {entry.class_name for entry in METHODS}
    | {"CAM", "GradientSHAP", "Method", "available", "build", "describe", "get", "register"}
)
