"""Explanation methods, one module per family, and the name -> class registry."""

from kerascope.methods.base import Method
from kerascope.methods.cam import CAM, GradCAM, GuidedGradCAM
from kerascope.methods.cam_perturbation import AblationCAM, ScoreCAM
from kerascope.methods.cam_variants import EigenCAM, GradCAMPlusPlus, HiResCAM, LayerCAM, XGradCAM
from kerascope.methods.coalitions import LIME, FeatureAblation, KernelSHAP, ShapleyExact, ShapleySampling
from kerascope.methods.deeplift import Deconvnet, DeepLIFT, DeepLiftShap
from kerascope.methods.gradients import GradientXInput, GuidedBackprop, Saliency
from kerascope.methods.integrated import ExpectedGradients, GradientSHAP, IntegratedGradients
from kerascope.methods.perturbation import RISE, Occlusion
from kerascope.methods.registry import available, describe, get, register
from kerascope.methods.smoothing import SmoothGrad, SmoothGradSquared, VarGrad

__all__ = [
    "AblationCAM",
    "CAM",
    "Deconvnet",
    "DeepLIFT",
    "DeepLiftShap",
    "EigenCAM",
    "ExpectedGradients",
    "FeatureAblation",
    "GradCAM",
    "GradCAMPlusPlus",
    "GradientSHAP",
    "GradientXInput",
    "GuidedBackprop",
    "GuidedGradCAM",
    "HiResCAM",
    "IntegratedGradients",
    "KernelSHAP",
    "LIME",
    "LayerCAM",
    "Method",
    "Occlusion",
    "RISE",
    "Saliency",
    "ScoreCAM",
    "ShapleyExact",
    "ShapleySampling",
    "SmoothGrad",
    "SmoothGradSquared",
    "VarGrad",
    "XGradCAM",
    "available",
    "describe",
    "get",
    "register",
]
