"""Transitional import path: the rank layout lives in :mod:`dasc_runtime.rank_layout`.

``benchmarks/`` (owned by another pass) still imports ``dasc_runtime.pool_layout.rank_layout``;
delete this file when ``grep -rn "pool_layout" benchmarks`` finds nothing. Runtime code and tests
import :mod:`dasc_runtime.rank_layout`.
"""

from dasc_runtime.rank_layout import RankLayout
from dasc_runtime.rank_layout import build_rank_layout as rank_layout

__all__ = ["RankLayout", "rank_layout"]
