"""The ground-truth benchmark: every method on data whose object locations are known.

:func:`benchmark` explains a set of images with each method (for the
ground-truth class), then measures localisation (pointing game, energy
pointing game against the object masks), faithfulness (deletion / insertion
AUC), the cascading model-randomisation sanity check and time per image. By
default it runs the bundled demo model on freshly generated shapes images
(:func:`kerascope.data.generate_shapes`), plus two reference rows: a seeded
random map and a constant map.
"""

from __future__ import annotations

import csv
import inspect
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import keras
import numpy as np

from kerascope.core.progress import Progress, progress_scope
from kerascope.evaluation_metrics import (
    BUILTIN,
    Context,
    MetricCell,
    check_metrics,
    columns_of,
    plot_metrics,  # noqa: F401 - re-exported
    score_metric,
)
from kerascope.methods.base import UnsupportedModelError
from kerascope.metrics import deletion, energy_pointing_game, insertion, model_randomisation, pointing_game
from kerascope.metrics._common import to_maps
from kerascope.metrics.sanity import SanityResult
from kerascope.viz.benchmark_plots import plot_curves, plot_sanity, plot_sanity_curves  # noqa: F401 - re-exported

#: Columns of the benchmark table, with the direction that is better.
COLUMNS = {
    "pointing_game": "higher",
    "energy_pointing_game": "higher",
    "deletion_auc": "lower",
    "insertion_auc": "higher",
    "sanity_spearman": "lower",
    "sanity_ssim": "lower",
    "seconds_per_image": "lower",
}


def random_map(seed: int = 0) -> Callable[[keras.Layer, Any, Any], np.ndarray]:
    """A reference "method": uniform random maps, the same for the same input shape and seed.

    Example:
        >>> import numpy as np
        >>> random_map(0)(None, np.zeros((2, 4, 4, 3)), None).shape
        (2, 4, 4)
    """

    def random(model: keras.Layer, inputs: Any, targets: Any) -> np.ndarray:
        x = np.asarray(inputs)
        return np.random.default_rng(seed).random(x.shape[:3]).astype(np.float32)

    return random


def constant_map(model: keras.Layer, inputs: Any, targets: Any) -> np.ndarray:
    """A reference "method": the same value everywhere.

    Example:
        >>> import numpy as np
        >>> constant_map(None, np.zeros((1, 2, 2, 3)), None).tolist()
        [[[1.0, 1.0], [1.0, 1.0]]]
    """
    return np.ones(np.asarray(inputs).shape[:3], np.float32)


@dataclass
class MethodScores:
    """One row of the benchmark: aggregate scores of one method (NaN where it failed).

    Example:
        >>> MethodScores("gradcam", pointing_game=0.9).row()["pointing_game"]
        0.9
    """

    method: str
    pointing_game: float = math.nan
    energy_pointing_game: float = math.nan
    deletion_auc: float = math.nan
    insertion_auc: float = math.nan
    sanity_spearman: float = math.nan
    sanity_ssim: float = math.nan
    seconds_per_image: float = math.nan
    error: str = ""
    applicable: bool = True
    deletion_curve: np.ndarray | None = None
    insertion_curve: np.ndarray | None = None
    sanity: SanityResult | None = None
    cells: dict[str, MetricCell] = field(default_factory=dict)

    def value(self, column: str) -> float:
        """The aggregate of one column: the mean over images of a metric column, else the attribute.

        Example:
            >>> MethodScores("x", deletion_auc=0.25).value("deletion_auc")
            0.25
        """
        if column in self.cells:
            return self.cells[column].mean
        return getattr(self, column, math.nan)

    def row(self, columns: Sequence[str] | None = None) -> dict[str, Any]:
        """The table row: method, the ``columns`` (default :data:`COLUMNS`) values, for metric columns
        their interval as ``<column>_low`` / ``<column>_high``, and the error (if any).

        Example:
            >>> list(MethodScores("x").row())[:2]
            ['method', 'pointing_game']
        """
        out: dict[str, Any] = {"method": self.method}
        for c in (COLUMNS if columns is None else columns):
            out[c] = self.value(c)
            if c in self.cells:
                out[f"{c}_low"], out[f"{c}_high"] = self.cells[c].low, self.cells[c].high
        return {**out, "error": self.error}


