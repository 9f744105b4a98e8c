"""Loading a Hugging Face checkpoint for ``dasc eval`` and reaching its recurrent state checkpoint.

Supported (all in pure PyTorch, float32 by default, so a CPU runs them):

* GDN hybrids through transformers' own modeling code: ``qwen3_next`` (``Qwen3NextForCausalLM``),
  ``qwen3_5`` / ``qwen3_5_moe`` (through ``AutoModelForCausalLM``). Each GDN layer's kernels are
  pinned to transformers' PyTorch implementations (``torch_chunk_gated_delta_rule``,
  ``torch_recurrent_gated_delta_rule``, ``torch_causal_conv1d_update``) so results do not depend on
  which optional kernel packages happen to be installed.
* KDA: ``kimi_linear`` checkpoints of dasc's small KDA hybrid (:mod:`dasc_compile.eval.kda_hybrid`).
* Mamba2 hybrids through transformers' own classes: ``nemotron_h``, ``granitemoehybrid``, ``falcon_h1``
  (:mod:`dasc_compile.eval.mamba2`).

The recurrent state checkpoint at a prefix boundary is the transformers cache object after the prefix:
``cache.layers[i].recurrent_states`` ``[B, H, d_k, d_v]`` (key-major; the paper's ``[d_v, d_k]``
transposed) and ``cache.layers[i].conv_states`` ``[B, conv_dim, K]``; full-attention layers hold
their KV in the same cache (transformers ``cache_utils.LinearAttentionLayer`` / ``DynamicLayer``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dasc_compile.errors import DascInputError

GDN_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
MAMBA2_TYPES = ("nemotron_h", "granitemoehybrid", "falcon_h1")   # loaded by dasc_compile.eval.mamba2


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255 (the stand-in vocabulary of dasc's small trained models)."""

    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A tokenizer shipped beside the checkpoint (``tokenizer.json`` etc.), read with transformers."""

    def __init__(self, path: Path):
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.vocab_size = len(self._tok)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


@dataclass
class EvalModel:
    """A loaded hybrid model and where its recurrent state lives.

    Attributes:
        model: the causal LM (eval mode, on ``device``).
        family: ``gdn`` | ``kda``.
        layer_ids: model layer ids of the recurrent layers, increasing (= the plan's ``recurrent_layer_ids``).
        mixers: layer id -> recurrent token-mixer module.
        num_heads: value heads H_v (GDN) or heads H (KDA). units_per_head: 1 (GDN) or d_k (KDA).
        kernel_attrs: names of the mixer attributes holding the chunked and one-token kernels
            (horizon validation wraps them to observe the log-decay g).
        tokenizer: ``encode(str) -> list[int]`` / ``decode``.
    """

    model: torch.nn.Module
    family: str
    layer_ids: list[int]
    mixers: dict[int, torch.nn.Module]
    num_heads: int
    units_per_head: int
    kernel_attrs: tuple[str, str]
    tokenizer: object
    device: torch.device
    config: dict = field(default_factory=dict)
    max_chunk: int | None = None      # Mamba2 (dasc_compile.eval.mamba2): at most one chunk, then one token a call

    def new_cache(self):
        """An empty transformers ``DynamicCache`` for this model (one linear-attention slot per GDN/KDA layer)."""
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @torch.no_grad()
    def forward(self, ids: list[int] | torch.Tensor, cache) -> torch.Tensor:
        """Run ``ids`` (``[T]``, batch 1) after what ``cache`` holds; returns float32 logits ``[T, vocab]``.

        With :attr:`max_chunk`, a fresh cache takes at most that many tokens in one call and every later
        token is one step of the recurrence (:mod:`dasc_compile.eval.mamba2` says why)."""
        x = torch.as_tensor(ids, dtype=torch.long, device=self.device).reshape(-1)
        if self.max_chunk is None:
            return self._call(x, cache)
        n = 0 if cache.has_previous_state(self.layer_ids[0]) else min(x.numel(), self.max_chunk)
        return torch.cat(([self._call(x[:n], cache)] if n else [])
                         + [self._call(x[t:t + 1], cache) for t in range(n, x.numel())])

    def _call(self, x: torch.Tensor, cache) -> torch.Tensor:
        out = self.model(input_ids=x.reshape(1, -1), past_key_values=cache, use_cache=True)
        return out.logits[0].float()


def _read_config(path: Path) -> dict:
    if not path.is_dir():
        raise DascInputError(f"{path}: dasc eval needs a model directory holding config.json and the weights")
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


def _tokenizer(path: Path, cfg: dict):
    if cfg.get("dasc_tokenizer") == "bytes":
        return ByteTokenizer()
    if any((path / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        return HFTokenizer(path)
    raise DascInputError(f"{path}: no tokenizer files (tokenizer.json) and config.json does not set "
                         f"'dasc_tokenizer': 'bytes'")


def _pin_torch_gdn_kernels(mod) -> None:
    import importlib

    mm = importlib.import_module(type(mod).__module__)
    mod.chunk_gated_delta_rule = mm.torch_chunk_gated_delta_rule
    mod.recurrent_gated_delta_rule = mm.torch_recurrent_gated_delta_rule
    mod.causal_conv1d_fn = None
    mod.causal_conv1d_update = mm.torch_causal_conv1d_update


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


def check_weights(path: Path, want: int, dtype: torch.dtype) -> None:
    """Refuse a checkpoint that holds fewer parameters than its config describes (a decay-only
    reference, whose other weights transformers would silently draw at random), or a model too large
    for this machine's free memory.

    Args:
        want: parameter count of the model the config describes (built on the meta device).
    Raises:
        DascInputError: naming the directory, the counts, and the bytes needed.
    """
    have = _checkpoint_numel(path)
    if have < 0.99 * want:
        raise DascInputError(
            f"{path}: the weights hold {have:,} of the {want:,} parameters config.json describes; dasc eval needs "
            f"the whole trained checkpoint (a decay-only reference file is enough for dasc compile, not for eval)")
    need = want * torch.empty((), dtype=dtype).element_size()
    free = _available_bytes()
    if free is not None and need > 0.8 * free:
        raise DascInputError(f"{path}: the model needs ~{need / 2**30:.1f} GiB in {str(dtype).split('.')[-1]}; "
                             f"this machine has {free / 2**30:.1f} GiB free")


def _load_transformers(path: Path, cfg: dict, dtype: torch.dtype):
    """A whole checkpoint through transformers' ``AutoModelForCausalLM`` (refused, in one line, when it
    holds fewer parameters than its config describes or misses weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        with torch.device("meta"):
            meta = AutoModelForCausalLM.from_config(config)
        check_weights(path, sum(p.numel() for p in meta.parameters()), dtype)
        del meta
        model, info = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True,
                                                           output_loading_info=True)
    except DascInputError:
        raise
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise DascInputError(f"{path}: transformers cannot load this {cfg.get('model_type')} checkpoint "
                             f"({str(exc).splitlines()[0][:200]})") from None
    missing = [k for k in info.get("missing_keys", []) if "lm_head" not in k or not config.get_text_config().tie_word_embeddings]
    if missing:
        raise DascInputError(f"{path}: {len(missing)} weights missing from the checkpoint (e.g. {missing[0]}); "
                             f"dasc eval needs the whole trained checkpoint")
    return model


