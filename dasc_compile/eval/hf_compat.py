"""Every difference between the transformers releases ``dasc eval`` supports, in one place.

dasc declares ``transformers>=5.12,<5.26`` (SGLang 0.5.17 pins 5.12.1, so ``dasc[sglang,eval]`` must
resolve with it; 5.25 is the newest tested) and is tested at both ends of that range. What changed
between the ends, and how the rest of ``dasc eval`` is kept from seeing it:

* The cache argument of a model's ``forward`` is ``past_key_values`` (5.12) or ``cache`` (5.24, the old
  name deprecated): :func:`cache_arg`.
* A linear-attention cache layer holds ``recurrent_states`` / ``conv_states`` as tensors (5.12) or as
  dicts ``{state_idx: tensor}`` (5.17 on): :func:`recurrent_state`, :func:`conv_state`.
* :func:`stack_caches` batches per-arm caches whichever the representation.
* ``DynamicCache.crop`` takes the length to keep (5.12) or minus the tokens to drop, and refuses
  linear-attention layers (5.24): :func:`crop_attention` crops only the full-attention layers.
* The recurrence kernels are mixer attributes (5.12 GDN) or module globals that transformers replaces by
  flash-linear-attention's when that package is installed (5.17 on); where the ``kernels`` package is
  installed (optional up to 5.24, required from 5.25) those globals are ``nn.Module`` wrappers:
  :func:`kernel_slots` finds them, :func:`pin_torch_kernels` pins the pure-PyTorch ones (:func:`torch_function`).
  5.25 also loads Hub kernels by default (``from_pretrained(use_kernels=None)``): ``models._load_hf`` passes
  ``use_kernels=False``.
* ``kimi_linear`` (transformers' own Kimi-Linear model, whose KDA layer dasc evaluates) exists from 5.17:
  :func:`require_transformers` refuses a KDA model below that with one line.
* A layer's type is ``attention`` / ``mamba`` (5.12's Mamba2 hybrids) or ``full_attention`` /
  ``linear_attention``; Falcon-H1's ``hybrid`` layers hold attention KV and a Mamba2 state in one cache
  layer: :func:`kv_layer_ids` (the layers with KV), :func:`reset_recurrent` (resets only the state; 5.25
  counts tokens in linear layers too, and a cache's length is layer 0's, so it keeps that count).
* A model without attention layers (every mixer recurrent) runs with a cache from 5.17 on, where the
  forward takes the attention masks as a dict; its own mask and position code asks the cache for the
  length it holds, which only an attention layer knows, and raises: :func:`attention_free_kwargs`,
  :data:`MIN_TRANSFORMERS_ATTENTION_FREE` (5.12 builds the mask unconditionally and cannot run one).
* Mamba2 mixers (Nemotron-H, Granite-4.0-H, Falcon-H1; :mod:`dasc_compile.eval.mamba2`): 5.12 has a
  ``torch_forward`` method that runs a multi-token call from a zero state and steps one token whenever
  the cache holds a state, and chooses mamba_ssm's CUDA kernels through the module flag
  ``is_fast_path_available``; later releases (checked: 5.24, 5.25) call module-global kernels, continue a cached
  state in the chunked scan, and clamp ``dt`` only there (the one-token update does not):
  :func:`mamba2_max_chunk`, :func:`mamba2_dt_limit`, :func:`pin_torch_kernels`. Their observed decay
  is reported through ``mixer.dasc_observe_decay``, which :func:`kernel_slots` returns.
"""

from __future__ import annotations

import importlib
import inspect
import math

import torch

from dasc_compile.errors import DascInputError

#: Lowest transformers dasc eval runs on, and the lowest with a Kimi-Linear (KDA) model.
MIN_TRANSFORMERS = (5, 12)
MIN_TRANSFORMERS_KDA = (5, 17)
#: Lowest transformers that runs a model without attention layers over a cache (:func:`attention_free_kwargs`).
MIN_TRANSFORMERS_ATTENTION_FREE = (5, 17)
#: Newest transformers dasc eval is tested on (CI's newest environment; pyproject admits none newer).
MAX_TESTED_TRANSFORMERS = (5, 25)
#: The transformers releases dasc eval is tested on (CI: both ends and 5.17.0), as messages name them.
_TESTED = "-".join(".".join(map(str, v)) for v in (MIN_TRANSFORMERS, MAX_TESTED_TRANSFORMERS))
_CAP = f"{MAX_TESTED_TRANSFORMERS[0]}.{MAX_TESTED_TRANSFORMERS[1] + 1}"      # pyproject's upper bound
INSTALL_HINT = "pip install 'dasc[eval]' (in a checkout: pip install -e '.[eval]', or bash scripts/setup_env.sh)"