@dataclass
class BenchmarkResult:
    """All rows plus what was run (model, image count, settings).

    Example:
        >>> r = BenchmarkResult([MethodScores("a", pointing_game=1.0)], np.linspace(0, 1, 3), {"images": 2})
        >>> r.markdown().splitlines()[0].startswith("| method")
        True
    """

    rows: list[MethodScores]
    fractions: np.ndarray
    config: dict[str, Any] = field(default_factory=dict)
    columns: list[str] = field(default_factory=lambda: list(COLUMNS))

    def direction(self, column: str) -> str:
        """``"higher"`` or ``"lower"``: which values of ``column`` are better.

        Example:
            >>> BenchmarkResult([], np.zeros(1)).direction("deletion_auc")
            'lower'
        """
        if column in COLUMNS:
            return COLUMNS[column]
        for r in self.rows:
            if column in r.cells:
                return "higher" if r.cells[column].higher_is_better else "lower"
        return "higher"

    def table(self) -> list[dict[str, Any]]:
        """Rows as dicts (for CSV, the HTML report, JSON).

        Example:
            >>> BenchmarkResult([MethodScores("a")], np.zeros(1)).table()[0]["method"]
            'a'
        """
        return [r.row(self.columns) for r in self.rows]

    def get(self, method: str) -> MethodScores:
        """The row of one method.

        Example:
            >>> BenchmarkResult([MethodScores("a")], np.zeros(1)).get("a").method
            'a'
        """
        for r in self.rows:
            if r.method == method:
                return r
        raise ValueError(f"No such method in the benchmark. Received: method={method!r}. "
                         f"Available: {[r.method for r in self.rows]}.")

    def write_csv(self, path: str | Path) -> Path:
        """Write the table as CSV (full precision); returns the path.

        Example:
            >>> import tempfile, os
            >>> p = BenchmarkResult([MethodScores("a")], np.zeros(1)).write_csv(
            ...     os.path.join(tempfile.mkdtemp(), "b.csv"))
            >>> p.read_text().splitlines()[0].split(",")[:2]
            ['method', 'pointing_game']
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = self.table()
        with path.open("w", newline="", encoding="utf-8") as f:
            names = list(dict.fromkeys(k for r in rows for k in r)) or ["method"]
            writer = csv.DictWriter(f, fieldnames=names, restval="")
            writer.writeheader()
            writer.writerows(rows)
        return path

    def markdown(self) -> str:
        """The table as GitHub Markdown (3 decimals; arrows give the better direction; a metric column's cell
        is ``mean ± half-width`` of its confidence interval over the images, or ``mean [low, high]``).

        Example:
            >>> print(BenchmarkResult([MethodScores("a", pointing_game=0.5)], np.zeros(1)).markdown().splitlines()[2])
            | a | 0.500 | – | – | – | – | – | – |
        """
        arrows = {"higher": "↑", "lower": "↓"}
        head = "| method | " + " | ".join(f"{c.replace('_', ' ')} {arrows[self.direction(c)]}"
                                         for c in self.columns) + " |"
        sep = "|" + "---|" * (len(self.columns) + 1)
        lines = [head, sep]
        for r in self.rows:
            cells = []
            for c in self.columns:
                v = r.value(c)
                if c in r.cells and np.isfinite(v):
                    cells.append(r.cells[c].text())
                    continue
                cells.append("–" if v is None or not np.isfinite(v) else (f"{v:.4f}" if c == "seconds_per_image" else f"{v:.3f}"))
            name = r.method + (f" (failed: {r.error})" if r.error and r.applicable else
                               f" ({r.error})" if r.error else "")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        failed = [f"- {r.method}, {c}: {r.cells[c].error}" for r in self.rows for c in self.columns
                  if c in r.cells and r.cells[c].error]
        return "\n".join(lines + (["", "Metrics that failed:", *failed] if failed else []))


def _input_size(model: keras.Layer) -> tuple[int, int]:
    try:
        shape = model.inputs[0].shape
        if shape[1] is not None and shape[2] is not None:
            return int(shape[1]), int(shape[2])
    except Exception:  # noqa: BLE001 - subclassed models have no `inputs`
        pass
    return 64, 64


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def plain_text(text: str) -> str:
    """``text`` without terminal colour codes and with one-line whitespace (for table cells).

    Example:
        >>> plain_text("\\x1b[1mValueError\\x1b[0m: bad\\n  shape")
        'ValueError: bad shape'
    """
    return " ".join(_ANSI.sub("", text).split())


def _describe_array(name: str, array: Any) -> str:
    return f"{name} {tuple(array.shape)} {array.dtype}"


def check_data(
    model: keras.Layer,
    images: Any,
    masks: Any,
    labels: Any = None,
    *,
    source: str = "DATA",
) -> None:
    """Raise one ``ValueError`` listing every way ``model`` and the benchmark data do not fit.

    Checked before any work: the data's shapes and dtypes (images ``(N, H, W, C)`` numeric,
    masks ``(N, H, W)``, labels ``(N,)`` integers), the images against the model's input
    (size where it is fixed, channels), the labels against the model's number of classes,
    and for the generated shapes data (``source="generated"``) that the model has one output
    per shape class.

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(7)])
        >>> check_data(m, np.zeros((2, 8, 8, 3)), np.zeros((2, 8, 8), bool), np.array([0, 9]))
        Traceback (most recent call last):
        ...
        ValueError: The model does not fit the data in DATA: images have 3 channel(s) but the model takes 1; labels go up to 9 but the model has 7 classes (0..6). Received: model input (None, 8, 8, 1), output (None, 7); images (2, 8, 8, 3) float64, masks (2, 8, 8) bool, labels (2,) int64. ...
    """
    images, masks = np.asarray(images), np.asarray(masks)
    labels = None if labels is None else np.asarray(labels)
    problems: list[str] = []
    if images.ndim != 4:
        problems.append(f"images must be (N, H, W, C), found {images.ndim} dimension(s)")
    if images.dtype == bool or not np.issubdtype(images.dtype, np.number):
        problems.append(f"images must be numbers, found dtype {images.dtype}")
    if masks.ndim != 3 or (images.ndim == 4 and tuple(masks.shape) != tuple(images.shape[:3])):
        problems.append(f"masks must be (N, H, W) matching the images {tuple(images.shape[:3])}, found "
                        f"{tuple(masks.shape)}")
    if labels is not None:
        if labels.ndim != 1 or len(labels) != len(images):
            problems.append(f"labels must be ({len(images)},), one class per image, found {tuple(labels.shape)}")
        elif labels.size and not np.issubdtype(labels.dtype, np.integer):
            problems.append(f"labels must be integer class indices, found dtype {labels.dtype}")
    try:
        inputs = list(model.inputs)
        model_in = tuple(inputs[0].shape)
    except Exception:  # noqa: BLE001 - a subclassed model without known inputs: nothing to compare
        inputs, model_in = [None], None
    try:
        model_out = tuple(model.outputs[0].shape) if len(model.outputs) == 1 else None
    except Exception:  # noqa: BLE001
        model_out = None
    if len(inputs) > 1:
        problems.append(f"the benchmark takes single-input image models, this one has {len(inputs)} inputs")
    elif model_in is not None and images.ndim == 4:
        if len(model_in) != 4:
            problems.append(f"the model's input is not an image batch (N, H, W, C): {model_in}")
        else:
            if model_in[3] is not None and images.shape[3] != model_in[3]:
                problems.append(f"images have {images.shape[3]} channel(s) but the model takes {model_in[3]}")
            fixed = [(d, v) for d, v in zip(model_in[1:3], images.shape[1:3]) if d is not None]
            if any(d != v for d, v in fixed):
                problems.append(f"images are {images.shape[1]}x{images.shape[2]} but the model takes "
                                f"{model_in[1]}x{model_in[2]}")
    classes = int(model_out[-1]) if model_out is not None and len(model_out) == 2 and model_out[-1] else None
    if classes is not None and labels is not None and labels.size and np.issubdtype(labels.dtype, np.integer):
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= classes:
            problems.append(f"labels go up to {high} but the model has {classes} classes (0..{classes - 1})"
                            if high >= classes else f"labels must be >= 0, found {low}")
    if source == "generated" and classes is not None:
        from kerascope.data import CLASS_NAMES

        if classes != len(CLASS_NAMES):
            problems.append(f"the generated shapes data has {len(CLASS_NAMES)} classes ({', '.join(CLASS_NAMES)}) "
                            f"but the model has {classes}")
    if not problems:
        return
    where = "the generated shapes data" if source == "generated" else f"the data in {source}"
    parts = [_describe_array("images", images), _describe_array("masks", masks)]
    if labels is not None:
        parts.append(_describe_array("labels", labels))
    raise ValueError(
        f"The model does not fit {where}: {'; '.join(problems)}. Received: model input {model_in}, output "
        f"{model_out}; {', '.join(parts)}. Evaluate a model on data made for it: build an .npz from your own "
        "images and masks with `kerascope evaluate-data IMAGES_DIR MASKS_DIR --model MODEL_FILE --out data.npz` "
        "(docs/evaluation.md)."
    )


def bundled_data(n: int = 32, seed: int = 2024, size: int = 64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Images, labels and object masks for the bundled benchmark (generated, nothing downloaded).

    Example:
        >>> x, y, m = bundled_data(2, size=16)
        >>> x.shape, y.shape, m.shape
        ((2, 16, 16, 3), (2,), (2, 16, 16))
    """
    from kerascope.data import generate_shapes

    return generate_shapes(n, size=size, seed=seed)


