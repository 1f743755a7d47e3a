"""Feature visualisation: images that maximise what a layer's channels respond to.

Every requested objective (one per row: a channel, a neuron, a direction, a class logit or a
weighted sum of them) is a linear function of the layer's output, ``sum(W_row * activation)``,
so all rows share one compiled step: the images of all channels are optimised together, the
channel axis folded into the batch, ``batch_size`` rows at a time.
"""

from __future__ import annotations

import hashlib
import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import numpy as np

from kerascope.core.engine import engine_for
from kerascope.core.optimize import compile_objective, fused_relu, layer_setup
from kerascope.core.progress import progress_bar
from kerascope.features.parametrize import MaCo, Parametrization, spectrum_magnitude
from kerascope.features.robustness import (
    affine_matrices,
    apply_transforms,
    penalty,
    resolve_regularizers,
    resolve_transforms,
)
from kerascope.numeric.chunking import check_batch_size

OBJECTIVES = ("channel", "neuron", "direction", "logit")


@dataclass
class FeatureVisualization:
    """What :func:`visualize_features` returns: images in ``[0, 1]`` and the objective curves.

    ``images`` is ``(rows, H, W, C)`` (one row per entry of ``channels``), ``objective`` the
    ``(rows, steps)`` value of each row's objective at every step (on the transformed image,
    without the regularisers), ``channels`` the entries as given.

    Example:
        >>> import numpy as np
        >>> r = FeatureVisualization(np.zeros((2, 4, 4, 3)), np.zeros((2, 8)), "conv", [0, 1])
        >>> r.images.shape, r.objective.shape
        ((2, 4, 4, 3), (2, 8))
    """

    images: np.ndarray
    objective: np.ndarray
    layer: str | None
    channels: list[Any]
    params: dict[str, Any] = field(default_factory=dict)

    def labels(self) -> list[str]:
        """A short label per row (``"channel 3"``, ``"direction 0"``, ...).

        Example:
            >>> FeatureVisualization(np.zeros((1, 1, 1, 1)), np.zeros((1, 1)), "c", [3]).labels()
            ['channel 3']
        """
        kind = self.params.get("objective", "channel")
        kind = kind if isinstance(kind, str) else "+".join(kind)
        out = []
        for i, entry in enumerate(self.channels):
            if isinstance(entry, (int, np.integer)):
                out.append(f"{kind} {int(entry)}")
            elif isinstance(entry, dict):
                out.append(" + ".join(f"{w:g}*{c}" for c, w in entry.items()))
            else:
                out.append(f"{kind} {i}")
        return out

    def save(self, directory: str | Path, title: str | None = None) -> list[Path]:
        """Write one PNG per row and an ``index.html`` grid into ``directory``; returns the PNG paths.

        Example:
            >>> import tempfile
            >>> r = FeatureVisualization(np.zeros((2, 4, 4, 3)), np.zeros((2, 8)), "conv", [0, 1])
            >>> [p.name for p in r.save(tempfile.mkdtemp())]
            ['channel_000.png', 'channel_001.png']
        """
        from PIL import Image

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for i, image in enumerate(self.images):
            pixels = (np.clip(image, 0.0, 1.0) * 255 + 0.5).astype(np.uint8)
            path = out / f"channel_{i:03d}.png"
            Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels).save(path)
            paths.append(path)
        heading = title or f"What each channel of {self.layer or 'the output'} detects"
        cells = "\n".join(
            f'<figure><img src="{p.name}" alt="{html.escape(label)}"><figcaption>{html.escape(label)}<br>'
            f"objective {curve[-1]:.3g}</figcaption></figure>"
            for p, label, curve in zip(paths, self.labels(), self.objective)
        )
        settings = html.escape(", ".join(f"{k}={v!r}" for k, v in self.params.items()))
        (out / "index.html").write_text(
            "<!doctype html><html><head><meta charset='utf-8'><title>" + html.escape(heading) + "</title><style>"
            "body{font-family:sans-serif}main{display:grid;grid-template-columns:repeat(auto-fill,minmax(140px,1fr));"
            "gap:8px}img{width:128px;image-rendering:pixelated}figure{margin:0}</style></head><body>"
            f"<h1>{html.escape(heading)}</h1><p>{settings}</p><main>{cells}</main></body></html>\n"
        )
        return paths


