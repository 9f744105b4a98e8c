"""``dasc eval``: the quality cost of a plan on a real model, and horizon validation (paper §3.4, §5.2).

Modules: ``models`` (loading, where the state checkpoint lives), ``arms`` (dense / dasc-nr / dasc-wr /
Random on a checkpoint), ``protocol`` (the cached-prefix protocol), ``metrics``, ``prompts`` and
``retrieval`` (prompt sources), ``horizons`` (Eq. 4, 5), ``plotting`` (Fig. 4h), ``command`` (the CLI),
``hf_compat`` (the transformers releases), ``legacy_kda`` (the first bundled KDA reference).
"""
