"""``kerascope evaluate-data IMAGES_DIR MASKS_DIR --out data.npz``: the benchmark's data from folders."""

from __future__ import annotations

import argparse

from kerascope.cli.common import emit, examples, finish_parser, load_class_names, stderr


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``evaluate-data`` sub-command.

    Example:
        >>> from kerascope.cli import build_parser
        >>> a = build_parser().parse_args(["evaluate-data", "imgs", "masks", "--out", "d.npz"])
        >>> a.images_dir, a.masks_dir, a.preprocess
        ('imgs', 'masks', 'auto')
    """
    p = sub.add_parser(
        "evaluate-data", help="build the .npz for `kerascope evaluate` from a folder of images and one of masks",
        description="Pair every image in IMAGES_DIR (searched recursively) with the mask of the same relative "
        "path and name in MASKS_DIR (any image type; grey level above --threshold = object), resize and "
        "preprocess them for the model, and write images, masks, names[, labels] to --out. With --model the "
        "size, channels and preprocessing are the model's.",
        **examples("kerascope evaluate-data photos/ masks/ --model model.keras --labels labels.csv --out data.npz",
                   "kerascope evaluate model.keras data.npz --method gradcam,saliency --out eval/"),
    )
    p.add_argument("images_dir", metavar="IMAGES_DIR", help="folder of images (searched recursively)")
    p.add_argument("masks_dir", metavar="MASKS_DIR", help="folder of masks named like the images")
    p.add_argument("--out", required=True, help="the .npz file to write, e.g. data.npz")
    p.add_argument("--model", metavar="MODEL_FILE", help="take size, channels and preprocessing from this model")
    p.add_argument("--labels", metavar="CSV",
                   help="'name,class' rows (name: relative path, file name or stem; class: index or a name from "
                        "--class-names); without it the benchmark explains the predicted classes")
    p.add_argument("--class-names", metavar="FILE", help="class names: text file (one per line) or JSON list")
    p.add_argument("--channels", type=int, choices=[1, 3], help="image channels (default: the model's, else 3)")
    p.add_argument("--threshold", type=int, default=127, help="mask grey level above which a pixel is the object")
    p.add_argument("--unsafe", action="store_true", help="allow model files that run code (trusted files only)")
    finish_parser(p, run)


def run(args: argparse.Namespace) -> int:
    """Build and write the evaluation data; exit code 2 (with every problem listed) when it cannot.

    Example:
        >>> from kerascope.cli import main
        >>> main(["evaluate-data", "photos", "masks", "--out", "data.npz"])  # doctest: +SKIP
        0
    """
    import os
    from pathlib import Path

    import numpy as np

    from kerascope.io.evaluation_data import build_evaluation_data
    from kerascope.io.images import check_image_size

    out = Path(args.out)
    if out.suffix != ".npz":
        raise ValueError(f"--out must be an .npz file. Received: --out {args.out}.")
    size = check_image_size(args.size) if args.size else None
    channels = args.channels
    mode, reason = args.preprocess, "chosen with --preprocess"
    if args.model:
        from kerascope.io.images import model_image_size
        from kerascope.io.models import load_model
        from kerascope.io.preprocessing import resolve_preprocess

        model = load_model(args.model, safe_mode=not args.unsafe)
        h, w, c = model_image_size(model)
        size = size or ((h, w) if h and w else None)
        channels = channels or c
        mode, reason = resolve_preprocess(model, args.preprocess)
    elif mode == "auto":
        mode, reason = "unit", "no --model to read it from, so pixels / 255 -> [0, 1] is assumed; see --preprocess"
    data = build_evaluation_data(
        args.images_dir, args.masks_dir, size=size, channels=channels or 3, mode=mode, labels=args.labels,
        class_names=load_class_names(args.class_names), threshold=args.threshold,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial.npz")  # written whole, then renamed: never half a file
    np.savez_compressed(partial, **data)
    os.replace(partial, out)
    images, masks = data["images"], data["masks"]
    summary = {
        "out": str(out), "images": int(len(images)), "shape": list(images.shape[1:]), "preprocess": mode,
        "preprocess_reason": reason, "mask_fraction": round(float(masks.mean()), 4),
        "labels": int(len(data["labels"])) if "labels" in data else None,
    }
    if not (args.quiet or args.json):
        stderr(f"preprocessing: {mode} ({reason})")
    labels = (f"{summary['labels']} labels ({len(np.unique(data['labels']))} classes)" if "labels" in data
              else "no labels (the predicted classes will be explained)")
    emit(args, summary, f"wrote {out}: {len(images)} images {'x'.join(map(str, images.shape[1:]))}, masks cover "
                        f"{100 * summary['mask_fraction']:.1f}% of the pixels, {labels}")
    return 0