def _load_gdn(path: Path, cfg: dict, dtype: torch.dtype):
    model = _load_transformers(path, cfg, dtype)
    mixers = {}
    for mod in model.modules():
        if hasattr(mod, "chunk_gated_delta_rule") and hasattr(mod, "A_log") and hasattr(mod, "layer_idx"):
            _pin_torch_gdn_kernels(mod)
            mixers[int(mod.layer_idx)] = mod
    heads = next(iter(mixers.values())).num_v_heads if mixers else 0
    return model, mixers, heads, 1, ("chunk_gated_delta_rule", "recurrent_gated_delta_rule")


def _load_kda(path: Path, cfg: dict, dtype: torch.dtype):
    from dasc_compile.eval.kda_hybrid import ARCHITECTURE, backbone_config, build_kda_hybrid, from_kimi_names

    if ARCHITECTURE not in (cfg.get("architectures") or []) or "dasc_backbone" not in cfg:
        raise DascInputError(
            f"{path / 'config.json'}: this kimi_linear checkpoint is not a {ARCHITECTURE}; dasc eval runs KDA "
            f"through its own small KDA hybrid only (transformers here has no Kimi-Linear model)")
    lac = cfg["linear_attn_config"]
    backbone = backbone_config(cfg)
    model = build_kda_hybrid(backbone, lac["num_heads"], lac["head_dim"], lac["short_conv_kernel_size"])
    kda_layers = [i - 1 for i in lac["kda_layers"]]
    state = from_kimi_names(_load_state(path), kda_layers)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith("lm_head.weight") or not backbone.tie_word_embeddings]
    if missing or unexpected:
        raise DascInputError(f"{path}: weights do not fit {ARCHITECTURE} (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]})")
    if backbone.tie_word_embeddings:
        model.tie_weights()
    model = model.to(dtype)
    mixers = {i: model.model.layers[i].linear_attn for i in kda_layers}
    return model, mixers, lac["num_heads"], lac["head_dim"], ("chunk_kernel", "step_kernel")


