"""Transitional import path: the kernels' index tensors live in :mod:`dasc_runtime.rank_layout`.

``benchmarks/`` (owned by another pass) still imports ``dasc_runtime.indexing``; delete this file
when ``grep -rn "dasc_runtime.indexing" benchmarks`` finds nothing. Runtime code and tests import
:mod:`dasc_runtime.rank_layout`.
"""

from dasc_runtime.rank_layout import (StateIndex, build_state_index, ragged_pool_shapes, rank_kept_units,
                                      state_index_from_kept)

__all__ = ["StateIndex", "build_state_index", "ragged_pool_shapes", "rank_kept_units", "state_index_from_kept"]