def _channel_count(layer_name: str, act_shape: tuple[int, ...]) -> int:
    if len(act_shape) < 1:
        raise ValueError(
            f"Layer {layer_name!r} has no channel axis: its output per sample has shape {act_shape}. Received: "
            f"layer={layer_name!r}. Pick a layer whose output is (batch, ..., channels)."
        )
    return act_shape[-1]


def _one_weight(kind: str, entry: Any, act_shape: tuple[int, ...], position: Any, layer_name: str) -> np.ndarray:
    """The weight tensor ``W`` of one objective kind for one entry (an int channel or a vector)."""
    channels = _channel_count(layer_name, act_shape)
    spatial = act_shape[:-1]
    weight = np.zeros(act_shape, np.float32)
    if kind == "direction" or not isinstance(entry, (int, np.integer)):
        vector = np.asarray(entry, np.float32)
        if vector.shape != (channels,) or kind == "neuron":
            raise ValueError(
                f"A {kind!r} objective takes " + ("a channel index" if kind == "neuron" else
                                                   f"a direction vector of length {channels}")
                + f" per entry of `channels`. Received: an entry of shape {vector.shape} for layer "
                f"{layer_name!r} with {channels} channels."
            )
        weight[...] = vector / max(1, int(np.prod(spatial)))
        return weight
    if not 0 <= int(entry) < channels:
        raise ValueError(
            f"Channel out of range. Received: channel {int(entry)} for layer {layer_name!r}, which has "
            f"{channels} channels (0 to {channels - 1})."
        )
    if kind == "neuron":
        where = tuple(d // 2 for d in spatial) if position is None else tuple(position)
        if len(where) != len(spatial) or any(not 0 <= p < d for p, d in zip(where, spatial)):
            raise ValueError(
                f"A neuron position needs one index per spatial axis of {spatial}. Received: position={position!r}."
            )
        weight[(*where, int(entry))] = 1.0
    else:  # channel (and a class logit): the mean over positions
        weight[..., int(entry)] = 1.0 / max(1, int(np.prod(spatial)))
    return weight


def objective_weights(objective: Any, channels: list[Any], act_shape: tuple[int, ...], position: Any = None,
                      layer_name: str = "layer") -> np.ndarray:
    """``(rows, *act_shape)`` weights ``W`` with each row's objective ``sum(W_row * activation)``.

    ``objective`` is a kind (``"channel"``, ``"neuron"``, ``"direction"``, ``"logit"``) or a dict
    ``{kind: weight}`` (a weighted sum of kinds); each entry of ``channels`` is a channel index,
    a dict ``{channel: weight}`` (a weighted sum of channels) or, for ``"direction"``, a vector.

    Example:
        >>> w = objective_weights("channel", [1], (2, 2, 3))
        >>> w.shape, float(w[0, ..., 1].sum()), float(w[0, ..., 0].sum())
        ((1, 2, 2, 3), 1.0, 0.0)
    """
    kinds = {objective: 1.0} if isinstance(objective, str) else dict(objective)
    bad = [k for k in kinds if k not in OBJECTIVES]
    if bad or not kinds:
        raise ValueError(
            f"Unknown objective. Received: objective={objective!r}. Expected one of {list(OBJECTIVES)} or a dict "
            "{kind: weight} of them (a weighted sum)."
        )
    rows = []
    for entry in channels:
        parts = entry.items() if isinstance(entry, dict) else [(entry, 1.0)]
        total = np.zeros(act_shape, np.float32)
        for kind, kind_weight in kinds.items():
            for channel, weight in parts:
                total += float(kind_weight) * float(weight) * _one_weight(kind, channel, act_shape, position,
                                                                            layer_name)
        rows.append(total)
    return np.stack(rows)


def _image_shape(model: keras.Layer, image_shape: Any) -> tuple[int, int, int]:
    if image_shape is None:
        try:
            shape = tuple(model.inputs[0].shape)[1:]
        except Exception:
            shape = ()
        if len(shape) != 3 or any(d is None for d in shape):
            raise ValueError(
                "Cannot tell the image size from the model (no fixed (H, W, C) input). Received: image_shape=None. "
                "Pass image_shape=(H, W, C)."
            )
        image_shape = shape
    if len(tuple(image_shape)) != 3 or any(int(d) < 1 for d in image_shape):
        raise ValueError(f"`image_shape` must be (H, W, C) with positive sizes. Received: image_shape={image_shape!r}.")
    return tuple(int(d) for d in image_shape)  # type: ignore[return-value]


def _check_steps(steps: Any) -> None:
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"`steps` must be a positive int. Received: steps={steps!r}.")


