"""Training-time explanations: overlays written to TensorBoard and/or PNG files during ``model.fit``.

Example:
    >>> import keras, numpy as np, tempfile, kerascope as ks
    >>> model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(2, 3, name="conv"),
    ...                           keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
    >>> model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    >>> x, y = np.random.rand(4, 8, 8, 3), np.array([0, 1, 0, 1])
    >>> cb = ks.callbacks.ExplanationCallback(x[:2], method="gradcam", layer="conv", png_dir=tempfile.mkdtemp())
    >>> _ = model.fit(x, y, epochs=1, verbose=0, callbacks=[cb])
    >>> len(cb.written)
    2
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np

from kerascope.methods.registry import build, check_common, method_name, resolve
from kerascope.viz.overlay import overlay


def write_image_summary(tag: str, images: np.ndarray, step: int, description: str = "") -> None:
    """Write RGB uint8 images ``(N, H, W, 3)`` as one TensorBoard image summary to the default writer.

    Produces the same record as ``tf.summary.image`` (image-plugin metadata,
    a string tensor ``[width, height, png_0, png_1, ...]``) but needs only
    TensorFlow, not the ``tensorboard`` package, to write it.

    Example:
        >>> import numpy as np, tempfile, tensorflow as tf
        >>> with tf.summary.create_file_writer(tempfile.mkdtemp()).as_default():
        ...     write_image_summary("demo", np.zeros((1, 4, 4, 3), np.uint8), step=0)
    """
    import tensorflow as tf
    from tensorflow.core.framework import summary_pb2

    images = np.asarray(images, np.uint8)
    if images.ndim != 4 or images.shape[-1] not in (1, 3, 4):
        raise ValueError(f"Expected uint8 images of shape (N, H, W, 1|3|4). Received: shape={images.shape}.")
    metadata = summary_pb2.SummaryMetadata(
        summary_description=description,
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="images", content=b""),
    )
    encoded = [tf.io.encode_png(image) for image in images]
    tensor = tf.stack([tf.as_string(images.shape[2]), tf.as_string(images.shape[1]), *encoded])
    tf.summary.write(tag, tensor, step=step, metadata=metadata)


class ExplanationCallback(keras.callbacks.Callback):
    """Explain a few fixed images every ``every`` epochs during ``model.fit`` and log the overlays.

    Writes, after each logged epoch, one TensorBoard image summary per method
    (tag ``"<tag>/<method>"``, step = epoch index, as ``keras.callbacks.TensorBoard``
    does; all images in one summary) under ``log_dir/explanations``, and/or one PNG per
    image and method as ``png_dir/<method>/epoch<E>_<i>.png`` (``E`` counted from 1,
    as Keras prints epochs). The explanation runs in inference mode on the current
    weights and touches neither the weights nor the optimizer, so training is
    unchanged; its only cost is the explanation itself (``seconds`` records it).

    Args:
        images: the inputs to explain each time (a small batch, model-ready).
        method: a method name (``"gradcam"``, ``"saliency"``, ...), a Method class,
            or a list of them.
        targets: classes to explain (int, one per image, or ``None`` = the class
            predicted at that epoch).
        every: log every ``every`` epochs (epochs ``every, 2*every, ...``).
        log_dir: TensorBoard folder (needs TensorFlow installed, any Keras backend).
        png_dir: folder for PNG overlays.
        cmap, alpha: overlay colormap and opacity.
        tag: prefix of the TensorBoard tags.
        batch_size: batch size of the explanation.
        **method_params: hyper-parameters for the method(s), e.g. ``layer="conv3"``; with
            several methods each gets those its constructor accepts.

    Example:
        >>> cb = ExplanationCallback(np.zeros((2, 8, 8, 3)), method="saliency", every=2, png_dir="pngs")
        >>> cb.every, cb.methods
        (2, ['saliency'])
    """

    def __init__(
        self,
        images: Any,
        method: str | type | Sequence[str | type] = "gradcam",
        *,
        targets: Any = None,
        every: int = 1,
        log_dir: str | Path | None = None,
        png_dir: str | Path | None = None,
        cmap: str = "jet",
        alpha: float = 0.5,
        tag: str = "kerascope",
        batch_size: int = 32,
        **method_params: Any,
    ) -> None:
        super().__init__()
        if log_dir is None and png_dir is None:
            raise ValueError(
                "ExplanationCallback needs somewhere to write. Received: log_dir=None, png_dir=None. "
                "Pass log_dir= (TensorBoard) and/or png_dir= (PNG files)."
            )
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"`every` must be a positive integer. Received: every={every!r}.")
        self.images = images
        self.method_classes = [resolve(m) for m in ([method] if isinstance(method, (str, type)) else list(method))]
        self.methods = [method_name(c) for c in self.method_classes]
        self.targets = targets
        self.every = every
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.png_dir = Path(png_dir) if png_dir is not None else None
        self.cmap = cmap
        self.alpha = alpha
        self.tag = tag
        self.batch_size = batch_size
        self.method_params = method_params
        check_common(self.method_classes, method_params)
        self.written: list[Path] = []
        self.summaries = 0
        self.seconds: list[float] = []
        self._writer: Any = None
        self._display = self._display_images(images)

    @staticmethod
    def _display_images(images: Any) -> np.ndarray | None:
        first = images[0] if isinstance(images, (list, tuple)) else images
        first = next(iter(images.values())) if isinstance(images, dict) else first
        array = np.asarray(first)
        return array if array.ndim in (3, 4) else None

    def on_train_begin(self, logs: dict | None = None) -> None:
        if self.log_dir is not None and self._writer is None:
            import tensorflow as tf

            self._writer = tf.summary.create_file_writer(str(self.log_dir / "explanations"))

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if (epoch + 1) % self.every:
            return
        start = time.perf_counter()
        for cls, name in zip(self.method_classes, self.methods):
            explainer = build(cls, self.model, common={"batch_size": self.batch_size, **self.method_params})
            explanation = explainer.explain(self.images, self.targets)
            attributions = explanation.attributions
            attributions = attributions[0] if isinstance(attributions, (list, tuple)) else attributions
            if self._display is None:
                raise ValueError(
                    "ExplanationCallback draws image overlays. Received: inputs whose first array has shape "
                    f"{np.shape(self.images)}; expected images (N, H, W, C)."
                )
            pictures = np.stack([
                overlay(image, attribution, cmap=self.cmap, alpha=self.alpha)
                for image, attribution in zip(self._display, attributions)
            ])
            if self.png_dir is not None:
                self._write_pngs(name, epoch, pictures)
            if self._writer is not None:
                with self._writer.as_default():
                    write_image_summary(
                        f"{self.tag}/{name}", pictures, step=epoch,
                        description=f"{name} overlays, targets {explanation.targets.tolist()}",
                    )
                self._writer.flush()
                self.summaries += 1
        self.seconds.append(time.perf_counter() - start)

    def _write_pngs(self, method: str, epoch: int, pictures: np.ndarray) -> None:
        from PIL import Image

        folder = self.png_dir / method  # type: ignore[operator]
        folder.mkdir(parents=True, exist_ok=True)
        for i, picture in enumerate(pictures):
            path = folder / f"epoch{epoch + 1:04d}_{i:03d}.png"
            Image.fromarray(picture).save(path)
            self.written.append(path)

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
