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
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Options:
    """What every scenario receives: ``repeats`` measured rounds, ``quick`` for a smoke run."""

    repeats: int = 5
    quick: bool = False
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Scenario:
    """A named benchmark: ``run(options)`` returns its measured rows."""

    name: str
    description: str
    run: Callable[[Options], list[dict]]
    tags: tuple[str, ...] = ()


_SCENARIOS: dict[str, Scenario] = {}


def scenario(name: str, description: str, tags: tuple[str, ...] = ()) -> Callable:
    """Register ``fn`` as the scenario ``name`` (names are unique; tags group them, e.g. ``peers``)."""

    def register(fn: Callable[[Options], list[dict]]) -> Callable[[Options], list[dict]]:
        if name in _SCENARIOS and _SCENARIOS[name].run is not fn:
            raise ValueError(f"Scenario {name!r} is registered twice.")
        _SCENARIOS[name] = Scenario(name, description, fn, tuple(tags))
        return fn

    return register


def scenarios() -> dict[str, Scenario]:
    """Every scenario of ``bench/scenarios/``, by name (imports each module once)."""
    from bench import scenarios as package

    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"bench.scenarios.{module.name}")
    return dict(sorted(_SCENARIOS.items()))
