"""Moved to :mod:`kerascope.numeric.resize` (a leaf package shared by core, viz, metrics and batch); re-exported here."""

from kerascope.numeric.resize import *  # noqa: F403
from kerascope.numeric.resize import __all__  # noqa: F401
