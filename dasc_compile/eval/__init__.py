"""``dasc eval``: the quality cost of a plan on a real model, and horizon validation (paper §3.4, §5.2).

Modules: ``command`` (the CLI and its tables), ``run`` (input checks, orchestration, the JSON
document), ``models`` (loading through transformers, where the state checkpoint lives), ``hf_compat``
(every difference between the supported transformers releases), ``mamba2`` (Mamba2 mixers and their
decay observer), ``legacy_kda`` (the first bundled KDA reference), ``arms`` (dense / dasc-nr /
dasc-wr / Random on a checkpoint), ``controls`` (init-horizon masks, the untrained model, decay drift),
``protocol`` (the cached-prefix protocol), ``metrics``, ``prompts`` and ``retrieval`` (prompt sources),
``horizons`` (Eq. 4, 5), ``plotting`` (Fig. 4h).
"""