def visualize_features(
    model: keras.Layer,
    layer: str | keras.Layer | None = None,
    channels: Any = None,
    objective: str | dict[str, float] = "channel",
    parametrization: str = "fourier",
    transforms: str | dict[str, Any] | None = "default",
    regularizers: dict[str, float] | None = None,
    steps: int = 256,
    seed: int = 0,
    image_shape: tuple[int, int, int] | None = None,
    *,
    position: tuple[int, ...] | None = None,
    learning_rate: float = 0.05,
    pre_relu: bool = True,
    batch_size: int = 16,
    progress: bool = True,
    magnitude: Any = None,
    magnitude_from: Any = None,
) -> FeatureVisualization:
    """Optimise one image per entry of ``channels`` to maximise an objective of ``layer``'s output.

    Args:
        model: a Keras 3 model with one image input (``(H, W, C)``), values in ``[0, 1]``.
        layer: path of the layer to read (nested paths work); ``None`` with ``objective="logit"``:
            the model output (a final softmax bypassed).
        channels: one entry per image: a channel index, a dict ``{channel: weight}`` (a weighted
            sum), or a vector of length ``channels`` for ``"direction"``; ``None``: every channel.
        objective: ``"channel"`` (mean over positions), ``"neuron"`` (one position: ``position``,
            default the centre), ``"direction"`` (mean over positions of the dot product with a
            vector), ``"logit"`` (a class score) or a dict ``{kind: weight}`` summing kinds.
        parametrization: ``"pixel"``, ``"fourier"`` (Lucid) or ``"maco"`` (Fel et al. 2023).
            MaCo's fixed spectrum magnitude is ``magnitude`` or the mean spectrum of ``magnitude_from``,
            else the ``1 / f`` law of natural images (no download).
        transforms: ``"default"`` (jitter, zoom, rotation), ``None`` (off) or a dict of settings.
        regularizers: ``None`` or ``{"l1": w, "tv": w, "blur": w}`` penalties subtracted from the objective.
        steps: Adam steps (learning rate ``learning_rate``, Lucid's 0.05).
        seed: the same seed gives the same images (each row's randomness depends on the seed and
            its index only, so ``batch_size`` does not change the result).
        image_shape: ``(H, W, C)``; default the model's input shape.
        pre_relu: a ReLU fused into ``layer`` (``Conv2D(..., activation="relu")``) is skipped: the
            objective reads the value before it, so a channel that is off on the grey start image
            still gets a gradient (Lucid redirects ReLU gradients for the same reason). ``False``
            optimises the layer's output as it is.
        batch_size: images optimised together; bounds memory.
        progress: a progress bar over the steps.
        magnitude: MaCo only: the fixed magnitude, ``(h, w)`` or ``(channels, h, w)`` (resized to the
            image's half spectrum ``(H, W // 2 + 1)``), e.g. an average spectrum of natural images.
        magnitude_from: MaCo only: images ``(N, H', W', C)`` whose mean Fourier amplitude
            (:func:`kerascope.features.parametrize.spectrum_magnitude`) is the magnitude.

    Cost: ``steps`` forward and backward passes per ``batch_size`` images.

    Example:
        >>> import keras, numpy as np, kerascope as ks
        >>> m = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(4, 3, name="conv")])
        >>> r = ks.visualize_features(m, layer="conv", channels=[0, 1], steps=4, progress=False)
        >>> r.images.shape, r.objective.shape
        ((2, 16, 16, 3), (2, 4))
    """
    _check_steps(steps)
    check_batch_size(batch_size)
    shape = _image_shape(model, image_shape)
    engine = engine_for(model)
    if layer is None and objective != "logit":
        raise ValueError(
            f"Pass the layer to visualise. Received: layer=None with objective={objective!r}. Only "
            "objective='logit' reads the model output without a layer (see `kerascope.layers(model)`)."
        )
    target = engine.resolve_layers([layer])[0] if layer is not None else None
    layer_name = engine.path_of(target) if target is not None else "output"
    position_call, act_shape = layer_setup(engine, target, np.full((1, *shape), 0.5, np.float32))
    if channels is None:
        channels = list(range(_channel_count(layer_name, act_shape)))
    channels = list(channels)
    if not channels:
        raise ValueError("`channels` is empty. Received: channels=[]. Pass at least one channel.")
    weights = objective_weights(objective, channels, act_shape, position, layer_name)
    if magnitude is not None and magnitude_from is not None:
        raise ValueError("Pass `magnitude` or `magnitude_from`, not both. Received: both.")
    if magnitude_from is not None:
        if parametrization != "maco":
            raise ValueError(
                f"`magnitude_from` sets the MaCo spectrum. Received: parametrization={parametrization!r}. "
                "Pass parametrization='maco'."
            )
        magnitude = spectrum_magnitude(magnitude_from, shape, batch_size)
    param = Parametrization.create(parametrization, shape, magnitude=magnitude)
    spectrum = param.magnitude() if isinstance(param, MaCo) else None
    settings = resolve_transforms(transforms, shape)
    reg = resolve_regularizers(regularizers)
    rows = len(channels)
    rngs = [np.random.default_rng([int(seed), row]) for row in range(rows)]
    params = np.stack([param.init(1, rng)[0] for rng in rngs])
    matrices = None
    if settings is not None:
        matrices = np.stack([affine_matrices(settings, shape, steps, rng) for rng in rngs], axis=1)  # (steps, rows, 8)
    unfused = bool(pre_relu) and fused_relu(target)
    # one compiled step per setting, reused by later calls (MaCo's magnitude is a constant of the step)
    key = ("feature_step", id(target), position_call, parametrization, shape, settings is not None,
           tuple(sorted(reg.items())), act_shape, unfused,
           None if spectrum is None else hashlib.sha1(spectrum.tobytes()).hexdigest())
    run = engine.memo(key, lambda: compile_objective(
        engine, target, position_call, *_step_functions(param, settings, reg),
        input_specs=[((None, *param.param_shape()), "float32"), ((None, 8), "float32"),
                     ((None, *act_shape), "float32")], pre_activation=unfused))
    curves = np.zeros((rows, steps), np.float32)
    identity = np.tile(np.array([1, 0, 0, 0, 1, 0, 0, 0], np.float32), (rows, 1))
    starts = list(range(0, rows, batch_size))
    for chunk, step in progress_bar([(c, s) for c in starts for s in range(steps)], enabled=progress,
                                    desc="visualising", unit="step", leave=False):
        part = slice(chunk, min(chunk + batch_size, rows))
        if step == 0:
            first, second = np.zeros_like(params[part]), np.zeros_like(params[part])
        mats = matrices[step, part] if matrices is not None else identity[part]
        _, curves[part, step], grad = run([params[part], mats, weights[part]])
        first = 0.9 * first + 0.1 * grad  # Adam (ascent), as Lucid's tf.train.AdamOptimizer(0.05)
        second = 0.999 * second + 0.001 * grad * grad
        update = (first / (1 - 0.9 ** (step + 1))) / (np.sqrt(second / (1 - 0.999 ** (step + 1))) + 1e-8)
        params[part] = params[part] + learning_rate * update
    images = np.concatenate([keras.ops.convert_to_numpy(param.image(params[start:start + batch_size]))
                             for start in starts])
    return FeatureVisualization(
        images=images.astype(np.float32), objective=curves, layer=None if target is None else layer_name,
        channels=channels,
        params={"objective": objective, "parametrization": parametrization, "transforms": transforms,
                "regularizers": regularizers, "steps": steps, "seed": seed, "learning_rate": learning_rate,
                "pre_relu": unfused, **({} if magnitude is None else {"magnitude": "from images" if magnitude_from is not None else "given"})},
    )


def _step_functions(param: Parametrization, settings: dict | None, reg: dict[str, float]) -> tuple[Any, Any]:
    """``make_input(arrays)`` and ``score(activation, arrays)`` of the compiled step."""
    seen: dict[str, Any] = {}

    def make_input(arrays: list[Any]) -> Any:
        image = param.image(arrays[0])
        seen["image"] = image  # the same trace reads it in `score` (the penalty is on the untransformed image)
        return apply_transforms(image, arrays[1]) if settings is not None else image

    def score(activation: Any, arrays: list[Any]) -> tuple[Any, Any]:
        axes = tuple(range(1, len(activation.shape)))
        objective = keras.ops.sum(activation * arrays[2], axis=axes)
        return objective, penalty(seen.pop("image"), reg) if reg else 0.0

    return make_input, score
