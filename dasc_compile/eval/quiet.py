"""Keeping transformers' own notices out of ``dasc eval``'s output (one job, shared by the model and tokenizer
loaders: :mod:`dasc_compile.eval.models`, :mod:`dasc_compile.eval.tokenizer`)."""

from __future__ import annotations

import warnings


def quiet_transformers() -> None:
    """Keep transformers' own notices out of the CLI's output (its contract: results, ``warning:`` and
    ``error:`` lines): optional-kernel warnings ("The fast path is not available ..."), weight-loading
    bars and deprecation notices about the checkpoint's config.json (``rope_scaling``), which a user of
    dasc cannot act on. Called before the first config is read or model built (:func:`dasc_compile.eval.models.preflight` runs
    before :func:`dasc_compile.eval.models.load_eval_model`)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers(\.|$)")
