"""``kerascope visualize MODEL_FILE --layer L --channels 0:16 --out DIR``: what each channel of a layer detects."""

from __future__ import annotations

import argparse

from kerascope.cli.common import add_model_flags, emit, examples, finish_parser


def parse_channels(text: str) -> list[int]:
    """``"0:16"`` (a range, end excluded), ``"3"`` or ``"1,4,7"`` (and mixes like ``"0:4,9"``) as a list of ints.

    Example:
        >>> parse_channels("0:3,7")
        [0, 1, 2, 7]
    """
    channels: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if ":" in part:
                start, stop = (int(v) for v in part.split(":"))
                channels.extend(range(start, stop))
            elif part:
                channels.append(int(part))
        except ValueError as error:
            raise ValueError(f"--channels takes ints and ranges like 0:16,20. Received: --channels {text!r}.") from error
    if not channels:
        raise ValueError(f"--channels selects no channel. Received: --channels {text!r}.")
    return channels


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the ``visualize`` sub-command.

    Example:
        >>> from kerascope.cli import build_parser
        >>> build_parser().parse_args(["visualize", "m.keras", "--layer", "conv", "--out", "o"]).channels
        '0:16'
    """
    p = sub.add_parser(
        "visualize", help="feature visualisation: one image per channel of a layer, and an index.html grid",
        **examples("kerascope visualize model.keras --layer conv2 --channels 0:16 --out features/"),
    )
    add_model_flags(p)
    p.add_argument("--layer", required=True, help="layer path (see `kerascope layers MODEL_FILE`)")
    p.add_argument("--channels", default="0:16", help="channels: ranges and ints, e.g. 0:16 or 1,5,9 (default 0:16)")
    p.add_argument("--out", required=True, help="output folder (PNGs and index.html)")
    p.add_argument("--objective", default="channel", choices=["channel", "neuron", "logit"])
    p.add_argument("--parametrization", default="fourier", choices=["pixel", "fourier", "maco"])
    p.add_argument("--no-transforms", action="store_true", help="no jitter / zoom / rotation during optimisation")
    p.add_argument("--steps", type=int, default=256, help="optimisation steps (default 256)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", nargs=2, type=int, metavar=("H", "W"), help="image size (default: the model's)")
    p.add_argument("--batch-size", type=int, default=16, help="images optimised together (default 16)")
    p.add_argument("--report", metavar="RESULTS_DIR",
                   help="also show the grid in the HTML report of RESULTS_DIR (written by `kerascope explain`)")
    finish_parser(p, run, images=False)


def run(args: argparse.Namespace) -> int:
    """Optimise the images and write them.

    Example:
        >>> from kerascope.cli import main
        >>> main(["visualize", "missing.keras", "--layer", "c", "--out", "o"])  # doctest: +SKIP
        2
    """
    from kerascope.features.visualize import visualize_features
    from kerascope.io.models import load_model

    model = load_model(args.model, safe_mode=not args.unsafe)
    shape = None
    if args.size is not None:
        channels_in = int(model.inputs[0].shape[-1] or 3)
        shape = (args.size[0], args.size[1], channels_in)
    result = visualize_features(
        model, layer=args.layer, channels=parse_channels(args.channels), objective=args.objective,
        parametrization=args.parametrization, transforms=None if args.no_transforms else "default",
        steps=args.steps, seed=args.seed, image_shape=shape, batch_size=args.batch_size,
        progress=not args.quiet and not args.json,
    )
    paths = result.save(args.out)
    summary = {"layer": result.layer, "images": [str(p) for p in paths], "index": f"{args.out}/index.html",
               "final_objective": [float(c[-1]) for c in result.objective]}
    if args.report:
        from kerascope.report.features import add_feature_grid

        summary["report"] = str(add_feature_grid(args.report, result))
    emit(args, summary, f"wrote {len(paths)} images and {args.out}/index.html"
         + (f"; added the grid to {summary['report']}" if args.report else ""))
    return 0