#: Methods the default run (every registered method) leaves out, with why: their cost at their own defaults is
#: out of proportion with the rest. Naming one in ``methods=`` (``--methods``) runs it.
NOT_RUN_BY_DEFAULT = {
    "shapley_exact": "all 2^16 coalitions of its default 4 x 4 grid, 65,536 forward passes per image and about "
                     "4 minutes per image on 2 CPU cores; name it in --methods to run it",
}


def _explainers(methods: Sequence[Any] | None, baselines: bool, batch_size: int, seed: int) -> list[tuple[str, Any]]:
    from kerascope.methods.base import Method
    from kerascope.methods.registry import available, method_name, resolve

    chosen: list[tuple[str, Any]] = []
    for m in (sorted(set(available()) - set(NOT_RUN_BY_DEFAULT)) if methods is None else methods):
        spec = resolve(m)
        if isinstance(spec, Method):  # the benchmark re-builds each method on randomised copies of the model
            raise TypeError(f"Methods must be names, Method classes or callables. Received: {m!r}.")
        chosen.append((method_name(spec), spec))
    if baselines:
        chosen += [("random (reference)", random_map(seed)), ("constant (reference)", constant_map)]
    return chosen


def _required_arguments(spec: Any) -> list[str]:
    """The keyword-only arguments without a default a method class needs (``layer``, ``neuron``); none for callables.

    Example:
        >>> from kerascope.methods.conductance import NeuronConductance
        >>> _required_arguments(NeuronConductance), _required_arguments(lambda model, x, t: x)
        (['layer', 'neuron'], [])
    """
    if not isinstance(spec, type):
        return []
    parameters = inspect.signature(spec.__init__).parameters.values()
    return [p.name for p in parameters if p.kind is p.KEYWORD_ONLY and p.default is p.empty]