def _version_tuple(v: str) -> tuple[int, int]:
    parts = v.split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def transformers_version() -> tuple[int, int] | None:
    """(major, minor) of the installed transformers, or None when it is not installed."""
    try:
        import transformers
    except ImportError:
        return None
    return _version_tuple(transformers.__version__)


def require_transformers(minimum: tuple[int, int] = MIN_TRANSFORMERS, what: str = "dasc eval") -> str | None:
    """Refuse, in one line, a missing or too old transformers.

    Returns:
        a note (for one ``warning:`` line) when the installed release is newer than
        :data:`MAX_TESTED_TRANSFORMERS`, else None: a newer one may change what dasc eval relies on without an
        error (5.25 moved the cache's length into the linear layers, and dasc-wr's replay ran at wrong
        positions until :func:`reset_recurrent` kept it).

    Raises:
        DascInputError: naming what needs it and the pip command that installs it.
    """
    have = transformers_version()
    want = ".".join(map(str, minimum))
    if have is None:
        raise DascInputError(f"{what} needs the 'transformers' package (>= {want}): {INSTALL_HINT}")
    if have < minimum:
        # SGLang 0.5.17 pins transformers 5.12.1: above that, upgrading in its environment would break the server
        where = (" in an environment without SGLang 0.5.17 (which pins 5.12.1), e.g. bash scripts/setup_env.sh "
                 ".venv-newest --newest") if minimum > MIN_TRANSFORMERS else ""
        raise DascInputError(f"{what} needs transformers >= {want}, this environment has "
                             f"{'.'.join(map(str, have))}: pip install 'transformers>={want}'{where}")
    if have > MAX_TESTED_TRANSFORMERS:
        return (f"transformers {'.'.join(map(str, have))} is newer than the releases {what} is tested on "
                f"({_TESTED}); results may differ from a tested one: pip install 'transformers>=5.12,<{_CAP}'")
    return None


def library_versions() -> dict[str, str]:
    """``{"transformers": ..., "torch": ...}``: the releases a ``dasc eval`` run used (its JSON's
    ``protocol.versions``), so that two runs' numbers can be told apart by the libraries that made them."""
    import transformers

    return {"transformers": transformers.__version__, "torch": torch.__version__}


def warn_untested_transformers() -> None:
    """:func:`require_transformers` for ``dasc eval``, whose refusal it raises, and whose note on a release
    newer than the tested ones it prints as one ``warning:`` line on stderr (the run goes on).

    Raises:
        DascInputError: as :func:`require_transformers`.
    """
    if note := require_transformers():
        from dasc_compile.console import console

        console(stderr=True, highlight=False, soft_wrap=True).print(f"warning: {note}", markup=False)


