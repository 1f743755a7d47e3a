"""The scenario registry of ``python -m bench``: one decorator, one lookup, no heavy imports.

A scenario is a function ``run(options) -> list[dict]``: each dict is one measured row
(plain numbers and strings, written as JSON). Scenarios live in ``bench/scenarios/*.py``;
importing a module registers its scenarios, so a module should import TensorFlow, JAX,
torch or a peer library inside the function, never at the top.

Example::

    from bench.scenario import Options, scenario
    from bench.timing import rotating_times

    @scenario("saliency-demo-vs-tape", "Saliency vs a compiled GradientTape, demo model", tags=("floor",))
    def saliency_vs_tape(options: Options) -> list[dict]:
        times = rotating_times({"kerascope": ours, "tape": floor}, rounds=options.repeats)
        return [{"impl": k, "median_s": statistics.median(v)} for k, v in times.items()]
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Options:
    """What every scenario receives: ``repeats`` measured rounds, ``quick`` for a smoke run."""

    repeats: int = 5
    quick: bool = False
    extra: dict = field(default_factory=dict)  # ``--set key=value`` pairs, read with :func:`settings`


@dataclass(frozen=True)
class Scenario:
    """A named benchmark: ``run(options)`` returns its measured rows."""

    name: str
    description: str
    run: Callable[[Options], list[dict]]
    tags: tuple[str, ...] = ()
    backend: str | None = None  # the Keras backend it needs (None: any; ``--backend`` picks)
    venv: str | None = None  # "peers": runs in the peers' environment (``bench/peer_env.py``)


_SCENARIOS: dict[str, Scenario] = {}


def scenario(
    name: str, description: str, tags: tuple[str, ...] = (), backend: str | None = None, venv: str | None = None
) -> Callable:
    """Register ``fn`` as the scenario ``name`` (names are unique; tags group them, e.g. ``peers``).

    ``backend``: the Keras backend the scenario needs (the runner starts a child process with
    it when this one runs another); ``venv="peers"``: it imports peer libraries, so the runner
    runs it with the peers' interpreter. A family registers one closure per parameter set::

        for model in ("demo", "mobilenetv2"):
            scenario(f"floor-saliency-{model}", "...", tags=("floor",))(partial(measure, model))
    """

    def register(fn: Callable[[Options], list[dict]]) -> Callable[[Options], list[dict]]:
        if name in _SCENARIOS and _SCENARIOS[name].run is not fn:
            raise ValueError(f"Scenario {name!r} is registered twice.")
        _SCENARIOS[name] = Scenario(name, description, fn, tuple(tags), backend, venv)
        return fn

    return register


def scenarios() -> dict[str, Scenario]:
    """Every scenario of ``bench/scenarios/``, by name (imports each module once)."""
    from bench import scenarios as package

    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"bench.scenarios.{module.name}")
    return dict(sorted(_SCENARIOS.items()))


def settings(cls: type[T], options: Options, **defaults: object) -> T:
    """The dataclass ``cls`` from ``defaults`` overridden by ``options.extra`` (``--set key=value``).

    Keys ``cls`` does not have are left for the other scenarios of the same run (the runner names
    the keys no scenario took); comma-separated text fills a tuple field::

        settings(FloorSettings, Options(extra={"samples": 32}), chunk=16)
    """
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    USED_KEYS.update(names & set(options.extra))
    values = {**defaults, **{k: v for k, v in options.extra.items() if k in names}}
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name in values and "tuple" in str(f.type) and not isinstance(values[f.name], tuple):
            values[f.name] = tuple(str(values[f.name]).split(","))
    return cls(**values)


#: the ``--set`` keys some scenario of this process read (the runner reports the others)
USED_KEYS: set[str] = set()
