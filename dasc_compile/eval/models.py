"""Loading a Hugging Face checkpoint for ``dasc eval`` and reaching its recurrent state checkpoint.

Every model runs through transformers' own classes (``AutoModelForCausalLM``), float32 by default,
with each recurrent layer pinned to transformers' pure-PyTorch kernels
(:func:`dasc_compile.eval.hf_compat.pin_torch_kernels`) so a CPU runs them and results do not depend on
optional kernel packages:

* GDN hybrids: ``qwen3_next``, ``qwen3_5`` / ``qwen3_5_moe`` (transformers >= 5.12);
* KDA hybrids: ``kimi_linear`` (transformers' Kimi-Linear model, >= 5.17), and the first bundled KDA
  reference, a Qwen3-Next backbone with transformers' KDA layer (:mod:`dasc_compile.eval.legacy_kda`);
* Mamba2 hybrids: ``nemotron_h``, ``granitemoehybrid``, ``falcon_h1`` (transformers >= 5.12;
  :mod:`dasc_compile.eval.mamba2`).

The recurrent state checkpoint at a prefix boundary is the transformers cache object after the prefix:
per recurrent layer a temporal state ``[B, H, d_k, d_v]`` (key-major; the paper's ``[d_v, d_k]``
transposed) and a conv state ``[B, conv_dim, K]`` (read through :mod:`dasc_compile.eval.hf_compat`);
full-attention layers hold their KV in the same cache.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dasc_compile.errors import DascInputError
from dasc_compile.eval.hf_compat import (MIN_TRANSFORMERS_ATTENTION_FREE, MIN_TRANSFORMERS_KDA, attention_free_kwargs,
                                         cache_arg, kv_layer_ids, pin_torch_kernels, require_transformers)
from dasc_compile.eval.mamba2 import is_mamba2_mixer, observe_mamba2
from dasc_compile.eval.quiet import quiet_transformers  # noqa: F401 (its home before)
from dasc_compile.eval.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer  # noqa: F401 (their home before)


@dataclass
class EvalModel:
    """A loaded hybrid model and where its recurrent state lives.

    Attributes:
        model: the causal LM (eval mode, on ``device``).
        family: ``gdn`` | ``kda`` | ``mamba2``.
        layer_ids: model layer ids of the recurrent layers, increasing (= the plan's ``recurrent_layer_ids``).
        mixers: layer id -> recurrent token-mixer module.
        num_heads: value heads H_v (GDN) or heads H (KDA, Mamba2). units_per_head: 1 (GDN, Mamba2) or d_k (KDA).
        attention_layer_ids: model layer ids of the layers holding attention KV (Falcon-H1: every layer).
        cache_arg: the name ``model.forward`` takes the cache under (:func:`hf_compat.cache_arg`).
        tokenizer: ``encode(str) -> list[int]`` / ``decode``.
        max_chunk: None, or the most tokens one call may take from a fresh cache, every later token being
            one call (Mamba2 on transformers 5.12: :func:`hf_compat.mamba2_max_chunk` says why).
    """

    model: torch.nn.Module
    family: str
    layer_ids: list[int]
    mixers: dict[int, torch.nn.Module]
    num_heads: int
    units_per_head: int
    attention_layer_ids: list[int]
    tokenizer: object
    device: torch.device
    config: dict = field(default_factory=dict)
    cache_arg: str = "past_key_values"
    max_chunk: int | None = None

    def new_cache(self):
        """An empty transformers ``DynamicCache`` for this model (one linear-attention slot per recurrent layer)."""
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @torch.no_grad()
    def forward(self, ids: list[int] | torch.Tensor, cache) -> torch.Tensor:
        """Run ``ids`` (``[T]``, batch 1) after what ``cache`` holds; returns float32 logits ``[T, vocab]``."""
        x = torch.as_tensor(ids, dtype=torch.long, device=self.device).reshape(1, -1)
        return self.forward_rows(x, cache)[0]

    @torch.no_grad()
    def forward_rows(self, ids: torch.Tensor, cache) -> torch.Tensor:
        """Run ``ids`` (int64 ``[B, T]``, one row per cache row) after what ``cache`` holds; returns
        float32 logits ``[B, T, vocab]``. With :attr:`max_chunk`, a fresh cache takes at most that many
        tokens in one call and every later token is one call."""
        ids = ids.to(self.device)
        if self.max_chunk is None:
            return self._call(ids, cache)
        n = 0 if cache.has_previous_state(self.layer_ids[0]) else min(ids.shape[1], self.max_chunk)
        return torch.cat(([self._call(ids[:, :n], cache)] if n else [])
                         + [self._call(ids[:, t:t + 1], cache) for t in range(n, ids.shape[1])], dim=1)

    def _call(self, ids: torch.Tensor, cache) -> torch.Tensor:
        kw = {} if self.attention_layer_ids else attention_free_kwargs(ids)
        return self.model(input_ids=ids, use_cache=True, **{self.cache_arg: cache}, **kw).logits.float()


def _read_config(path: Path) -> dict:
    if not path.exists():
        raise DascInputError(f"{path}: no such directory (dasc eval needs a model directory holding config.json "
                             f"and the weights)")
    if not path.is_dir():
        raise DascInputError(f"{path}: not a directory; dasc eval needs a model directory holding config.json and "
                             f"the weights")
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise DascInputError(f"{cfg_path}: not found (dasc eval needs a Hugging Face model directory)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        raise DascInputError(f"{cfg_path}: not readable JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise DascInputError(f"{cfg_path}: a config must be a JSON object")
    return cfg


def _load_state(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise DascInputError(f"{path}: no .safetensors weights found")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def _checkpoint_numel(path: Path) -> int:
    from dasc_compile.safetensors_header import read_safetensors_header

    total = 0
    for f in sorted(path.glob("*.safetensors")):
        for e in read_safetensors_header(f).tensors.values():
            n = 1
            for d in e.shape:
                n *= d
            total += n
    return total


def _available_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not Linux
        return None


#: What a checkpoint short of weights is told it needs (:func:`check_weights`; the untrained control says its own).
NEEDS_TRAINED = ("dasc eval needs the whole trained checkpoint (a decay-only reference file is enough for dasc "
                 "compile, not for eval)")


def check_weights(path: Path, want: int, dtype: torch.dtype, need: str = NEEDS_TRAINED) -> None:
    """Refuse a checkpoint that holds fewer parameters than its config describes (a decay-only
    reference, whose other weights transformers would silently draw at random), or a model too large
    for this machine's free memory.

    Args:
        want: parameter count of the model the config describes (built on the meta device).
        need: what the refusal says the command needs (default :data:`NEEDS_TRAINED`).
    Raises:
        DascInputError: naming the directory, the counts, and the bytes needed.
    """
    have = _checkpoint_numel(path)
    if have < 0.99 * want:
        raise DascInputError(
            f"{path}: the weights hold {have:,} of the {want:,} parameters config.json describes; {need}")
    need = want * torch.empty((), dtype=dtype).element_size()
    free = _available_bytes()
    if free is not None and need > 0.8 * free:
        raise DascInputError(f"{path}: the model needs ~{need / 2**30:.1f} GiB in {str(dtype).split('.')[-1]}; "
                             f"this machine has {free / 2**30:.1f} GiB free")




def _refuse_decay_only(path: Path, cfg: dict) -> None:
    """Refuse, before anything needs transformers, a checkpoint holding fewer parameters than its embedding
    table alone (``vocab_size x hidden_size``, from config.json or its ``text_config``): a decay-only reference
    (``dasc reference``, the calibrated references). :func:`check_weights` makes the exact check later.

    Raises:
        DascInputError: naming the directory and both counts.
    """
    c = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    vocab, hidden = c.get("vocab_size", cfg.get("vocab_size")), c.get("hidden_size", cfg.get("hidden_size"))
    if not (isinstance(vocab, int) and isinstance(hidden, int)) or vocab <= 0 or hidden <= 0:
        return
    have = _checkpoint_numel(path)
    if have < vocab * hidden:
        raise DascInputError(
            f"{path}: the weights hold {have:,} parameters, fewer than the {vocab:,} x {hidden:,} embedding table "
            f"config.json describes; {NEEDS_TRAINED}")


def _load_errors() -> tuple[type[BaseException], ...]:
    """What transformers raises for a config or checkpoint it cannot build: the builtin kinds, and
    huggingface_hub's strict-dataclass validation (5.12 rejects a Nemotron-H config whose layer kinds carry
    5.17's names, e.g. ``linear_attention``), which derives from none of them."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return OSError, ValueError, KeyError, RuntimeError, TypeError
    return OSError, ValueError, KeyError, RuntimeError, TypeError, StrictDataclassError


def _hf_error(path: Path, cfg: dict, exc: Exception) -> DascInputError:
    import transformers

    # the whole message on one line: a validation error's first line names only the validator
    text = " ".join(ln.strip() for ln in str(exc).splitlines() if ln.strip())[:300] or type(exc).__name__
    return DascInputError(f"{path}: transformers {transformers.__version__} cannot load this {cfg.get('model_type')} "
                          f"checkpoint ({text})")


def build_from_config(path: Path, cfg: dict, seed: int):
    """The model ``path/config.json`` describes, initialised by transformers (``from_config``) after
    ``torch.manual_seed(seed)``: the initialisation a training run seeded with ``seed`` started from when
    it built its model the same way (same transformers release). float32, eval mode.

    Raises:
        DascInputError: a config transformers cannot build, or the first bundled KDA reference (its
            initialisation came from dasc's former KDA layer: give its initial checkpoint instead).
    """
    from dasc_compile.eval.legacy_kda import ARCHITECTURE, is_legacy_kda
    from transformers import AutoConfig, AutoModelForCausalLM

    if is_legacy_kda(cfg):
        raise DascInputError(f"{path}: a {ARCHITECTURE} initialisation cannot be rebuilt from a seed; "
                             f"give its initial checkpoint with --init-from DIR")
    quiet_transformers()
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    except _load_errors() as exc:
        raise _hf_error(path, cfg, exc) from None


def preflight(path: Path, dtype: torch.dtype = torch.float32, need: str = NEEDS_TRAINED):
    """Check, without reading any weights, that ``path`` holds the whole model its config describes and
    that it fits in memory (:func:`check_weights`, the model built on the meta device); returns its config.

    Raises:
        DascInputError: as :func:`check_weights`, or a config transformers cannot build.
    """
    from dasc_compile.eval.legacy_kda import is_legacy_kda
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = _read_config(path)
    if is_legacy_kda(cfg):
        return None
    quiet_transformers()
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        with torch.device("meta"):
            meta = AutoModelForCausalLM.from_config(config)
    except _load_errors() as exc:
        raise _hf_error(path, cfg, exc) from None
    check_weights(path, sum(p.numel() for p in meta.parameters()), dtype, need)
    return config


def _load_hf(path: Path, cfg: dict, dtype: torch.dtype):
    """``AutoModelForCausalLM.from_pretrained`` after checking the weights hold the whole model."""
    from transformers import AutoModelForCausalLM

    config = preflight(path, dtype)
    try:
        # use_kernels=False: 5.25 loads Hub kernels (RMSNorm, RoPE, Mamba2's scan) by default, which no CPU
        # run has and hf_compat.pin_torch_kernels does not pin (modeling_utils.py, from_pretrained)
        model, info = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True,
                                                           output_loading_info=True, use_kernels=False)
    except DascInputError:
        raise
    except _load_errors() as exc:
        raise _hf_error(path, cfg, exc) from None
    tied = config.get_text_config().tie_word_embeddings
    missing = [k for k in info.get("missing_keys", []) if not (tied and "lm_head" in k)]
    if missing:
        from dasc_compile.eval.hf_compat import missing_weights_error

        raise missing_weights_error(path, cfg, sorted(missing), sorted(info.get("unexpected_keys", [])))
    return model


