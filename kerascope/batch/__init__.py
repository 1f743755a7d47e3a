"""Dataset-scale explanations: ``ks.batch.run(model_file, inputs, out_dir, engine="local"|"ray")``.

Writes sharded Parquet (one row per input, attribution maps as a tensor
column), an errors table and a manifest; interrupted runs resume. The local
engine needs no Ray; ``engine="ray"`` needs ``pip install "kerascope[ray]"``.

Example:
    >>> import kerascope as ks, numpy as np, tempfile
    >>> from kerascope.data import demo_model_path
    >>> ks.batch.run(demo_model_path(), np.zeros((2, 64, 64, 3), np.float32), tempfile.mkdtemp(),
    ...              progress=False).processed
    2
"""

from kerascope.batch.api import BatchSummary, file_sha256, manifest, read, resolve_targets, run
from kerascope.batch.shards import maps_to_numpy, read_results
from kerascope.batch.sources import (
    ArraySource,
    ImageFiles,
    NumpyFile,
    ParquetRows,
    Source,
    open_source,
)

__all__ = [
    "ArraySource",
    "BatchSummary",
    "ImageFiles",
    "NumpyFile",
    "ParquetRows",
    "Source",
    "file_sha256",
    "manifest",
    "maps_to_numpy",
    "open_source",
    "read",
    "read_results",
    "resolve_targets",
    "run",
]
