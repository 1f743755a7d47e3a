"""The local engine: one process, the model loaded once, shards written as they complete. No Ray needed."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kerascope.batch.collector import Collector
from kerascope.batch.worker import BatchExplainer
from kerascope.core.progress import progress_scope


def execute_local(
    explainer: BatchExplainer,
    indices: Sequence[np.ndarray],
    targets: np.ndarray,
    batch_size: int,
    collector: Collector,
) -> None:
    """Explain the pending inputs shard by shard (``indices``: one index array per pending shard).

    Example:
        >>> import numpy as np
        >>> from kerascope.batch.collector import Collector
        >>> execute_local(None, [], np.zeros(0, np.int64), 8, None)  # nothing pending: nothing to do
    """
    for shard_indices in indices:
        for start in range(0, len(shard_indices), batch_size):
            chunk = shard_indices[start : start + batch_size]
            bar = getattr(collector, "bar", None)
            # the run's bar also moves within a batch, after every chunk of the method's work
            with progress_scope(len(chunk), progress=bar is not None, bar=bar):
                result = explainer.explain_indices(chunk, targets[chunk])
            collector.add(result)