def recurrent_mixers(model) -> tuple[dict[int, torch.nn.Module], int, int]:
    """``({layer id: token mixer}, heads, units per head)`` of the GDN / KDA / Mamba2 layers of a
    transformers model, each pinned to transformers' pure-PyTorch kernels.

    A GDN mixer (``A_log`` per value head) has ``num_v_heads`` units of one head each; a KDA mixer
    (``forget_gate`` with ``A_log [1, 1, H, 1]``) has ``num_heads`` heads of ``head_dim`` key-channel units;
    a Mamba2 mixer (:func:`~dasc_compile.eval.mamba2.is_mamba2_mixer`) ``num_heads`` units of one head each.
    """
    mixers, heads, uph = {}, 0, 1
    for mod in model.modules():
        if not hasattr(mod, "layer_idx"):
            continue
        if hasattr(mod, "forget_gate") and hasattr(mod.forget_gate, "A_log"):
            heads, uph = mod.num_heads, mod.head_dim
        elif hasattr(mod, "A_log") and hasattr(mod, "num_v_heads"):
            heads, uph = mod.num_v_heads, 1
        elif is_mamba2_mixer(mod):
            heads, uph = mod.num_heads, 1
        else:
            continue
        pin_torch_kernels(mod)
        mixers[int(mod.layer_idx)] = mod
    return mixers, heads, uph