def cache_arg(model) -> str:
    """The name ``model.forward`` takes the cache under: ``cache`` where the model has it, else ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def attention_free_kwargs(ids: torch.Tensor) -> dict:
    """Extra ``forward`` arguments for a model without attention layers, for ``ids`` (int64 ``[B, T]``):
    ``position_ids`` (no layer reads them, so their values change no output; given so that the forward does
    not ask the cache for its length, which raises before 5.25 and is a linear layer's count from 5.25) and
    ``attention_mask`` as the per-layer-kind dict the forward takes instead of building masks (no padding:
    no mask). Needs transformers >= 5.17 (:data:`MIN_TRANSFORMERS_ATTENTION_FREE`); transformers' Qwen3-Next,
    Kimi-Linear and Nemotron-H forwards (``modeling_*.py``: ``causal_mask_mapping``)."""
    return {"position_ids": torch.arange(ids.shape[1], device=ids.device).unsqueeze(0).expand(ids.shape[0], -1),
            "attention_mask": {"full_attention": None, "linear_attention": None}}


def _first(state):
    return state[0] if isinstance(state, dict) else state


def recurrent_state(layer):
    """The temporal state of a linear-attention cache layer: float32 ``[B, H, d_k, d_v]`` (key-major)."""
    return _first(layer.recurrent_states)


def conv_state(layer):
    """The short-convolution state of a linear-attention cache layer: ``[B, conv_dim, K]``."""
    return _first(layer.conv_states)


def _set(layer, attr: str, value) -> None:
    held = getattr(layer, attr)
    if isinstance(held, dict):
        held[0] = value
    else:
        setattr(layer, attr, value)


def stack_caches(caches: list, layer_ids, attention_layer_ids):
    """One cache holding ``caches`` (each of batch 1) as the rows of a batch, in order: every recurrent
    layer's temporal and conv state and every full-attention layer's KV concatenated on dim 0. The
    first cache is reused as the container (it is consumed)."""
    out = caches[0]
    for lid in layer_ids:
        layer = out.layers[lid]
        _set(layer, "recurrent_states", torch.cat([recurrent_state(c.layers[lid]) for c in caches]))
        _set(layer, "conv_states", torch.cat([conv_state(c.layers[lid]) for c in caches]))
    for lid in attention_layer_ids:
        layer = out.layers[lid]
        layer.keys = torch.cat([c.layers[lid].keys for c in caches])
        layer.values = torch.cat([c.layers[lid].values for c in caches])
    return out


def kv_layer_ids(layer_types) -> list[int]:
    """Ids of the layers whose cache layer holds attention KV, from the text config's ``layer_types``
    (5.12's Mamba2 hybrids say ``attention``, later releases ``full_attention``; Falcon-H1's
    ``hybrid`` layers run attention beside the Mamba2 mixer)."""
    return [i for i, t in enumerate(layer_types) if t in ("attention", "full_attention", "hybrid")]


def reset_recurrent(layer, seen_tokens: int) -> None:
    """Zero the recurrent and conv state of a cache layer and mark it as holding no state; a layer that
    also holds attention KV (Falcon-H1's) keeps it (its own ``reset`` would drop the KV too).

    ``seen_tokens``: the tokens the cache stands at (the next call's first position). 5.25 counts tokens in
    each linear-attention layer (``cache_utils.py``: ``LinearAttentionCacheLayerMixin.cumulative_length_linear``),
    its ``reset`` zeroes that count, and the cache's length (``DynamicCache.get_seq_length``), from which a
    model numbers the next call's positions, is layer 0's, often a linear one: so the count is set back to
    ``seen_tokens``. Earlier releases take the length from the first attention layer.
    """
    from transformers.cache_utils import LinearAttentionLayer

    LinearAttentionLayer.reset(layer)
    count = getattr(layer, "cumulative_length_linear", None)
    if count is not None:
        count.fill_(int(seen_tokens))


def crop_attention(cache, attention_layer_ids, keep: int) -> None:
    """Keep the first ``keep`` tokens of each full-attention layer's KV (exactly as cached); recurrent
    layers are left alone (their state cannot be cropped)."""
    for lid in attention_layer_ids:
        layer = cache.layers[lid]
        layer.keys = layer.keys[..., :keep, :]
        layer.values = layer.values[..., :keep, :]


# Kernel entry points: (role, names an instance or its module may hold, first match wins).
_KERNEL_NAMES = {
    "chunk": ("chunk_gated_delta_rule", "torch_chunk_gated_delta_rule", "chunk_kimi_delta_attention"),
    "step": ("recurrent_gated_delta_rule", "torch_recurrent_gated_delta_rule", "recurrent_kimi_delta_attention"),
}
_CONV_NAMES = ("causal_conv1d_fn", "causal_conv1d_update", "causal_conv1d_forward")
_MAMBA2_NAMES = ("mamba2_chunk_scan", "mamba2_selective_state_update", "mamba2_split_conv1d_scan_combined")
#: the mixer attribute a Mamba2 mixer reports its observed log-decay through (:mod:`dasc_compile.eval.mamba2`)
OBSERVER = "dasc_observe_decay"


def kernel_slots(mixer) -> list[tuple[object, str]]:
    """Where ``mixer``'s recurrence kernels are looked up when it runs: ``(owner, attribute)`` for the
    chunked and the one-token kernel. The owner is the mixer itself (transformers 5.12's GDN) or the
    module defining its class (the kernel is a module global), shared by every mixer of that class.

    A mixer that reports its decay through :data:`OBSERVER` (Mamba2: its kernels take ``dt`` and ``A``,
    not ``g``) has that one slot.

    Raises:
        ValueError: the mixer's class has neither (a transformers release dasc does not know).
    """
    if OBSERVER in vars(mixer):
        return [(mixer, OBSERVER)]
    module = importlib.import_module(type(mixer).__module__)
    slots = []
    for role, names in _KERNEL_NAMES.items():
        owner = next(((mixer, n) for n in names if n in vars(mixer)), None)
        owner = owner or next(((module, n) for n in names if hasattr(module, n)), None)
        if owner is None:
            raise ValueError(f"{type(mixer).__name__}: no {role} kernel found under {names}")
        slots.append(owner)
    return slots


def pin_torch_kernels(mixer) -> None:
    """Make ``mixer`` run transformers' pure-PyTorch recurrence and convolution, whatever optional kernel
    packages are installed, so results do not depend on them (and a CPU runs every model).

    Why this sets attributes on objects transformers owns: 5.12 binds the kernels to each GDN mixer at
    construction and lets a Mamba2 mixer take mamba_ssm's CUDA path when a module flag says it is
    installed; later releases bind the kernels as module globals chosen at import time (their
    pure-PyTorch function stays reachable, :func:`torch_function`); there is no public switch in either.
    """
    module = importlib.import_module(type(mixer).__module__)
    if "chunk_gated_delta_rule" in vars(mixer):                       # 5.12 GDN: instance attributes
        mixer.chunk_gated_delta_rule = module.torch_chunk_gated_delta_rule
        mixer.recurrent_gated_delta_rule = module.torch_recurrent_gated_delta_rule
        mixer.causal_conv1d_fn = None
        mixer.causal_conv1d_update = module.torch_causal_conv1d_update
        return
    if _legacy_mamba2(mixer):                                         # 5.12 Mamba2: torch_forward unless this flag
        module.is_fast_path_available = False
        return
    mamba2 = [(module, n) for n in _MAMBA2_NAMES if hasattr(module, n)]
    for owner, name in (mamba2 or kernel_slots(mixer)) + [(module, n) for n in _CONV_NAMES if hasattr(module, n)]:
        setattr(owner, name, torch_function(getattr(owner, name), name))


def torch_function(fn, name: str = "kernel"):
    """The pure-PyTorch function behind a kernel entry point ``fn`` of a transformers modeling module.

    From 5.17 the entry point is a function whose ``__wrapped__`` is the PyTorch one (the wrapper picks
    flash-linear-attention's or mamba_ssm's kernel when installed; ``integrations/hub_kernels.py``,
    ``use_kernel_func_from_hub_with_fallback``). Where the ``kernels`` package is installed (optional up to
    5.24, required from 5.25), ``use_kernel_forward_from_hub`` turns it into an ``nn.Module`` instance
    (``kernels/_internals/layer/layer.py``, ``_create_func_module``: a ``Func``) whose ``forward`` calls the
    wrapper unless ``kernelize`` swapped in a Hub kernel, and which keeps it only in its class's ``forward``
    closure (cell ``func``), so that is read. A plain function is returned as it is.

    Raises:
        DascInputError: ``fn`` is a module of another layout (a transformers / kernels release dasc does not
            know), naming ``name`` and the releases dasc eval is tested on.
    """
    if isinstance(fn, torch.nn.Module):
        forward = type(fn).forward
        cells = dict(zip(forward.__code__.co_freevars, forward.__closure__ or ()))
        if "func" not in cells or not callable(cells["func"].cell_contents):
            raise DascInputError(f"transformers' {name} is a {type(fn).__name__} module whose PyTorch function dasc "
                                 f"eval cannot find (tested on transformers {_TESTED}): pip install "
                                 f"'transformers>=5.12,<{_CAP}'")
        fn = cells["func"].cell_contents
    return getattr(fn, "__wrapped__", fn)


def _legacy_mamba2(mixer) -> bool:
    """A 5.12-style Mamba2 mixer: its ``torch_forward`` does the whole recurrence inline."""
    return callable(getattr(mixer, "torch_forward", None))


def mamba2_max_chunk(mixer) -> int | None:
    """The most tokens one call may give ``mixer`` from a fresh cache before every further token must be one
    step of its recurrence (``EvalModel.max_chunk``), or None when any call is exact.

    5.12's ``torch_forward`` runs a multi-token call from a zero state (a cache that holds a state is read
    as one decoding token), and Nemotron-H's chunked scan there passes states between chunks wrongly, so
    one call may take at most one chunk (``chunk_size``) and only from a fresh cache. Later releases give
    the cached state to the chunked scan as its initial state (checked against the one-token recurrence
    on 5.24, :mod:`tests.eval.test_eval_mamba2`).
    """
    return int(getattr(mixer, "chunk_size", 1) or 1) if _legacy_mamba2(mixer) else None


def mixer_cache(args: tuple, kwargs: dict):
    """The cache a Mamba2 mixer was called with (keyword ``cache_params`` in 5.12, ``cache`` later)."""
    return kwargs.get("cache", kwargs.get("cache_params", args[1] if len(args) > 1 else None))


def mamba2_dt_limit(mixer, cache, seq_len: int) -> tuple[float, float]:
    """The bounds ``mixer`` clamps its step ``dt = softplus(dt + dt_bias)`` to in a call of ``seq_len``
    tokens on ``cache`` (before the call).

    5.12: the same in its chunked and one-token paths: Nemotron-H's from below at ``time_step_min``,
    Granite-4.0-H's and Falcon-H1's ``time_step_limit``. Later releases: ``time_step_limit`` in the
    chunked scan (Nemotron-H's is ``(time_step_min, inf)`` there), none in the one-token update, which
    runs for one token on a cache layer that holds a state.
    """
    limit = getattr(mixer, "time_step_limit", None)
    limit = (0.0, math.inf) if limit is None else tuple(limit)
    if _legacy_mamba2(mixer):
        return (mixer.time_step_min, math.inf) if type(mixer).__name__.startswith("NemotronH") else limit
    steps = cache is not None and seq_len == 1 and _holds_state(cache, mixer.layer_idx)
    return (0.0, math.inf) if steps else limit


def _holds_state(cache, layer_idx: int) -> bool:
    """Whether ``cache`` already holds layer ``layer_idx``'s recurrent state: ``get_recurrent_state`` from
    5.2x; 5.17's cache has only ``has_previous_state`` (the test its Nemotron-H mixer itself makes)."""
    if hasattr(cache, "get_recurrent_state"):
        return cache.get_recurrent_state(layer_idx, state_idx=0) is not None
    return bool(cache.has_previous_state(layer_idx))


def missing_weights_error(path, cfg: dict, missing: list[str], unexpected: list[str]) -> DascInputError:
    """The one line for weights transformers did not find. When the checkpoint also holds tensors the model
    does not use, the names differ rather than the weights lacking: a checkpoint written by another
    transformers release (Nemotron-H written by 5.12 names ``embedding`` what 5.24 calls ``embeddings``).

    ``missing`` / ``unexpected``: transformers' ``output_loading_info`` key lists, sorted; ``cfg``: config.json."""
    import transformers

    from dasc_compile.console import counted

    if not unexpected:
        return DascInputError(f"{path}: {counted(len(missing), 'weight')} missing from the checkpoint "
                              f"(e.g. {missing[0]}); dasc eval needs the whole trained checkpoint")
    written = cfg.get("transformers_version")
    by = f"by transformers {written}" if isinstance(written, str) else "by another transformers release"
    fix = f"run dasc eval with transformers {written}" if isinstance(written, str) else "use the release that wrote it"
    return DascInputError(
        f"{path}: transformers {transformers.__version__} expects {counted(len(missing), 'weight')} under other names "
        f"than the checkpoint's (e.g. it expects {missing[0]}, the checkpoint has {unexpected[0]}); it was written {by}: "
        f"{fix}, or load and save it again with {transformers.__version__}")
