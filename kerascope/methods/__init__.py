"""Explanation methods, one module per family, and the name -> class registry."""

from kerascope.methods.base import Method
from kerascope.methods.cam import CAM, GradCAM, GuidedGradCAM
from kerascope.methods.gradients import GradientXInput, GuidedBackprop, Saliency
from kerascope.methods.registry import available, describe, get, register

__all__ = [
    "CAM",
    "GradCAM",
    "GradientXInput",
    "GuidedBackprop",
    "GuidedGradCAM",
    "Method",
    "Saliency",
    "available",
    "describe",
    "get",
    "register",
]
