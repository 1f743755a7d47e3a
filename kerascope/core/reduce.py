"""Moved to :mod:`kerascope.numeric.reduce` (a leaf package shared by core, viz, metrics and batch); re-exported here."""

from kerascope.numeric.reduce import *  # noqa: F403
from kerascope.numeric.reduce import __all__  # noqa: F401
