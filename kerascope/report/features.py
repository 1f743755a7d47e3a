"""The feature-visualisation grid in the HTML report: "what each channel of L detects".

:func:`feature_grid` saves a :class:`~kerascope.features.visualize.FeatureVisualization`'s pictures
inside a report folder and returns the section as ``{heading: html}``, which
:func:`~kerascope.report.html.write_report` and :func:`~kerascope.report.rebuild.rebuild_report`
take as ``tables=`` (an HTML section: kept in ``report.json``, rebuilt from a whitelist, pictures
inlined with ``embed_images=True``). :func:`add_feature_grid` adds it to the report that
``kerascope explain`` wrote.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from kerascope.io.paths import safe_name


def feature_heading(result: Any) -> str:
    """The section heading: ``"What each channel of LAYER detects"``.

    Example:
        >>> import numpy as np
        >>> from kerascope.features.visualize import FeatureVisualization
        >>> feature_heading(FeatureVisualization(np.zeros((1, 4, 4, 3)), np.zeros((1, 2)), "conv2", [0]))
        'What each channel of conv2 detects'
    """
    return f"What each channel of {result.layer or 'the output'} detects"


def feature_grid(result: Any, folder: str | Path, *, subfolder: str | None = None, heading: str | None = None,
                 embed: bool = False) -> dict[str, str]:
    """Save ``result``'s pictures under ``folder`` and return the report section ``{heading: html}``.

    Args:
        result: what :func:`kerascope.visualize_features` returned.
        folder: the report's folder (where its ``index.html`` is); the pictures go to
            ``folder/subfolder`` (default ``features/<layer>``), with that grid's own ``index.html``.
        subfolder: where the pictures go, relative to ``folder``.
        heading: the section heading (default "What each channel of LAYER detects").
        embed: inline the pictures as ``data:`` URIs (for a single-file page).

    Pass the result as ``tables=`` to :func:`kerascope.report.write_report` or
    :func:`kerascope.report.rebuild_report`: one figure per channel with its label and final
    objective, in a responsive grid.

    Example:
        >>> import numpy as np, tempfile
        >>> from kerascope.features.visualize import FeatureVisualization
        >>> r = FeatureVisualization(np.full((2, 4, 4, 3), 0.5), np.ones((2, 3)), "conv", [0, 1])
        >>> section = feature_grid(r, tempfile.mkdtemp())
        >>> list(section), section["What each channel of conv detects"].count("<img")
        (['What each channel of conv detects'], 2)
    """
    from kerascope.report.html import sanitize_html

    root = Path(folder)
    sub = subfolder or f"features/{safe_name(result.layer or 'output', fallback='layer')}"
    paths = result.save(root / sub, title=heading)
    cells = []
    for path, label, curve in zip(paths, result.labels(), result.objective):
        source = f"{sub}/{path.name}"
        cells.append(f"<figure class='feature'><img src='{html.escape(source, quote=True)}' alt='{html.escape(label)}'>"
                     f"<figcaption><b>{html.escape(label)}</b><br>objective {float(curve[-1]):.3g}</figcaption></figure>")
    settings = ", ".join(f"{k}={v}" for k, v in result.params.items() if k in ("objective", "parametrization",
                                                                             "steps", "seed"))
    page = f"<p>{html.escape(settings)}</p><div class='grid features'>{''.join(cells)}</div>"
    safe, refused = sanitize_html(page, root, embed=embed)  # checks every picture is a PNG inside the folder
    if refused:
        raise ValueError(f"Could not use the saved pictures: {refused}. Received: folder={str(folder)!r}.")
    return {heading or feature_heading(result): safe}


def add_feature_grid(results_dir: str | Path, result: Any, *, subfolder: str | None = None,
                     heading: str | None = None, embed_images: bool = False) -> Path:
    """Add the grid of ``result`` to the report in ``results_dir`` (written by ``kerascope explain``); returns it.

    The pictures are saved inside ``results_dir`` and the page is rebuilt with the grid as a
    section; it is kept in ``report.json``, so later rebuilds (``kerascope report``) keep it.
    ``embed_images=True`` writes a single-file page (every picture inlined).

    Example:
        >>> import keras, numpy as np, tempfile, kerascope as ks
        >>> from PIL import Image
        >>> m = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(2, 3, activation="relu", name="c"),
        ...                       keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])
        >>> src, out = tempfile.mkdtemp(), tempfile.mkdtemp()
        >>> Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(f"{src}/a.png")
        >>> from kerascope.pipeline import explain_images
        >>> _ = explain_images(m, [f"{src}/a.png"], out, methods=["gradcam"], layer="c", progress=False)
        >>> r = ks.visualize_features(m, layer="c", steps=2, progress=False)
        >>> "What each channel of c detects" in add_feature_grid(out, r).read_text()
        True
    """
    from kerascope.report.rebuild import rebuild_report

    section = feature_grid(result, results_dir, subfolder=subfolder, heading=heading, embed=embed_images)
    return rebuild_report(results_dir, tables=section, embed_images=embed_images, progress=False)
