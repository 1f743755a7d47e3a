"""Every registered method's name, class and one-line description, readable without a backend.

``kerascope methods`` and ``kerascope --help`` list methods from here, so they
never import Keras (and its TensorFlow / JAX / PyTorch backend). The registry
(:mod:`kerascope.methods.registry`) stays the source of behaviour;
``tests/test_cli_startup.py`` checks that the two agree, so a method added to
the registry without a line here fails the suite.
"""

from __future__ import annotations

from typing import NamedTuple


class Entry(NamedTuple):
    """One method: registry name, class name, defining module, one-line description.

    Example:
        >>> Entry("saliency", "Saliency", "kerascope.methods.gradients", "...").class_name
        'Saliency'
    """

    name: str
    class_name: str
    module: str
    description: str


METHODS: tuple[Entry, ...] = (
    Entry("ablationcam", "AblationCAM", "kerascope.methods.cam_perturbation",
          "Channels weighted by the relative score drop when each is zeroed (Desai & Ramaswamy 2020)."),
    Entry("attention_rollout", "AttentionRollout", "kerascope.methods.rollout",
          "Attention maps multiplied from the first layer to the last (Abnar & Zuidema 2020)."),
    Entry("blur_ig", "BlurIG", "kerascope.methods.guided_paths",
          "Integrated Gradients along a path of successively blurred inputs (Xu et al. 2020)."),
    Entry("deconvnet", "Deconvnet", "kerascope.methods.gradients",
          "Gradient with ReLUs passing back only positive gradients (Zeiler & Fergus 2014)."),
    Entry("deeplift", "DeepLIFT", "kerascope.methods.deeplift",
          "DeepLIFT rescale rule (Shrikumar et al. 2017); attributions sum to f(x) - f(baseline)."),
    Entry("deeplift_shap", "DeepLiftShap", "kerascope.methods.deeplift",
          "DeepLIFT averaged over background baselines (DeepSHAP; Lundberg & Lee 2017)."),
    Entry("eigencam", "EigenCAM", "kerascope.methods.cam_variants",
          "First principal component of the feature maps, class-agnostic (Muhammad & Yeasin 2020)."),
    Entry("eigengradcam", "EigenGradCAM", "kerascope.methods.cam_library_variants",
          "First principal component of gradient x activation, class-specific (pytorch-grad-cam)."),
    Entry("expected_gradients", "ExpectedGradients", "kerascope.methods.integrated",
          "Gradients x (input - baseline) averaged over random background baselines and path points "
          "(Erion et al. 2021)."),
    Entry("feature_ablation", "FeatureAblation", "kerascope.methods.coalitions",
          "Score drop when each feature (mask group) is set to a baseline (Captum FeatureAblation)."),
    Entry("fem", "FEM", "kerascope.methods.cam_library_variants",
          "Channels weighted by their fraction of k-sigma high activations, class-agnostic (Fuad et al. 2020)."),
    Entry("fullgrad", "FullGrad", "kerascope.methods.fullgrad",
          "Input-gradient map plus the bias-gradient maps of every convolutional layer (Srinivas & Fleuret 2019)."),
    Entry("gradcam", "GradCAM", "kerascope.methods.cam",
          "Feature maps weighted by their spatially averaged gradients (Selvaraju et al. 2017)."),
    Entry("gradcam_elementwise", "GradCAMElementWise", "kerascope.methods.cam_library_variants",
          "Positive element-wise gradient x activation products summed over channels (pytorch-grad-cam)."),
    Entry("gradcam_plusplus", "GradCAMPlusPlus", "kerascope.methods.cam_variants",
          "Grad-CAM with pixel-wise weights of positive gradients (Chattopadhay et al. 2018)."),
    Entry("gradient_rollout", "GradientRollout", "kerascope.methods.rollout",
          "Attention weighted by its gradient, (dA * A)^+, rolled out over the layers (Chefer et al. 2021)."),
    Entry("gradient_x_input", "GradientXInput", "kerascope.methods.gradients",
          "Input times its gradient (Shrikumar et al. 2016); for linear models the exact contribution."),
    Entry("guided_backprop", "GuidedBackprop", "kerascope.methods.gradients",
          "Gradient with positive-only ReLU backward passes (Springenberg et al. 2015)."),
    Entry("guided_gradcam", "GuidedGradCAM", "kerascope.methods.cam",
          "Guided backprop multiplied by the upsampled Grad-CAM map (Selvaraju et al. 2017)."),
    Entry("guided_ig", "GuidedIG", "kerascope.methods.guided_paths",
          "Integrated Gradients along an adaptive path moving low-gradient features first "
          "(Kapishnikov et al. 2021)."),
    Entry("hirescam", "HiResCAM", "kerascope.methods.cam_variants",
          "Element-wise gradient x activation summed over channels (Draelos & Carin 2020)."),
    Entry("hsic", "HSIC", "kerascope.methods.sensitivity",
          "Hilbert-Schmidt independence between each feature's mask and the score (Novello et al. 2022)."),
    Entry("integrated_gradients", "IntegratedGradients", "kerascope.methods.integrated",
          "Integral of gradients along a straight path from a baseline (Sundararajan et al. 2017)."),
    Entry("internal_influence", "InternalInfluence", "kerascope.methods.conductance",
          "Gradient at a layer integrated along the input path (Leino et al. 2018)."),
    Entry("kernel_shap", "KernelSHAP", "kerascope.methods.coalitions",
          "Shapley values by the Shapley-kernel weighted regression over coalitions (Lundberg & Lee 2017)."),
    Entry("kpcacam", "KPCACAM", "kerascope.methods.cam_library_variants",
          "First kernel principal component of the feature maps, class-agnostic (Karmani et al. 2024)."),
    Entry("layer_conductance", "LayerConductance", "kerascope.methods.conductance",
          "Each layer unit's share of the input path's gradient flow (Dhamdhere et al. 2018)."),
    Entry("layercam", "LayerCAM", "kerascope.methods.cam_variants",
          "Activations weighted element-wise by positive gradients (Jiang et al. 2021)."),
    Entry("lime", "LIME", "kerascope.methods.coalitions",
          "Weighted ridge surrogate over random coalitions of mask features (Ribeiro et al. 2016)."),
    Entry("lrp", "LRP", "kerascope.methods.lrp",
          "Layer-wise Relevance Propagation with zennit's rules and composites (Bach et al. 2015)."),
    Entry("neuron_conductance", "NeuronConductance", "kerascope.methods.conductance",
          "Integrated Gradients of the inputs flowing through one unit of a layer (Dhamdhere et al. 2018)."),
    Entry("occlusion", "Occlusion", "kerascope.methods.perturbation",
          "Score drop when sliding windows are replaced by a baseline (Zeiler & Fergus 2014)."),
    Entry("rise", "RISE", "kerascope.methods.perturbation",
          "Score-weighted average of random smooth masks (Petsiuk et al. 2018)."),
    Entry("saliency", "Saliency", "kerascope.methods.gradients",
          "Gradient of the target score w.r.t. the input (Simonyan et al. 2014)."),
    Entry("scorecam", "ScoreCAM", "kerascope.methods.cam_perturbation",
          "Channels weighted by the softmax of the scores of the inputs they mask (Wang et al. 2020)."),
    Entry("shapley_exact", "ShapleyExact", "kerascope.methods.coalitions",
          "Exact Shapley values of mask features over all 2^k coalitions."),
    Entry("shapley_sampling", "ShapleySampling", "kerascope.methods.coalitions",
          "Shapley values of mask features by permutation sampling (Captum ShapleyValueSampling)."),
    Entry("shapleycam", "ShapleyCAM", "kerascope.methods.shapley_cam",
          "Channels weighted by gradient minus half the Hessian-vector product, second order (Cai 2024)."),
    Entry("smoothgrad", "SmoothGrad", "kerascope.methods.smoothing",
          "Mean attribution over noisy copies of the input (Smilkov et al. 2017); wraps any gradient method."),
    Entry("smoothgrad_squared", "SmoothGradSquared", "kerascope.methods.smoothing",
          "Mean of squared attributions over noisy copies of the input (Hooker et al. 2019)."),
    Entry("sobol", "Sobol", "kerascope.methods.sensitivity",
          "Total Sobol indices of mask features by the Jansen estimator (Fel et al. 2021, Xplique)."),
    Entry("vargrad", "VarGrad", "kerascope.methods.smoothing",
          "Variance of attributions over noisy copies of the input (Adebayo et al. 2018)."),
    Entry("xgradcam", "XGradCAM", "kerascope.methods.cam_variants",
          "Gradients weighted by normalised activations, axiom-based (Fu et al. 2020)."),
    Entry("xrai", "XRAI", "kerascope.methods.xrai",
          "Regions grown greedily from the segments with the densest attribution (Kapishnikov et al. 2019)."),
)


def describe() -> list[tuple[str, str]]:
    """``(name, one-line description)`` for every method, sorted by name, without importing a backend.

    Example:
        >>> dict(describe())["gradcam"][:12]
        'Feature maps'
    """
    return sorted((entry.name, entry.description) for entry in METHODS)