def model_family(path: Path, cfg: dict) -> str:
    """``gdn`` | ``kda`` | ``mamba2``: the decay family of the model whose config.json ``cfg`` is, as the
    compiler's family registry parses it (:data:`dasc_compile.families.MODEL_PARSERS`), so that a family's
    model types are listed once, in its module.

    Raises:
        DascInputError: a model type no family parses (one line naming those that do); a config the
            family's parser refuses (its own message); a KDA safe-gate config (Kimi-K3: transformers has no
            class that runs its gate).
    """
    from dasc_compile.families import MODEL_PARSERS, load_all

    load_all()
    mt = cfg.get("model_type")
    parser = MODEL_PARSERS.get(mt)
    if parser is None:
        raise DascInputError(
            f"{path / 'config.json'}: model_type {mt!r} has no recurrent (linear-attention) layers dasc eval can run; "
            f"expected one of {', '.join(sorted(MODEL_PARSERS))}")
    family = parser(cfg, str(path / "config.json")).family
    if family == "kda_safe_gate":
        raise DascInputError(f"{path / 'config.json'}: a KDA safe-gate model (gate_lower_bound / safe_gate, as "
                             f"Kimi-K3): dasc eval runs transformers' kimi_linear class, which has no safe gate")
    return family


def require_model_support(path: Path) -> dict:
    """The model's config.json, after refusing a model type dasc eval cannot run or a transformers
    release without its model class (one line each).

    Raises:
        DascInputError: not a GDN / Mamba2 / KDA hybrid (:func:`model_family`); transformers missing, or
            below 5.17 for ``kimi_linear``.
    """
    cfg = _read_config(path)
    mt = cfg.get("model_type")
    model_family(path, cfg)
    _refuse_decay_only(path, cfg)     # before the transformers checks: no upgrade would make it runnable
    require_transformers()
    if mt == "kimi_linear":
        require_transformers(MIN_TRANSFORMERS_KDA, f"dasc eval of a kimi_linear (KDA) model ({path})")
    return cfg