def load_eval_model(path: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> EvalModel:
    """Load the model at ``path`` (a directory with config.json, weights and a tokenizer).

    Raises:
        DascInputError: not a model directory; a model type without recurrent (GDN / KDA) layers or one
            dasc eval cannot run; weights that do not fit; no tokenizer.
    """
    path = Path(path)
    cfg = _read_config(path)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()      # no optional-kernel warnings or weight-loading bars in the CLI's output
    hf_logging.disable_progress_bar()
    mt = cfg.get("model_type")
    max_chunk = None
    if mt in GDN_TYPES:
        model, mixers, heads, uph, kattrs = _load_gdn(path, cfg, dtype)
        family = "gdn"
    elif mt == "kimi_linear":
        model, mixers, heads, uph, kattrs = _load_kda(path, cfg, dtype)
        family = "kda"
    elif mt in MAMBA2_TYPES:   # transformers' own Mamba2 hybrids (dasc_compile.eval.mamba2)
        from dasc_compile.eval.mamba2 import mamba2_mixers

        model = _load_transformers(path, cfg, dtype)
        mixers, heads, uph, kattrs, max_chunk = mamba2_mixers(model)
        family = "mamba2"
    else:
        raise DascInputError(
            f"{path / 'config.json'}: model_type {mt!r} has no recurrent (linear-attention) layers dasc eval can run; "
            f"expected a GDN hybrid ({', '.join(GDN_TYPES)}), a Mamba2 hybrid ({', '.join(MAMBA2_TYPES)}) or "
            f"dasc's KDA hybrid (kimi_linear)")
    if not mixers:
        raise DascInputError(f"{path}: the model has no recurrent (linear-attention) layers; nothing for a plan to compress")
    try:
        dev = torch.device(device)
        model = model.to(dev).eval()
    except (RuntimeError, AssertionError) as exc:
        raise DascInputError(f"--device {device}: cannot use this device ({str(exc).splitlines()[0]})") from None
    return EvalModel(model=model, family=family, max_chunk=max_chunk, layer_ids=sorted(mixers), mixers=mixers, num_heads=heads,
                     units_per_head=uph, kernel_attrs=kattrs, tokenizer=_tokenizer(path, cfg), device=dev, config=cfg)