def _runner(spec: Any, batch_size: int) -> Callable[[keras.Layer, Any, Any], np.ndarray]:
    from kerascope.methods.registry import build

    if isinstance(spec, type):
        return lambda model, x, t: build(spec, model, common={"batch_size": batch_size}).explain(x, t).attributions
    return spec  # a callable is called as it is: it may return anything `to_maps` reads


def benchmark(
    model: keras.Layer | None = None,
    images: np.ndarray | None = None,
    masks: np.ndarray | None = None,
    labels: np.ndarray | None = None,
    methods: Sequence[Any] | None = None,
    *,
    n: int = 32,
    seed: int = 2024,
    steps: int = 16,
    sanity_images: int = 4,
    batch_size: int = 64,
    baselines: bool = True,
    deletion_perturbation: str | float = "blur",
    insertion_perturbation: str | float = "zero",
    metrics: Sequence[str] | None = None,
    metric_params: dict[str, dict[str, Any]] | None = None,
    level: float = 0.95,
    interval: str = "t",
    on_method: Callable[[str], None] | None = None,
    progress: Progress = False,
) -> BenchmarkResult:
    """Run every method (default: all registered) through the ground-truth benchmark.

    Per method: the images are explained for ``labels`` (the ground-truth
    classes; None = predicted classes), then pointing game and energy pointing
    game against ``masks``, deletion AUC (removed pixels blurred) and insertion
    AUC (starting from a black image) of the probability with ``steps`` steps, the cascading randomisation check on the
    first ``sanity_images`` images (similarity when every layer is randomised),
    and seconds per image (after one warm-up call on one image, so tracing is
    not counted). A method that fails gets a row with its error.

    Args:
        model: a Keras classifier; default the bundled demo model.
        images, masks, labels: the data; default ``n`` generated shapes images (``seed``).
        methods: names / Method classes / callables ``(model, inputs, targets) -> attributions``.
        baselines: add the random-map and constant-map reference rows.
        deletion_perturbation, insertion_perturbation: what removed pixels become. The defaults
            (blur for deletion, zero for insertion) avoid the two artefacts measured on the bundled
            data: black holes punched pixel by pixel destroy any image (a random map then "wins"
            deletion), and a blurred image is still recognised (every insertion curve starts high).
        metrics: the columns, by name (:func:`~kerascope.evaluation_metrics.available_metrics`): the
            benchmark's own ``pointing_game``, ``energy_pointing_game``, ``deletion``, ``insertion``,
            ``sanity`` (the default, all five) and any :mod:`kerascope.metrics` family (``pixel_flipping``,
            ``road``, ``sparseness``, ``max_sensitivity``, ...) run on each method's maps with ``steps``
            steps or draws (docs/evaluation.md lists the settings). Every column but sanity and seconds
            gets a confidence interval over the images.
        metric_params: per metric, parameters passed on to it (override the benchmark's settings), e.g.
            ``{"pixel_flipping": {"features_in_step": 64}}``.
        level, interval: the confidence level and the interval (``"t"``: Student's t, ``"bootstrap"``:
            seeded percentile bootstrap), see :func:`~kerascope.evaluation_metrics.confidence_interval`.
        on_method: called with each method's name before it runs (progress).
        progress: a bar (``True``) or callback per phase of each method (explain, deletion,
            insertion, sanity) that moves after every chunk of work; see
            :func:`~kerascope.core.progress.progress_scope`.

    Example:
        >>> import keras, numpy as np
        >>> m = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(2, 3, name="c"),
        ...                       keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4, activation="softmax")])
        >>> r = benchmark(m, n=2, methods=["gradcam"], steps=4, sanity_images=1, baselines=False)
        >>> [row["method"] for row in r.table()]
        ['gradcam']
    """
    if model is None:
        from kerascope.data import demo_model_path
        from kerascope.io.models import load_model

        model = load_model(demo_model_path())
    if images is None:
        images, labels_gen, masks_gen = bundled_data(n, seed, _input_size(model)[0])
        labels = labels_gen if labels is None else labels
        masks = masks_gen if masks is None else masks
    if masks is None:
        raise ValueError("The benchmark needs ground-truth object masks. Received: masks=None with user images.")
    images = np.asarray(images, np.float32)
    if len(masks) != len(images):
        raise ValueError(f"Expected one mask per image. Received: {len(images)} images and {len(masks)} masks.")
    targets = None if labels is None else np.asarray(labels, np.int64)
    chosen = check_metrics(metrics)
    params = dict(metric_params or {})
    unknown = sorted(set(params) - set(chosen))
    if unknown:
        raise ValueError(f"metric_params names metrics that are not run. Received: {unknown}. Chosen metrics: "
                         f"{chosen}.")
    cell = lambda name, result: MetricCell.of(name, result.scores, result.higher_is_better,  # noqa: E731
                                              level, interval, seed)
    rows: list[MethodScores] = []
    fractions = np.zeros((0,))
    if methods is None:
        rows += [MethodScores(name, error=f"not run by default: {why}", applicable=False)
                 for name, why in NOT_RUN_BY_DEFAULT.items()]
    for name, spec in _explainers(methods, baselines, batch_size, seed):
        if on_method is not None:
            on_method(name)
        row = MethodScores(name)
        rows.append(row)
        needs = _required_arguments(spec)
        if needs:
            row.error = (f"not applicable: needs {', '.join(f'{n}=' for n in needs)}, which depends on the model; "
                         f"run it from Python with {spec.__name__}(model, {', '.join(f'{n}=...' for n in needs)})")
            row.applicable = False
            continue
        run = _runner(spec, batch_size)
        try:
            run(model, images[:1], None if targets is None else targets[:1])
            start = time.perf_counter()
            with progress_scope(len(images), f"{name}: explain", progress, leave=False):
                attributions = run(model, images, targets)
            row.seconds_per_image = (time.perf_counter() - start) / len(images)
            maps = to_maps(attributions, images.shape[1:3])
            if "pointing_game" in chosen:
                row.cells["pointing_game"] = cell("pointing_game", pointing_game(maps, masks))
                row.pointing_game = row.cells["pointing_game"].mean
            if "energy_pointing_game" in chosen:
                row.cells["energy_pointing_game"] = cell("energy_pointing_game", energy_pointing_game(maps, masks))
                row.energy_pointing_game = row.cells["energy_pointing_game"].mean
            for curve, metric, perturbation in (("deletion", deletion, deletion_perturbation),
                                                ("insertion", insertion, insertion_perturbation)):
                if curve not in chosen:
                    continue
                with progress_scope(len(images), f"{name}: {curve}", progress, leave=False):
                    result = metric(model, images, maps, targets, steps=steps, batch_size=batch_size,
                                    perturbation=perturbation, **params.get(curve, {}))
                row.cells[f"{curve}_auc"] = cell(f"{curve}_auc", result)
                setattr(row, f"{curve}_auc", result.aggregate)
                setattr(row, f"{curve}_curve", result.mean_curve)
                fractions = result.fractions
            context = Context(model, images, maps, masks, targets, spec, steps, batch_size, seed)
            for metric in (m for m in chosen if m not in BUILTIN):
                try:
                    with progress_scope(len(images), f"{name}: {metric}", progress, leave=False):
                        row.cells[metric] = cell(metric, score_metric(metric, context, params.get(metric)))
                except UnsupportedModelError:
                    raise
                except Exception as error:  # noqa: BLE001 - one failing metric must not stop the others
                    row.cells[metric] = MetricCell(metric, np.full(len(images), np.nan), True,
                                                   error=plain_text(f"{type(error).__name__}: {error}")[:300])
            if "sanity" in chosen and sanity_images > 0:
                k = min(sanity_images, len(images))
                with progress_scope(k, f"{name}: sanity", progress, leave=False):
                    sanity = model_randomisation(
                        model, spec, images[:k],
                        None if targets is None else targets[:k], batch_size=batch_size, seed=seed,
                    )
                row.sanity = sanity
                row.sanity_spearman, row.sanity_ssim = sanity.final_spearman, sanity.final_ssim
        except UnsupportedModelError as error:
            row.error = plain_text(f"not applicable: {error}")[:300]
            row.applicable = False
        except Exception as error:  # noqa: BLE001 - one failing method must not stop the benchmark
            row.error = plain_text(f"{type(error).__name__}: {error}")[:300]
    if methods is None:  # the rows not run by default in their alphabetical place, the references last
        rows.sort(key=lambda r: (r.method.endswith("(reference)"), "" if r.method.endswith("(reference)") else r.method))
    config = {
        "model": getattr(model, "name", "model"),
        "images": int(len(images)),
        "steps": steps,
        "sanity_images": sanity_images,
        "seed": seed,
        "deletion": str(deletion_perturbation),
        "insertion": str(insertion_perturbation),
        "targets": "labels" if targets is not None else "predicted",
        "metrics": ",".join(chosen),
        "interval": f"{level:.0%} {interval}",
    }
    columns = [c for c in columns_of(chosen) if not (c.startswith("sanity") and sanity_images <= 0)]
    return BenchmarkResult(rows, fractions, config, [*columns, "seconds_per_image"])