def load_eval_model(path: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32,
                    init_seed: int | None = None, tokenizer=None) -> EvalModel:
    """Load the model at ``path`` (a directory with config.json, weights and a tokenizer); with
    ``init_seed``, build its initialisation instead (:func:`build_from_config`; no weights read);
    ``tokenizer``: use this one instead of reading the directory's (:func:`load_tokenizer`).

    Raises:
        DascInputError: not a model directory; a model type without recurrent (GDN / KDA / Mamba2) layers
            or one dasc eval cannot run; transformers missing or too old for it; weights that do not fit;
            no tokenizer.
    """
    from dasc_compile.eval.legacy_kda import is_legacy_kda, load_legacy_kda

    path = Path(path)
    cfg = require_model_support(path)
    family = model_family(path, cfg)
    quiet_transformers()
    if init_seed is not None:
        model = build_from_config(path, cfg, init_seed)
    elif is_legacy_kda(cfg):
        model = load_legacy_kda(_load_state(path), cfg, str(path))
    else:
        model = _load_hf(path, cfg, dtype)
    mixers, heads, uph = recurrent_mixers(model)
    if not mixers:
        raise DascInputError(f"{path}: the model has no recurrent (linear-attention) layers; nothing for a plan to compress")
    attention = kv_layer_ids(model.config.get_text_config().layer_types)
    if not attention:
        require_transformers(MIN_TRANSFORMERS_ATTENTION_FREE, f"dasc eval of a model without attention layers ({path})")
    max_chunk = observe_mamba2(mixers)          # acts on Mamba2 mixers only, whatever the family
    try:
        dev = torch.device(device)
        model = model.to(device=dev, dtype=dtype).eval()
    except (RuntimeError, AssertionError) as exc:
        raise DascInputError(f"--device {device}: cannot use this device ({str(exc).splitlines()[0]})") from None
    return EvalModel(model=model, family=family, layer_ids=sorted(mixers), mixers=mixers, num_heads=heads,
                     units_per_head=uph, attention_layer_ids=attention,
                     tokenizer=tokenizer or load_tokenizer(path, cfg), device=dev, config=cfg,
                     cache_arg=cache_arg(model), max_chunk=max_chunk)
