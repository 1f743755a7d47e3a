"""The Ray engine: Ray Data ``map_batches`` over an actor pool; each actor loads the model once.

Only this module imports ``ray`` (installed with ``pip install "kerascope[ray]"``).
The driver sends input indices (not pixels) through Ray Data, so the inputs
must be readable from every node (a local disk on one machine, a shared file
system on a cluster). The model travels as bytes, so only the driver needs the
model file. Result rows come back to the driver, which writes the shards: the
output folder only needs to exist on the driver. Overlay PNGs are written by
the actors (with ``overlays=True`` on a cluster, use a shared output folder).
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

import numpy as np

from kerascope.batch.collector import Collector
from kerascope.batch.worker import BatchExplainer, WorkerConfig

QUIET_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_BACKEND_LOG_LEVEL": "fatal",
    "TF_CPP_MIN_LOG_LEVEL": "3",
    "RAY_DEDUP_LOGS": "0",
}


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as error:
        raise ImportError(
            "The Ray engine needs Ray Data. Install it with: pip install \"kerascope[ray]\" "
            "(or use engine='local' / --engine local, which needs no Ray)."
        ) from error
    return ray


def start_ray(address: str | None = None) -> tuple[bool, float]:
    """Connect to the cluster at ``address``, or start a quiet local Ray; returns (started_here, seconds).

    A Ray already initialised in this process is reused as it is.

    Example:
        >>> started, seconds = start_ray()  # doctest: +SKIP
    """
    ray = _import_ray()
    if ray.is_initialized():
        return False, 0.0
    for key, value in QUIET_ENV.items():  # inherited by the local raylet and its workers
        os.environ.setdefault(key, value)
    start = time.perf_counter()
    options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
    if address:
        ray.init(address=address, **options)
    else:
        ray.init(include_dashboard=False, **options)
    return True, time.perf_counter() - start


def actor_resources(workers: int, cluster: dict[str, float]) -> dict[str, float]:
    """CPUs and GPUs per actor: one GPU-share each when the cluster has GPUs; on small machines
    fractional CPUs so that Ray's own tasks are never starved by the actors.

    Example:
        >>> actor_resources(2, {"CPU": 2.0})
        {'num_cpus': 0.75}
        >>> actor_resources(2, {"CPU": 16.0, "GPU": 4.0})
        {'num_cpus': 1, 'num_gpus': 1}
    """
    cpus = float(cluster.get("CPU", 1.0))
    gpus = float(cluster.get("GPU", 0.0))
    resources: dict[str, float] = {}
    if cpus >= workers + 1:
        resources["num_cpus"] = 1
    else:
        resources["num_cpus"] = max(0.05, math.floor((cpus - 0.5) / workers * 20) / 20)
    if gpus > 0:
        resources["num_gpus"] = 1 if gpus >= workers else round(gpus / workers, 3)
    return resources


def execute_ray(
    config: WorkerConfig,
    indices: list[np.ndarray],
    targets: np.ndarray,
    collector: Collector,
    *,
    workers: int = 2,
    batch_size: int = 32,
    model_bytes: bytes | None = None,
    ray_remote_args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the pending inputs through a Ray Data actor pool; rows stream back into ``collector``.

    Killed actors are restarted and their batches retried (``max_restarts`` /
    ``max_task_retries``); per-input failures are error rows made inside the
    batch function, so a bad file never fails a block. Nothing is silently
    dropped: the collector checks that every pending input came back.

    Example:
        >>> execute_ray(config, [np.arange(100)], np.full(100, -1), collector)  # doctest: +SKIP
        {'actors': 2, 'num_cpus': 0.75, 'blocks': 4}
    """
    ray = _import_ray()
    from ray.data import ActorPoolStrategy, DataContext

    pending = np.concatenate(indices) if indices else np.zeros(0, np.int64)
    if not len(pending):
        return {}
    context = DataContext.get_current()
    context.enable_progress_bars = False
    context.max_errored_blocks = 0  # never let Ray drop the rows of a failed block
    if hasattr(context, "print_on_execution_start"):
        context.print_on_execution_start = False
    resources = actor_resources(workers, ray.cluster_resources())
    # One block per batch: enough blocks to keep every actor busy, and fine-grained retries.
    blocks = max(1, min(len(pending), max(workers * 4, math.ceil(len(pending) / batch_size))))
    items = [{"index": int(i), "target": int(targets[i])} for i in pending]
    dataset = ray.data.from_items(items, override_num_blocks=blocks)
    # Ray Data restarts dead actors and retries their tasks by default (max_restarts=-1, max_task_retries=-1).
    remote_args = dict(ray_remote_args or {})
    results = dataset.map_batches(
        BatchExplainer,
        fn_constructor_kwargs={"config": config, "model_bytes": model_bytes},
        batch_size=batch_size,
        batch_format="numpy",
        compute=ActorPoolStrategy(size=workers),
        num_cpus=remote_args.pop("num_cpus", resources["num_cpus"]),
        num_gpus=remote_args.pop("num_gpus", resources.get("num_gpus")),
        **remote_args,
    )
    data_logger = logging.getLogger("ray.data")
    level = data_logger.level
    data_logger.setLevel(logging.ERROR)  # no "execution finished" / "progress bars disabled" chatter
    try:
        for batch in results.iter_batches(batch_size=None, batch_format="numpy"):
            collector.add(batch)
    finally:
        data_logger.setLevel(level)
    return {"actors": workers, "blocks": blocks, **resources}
