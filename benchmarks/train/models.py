"""The three reference hybrids, built by transformers' own classes, and their checkpoint format.

GDN: ``Qwen3NextForCausalLM`` (model type ``qwen3_next``). KDA: ``KimiLinearForCausalLM``
(``kimi_linear``, transformers >= 5.17). Both: 8 layers, recurrent : full attention 3 : 1 as in the
released models (layers 4 and 8 full attention), dense MLPs (no experts), the trimmed Qwen vocabulary
of :mod:`benchmarks.train.tokenizer` (8,192 ids). Sizes (:data:`SIZES`, ``train.py --size``) are set by what
travels: a device call carries its checkpoints in and out within 64 MiB (benchmarks/h200/train_refs.sh):

- ``ref`` (~11M): hidden 256, MLP 768; GDN 4 key / 16 value heads x 64 / 32, attention 4 heads x 64 (2 KV);
  KDA 4 heads x 64; Mamba2 16 heads x 32, MLP 1,344. Parameters: gdn 10,564,480, kda 11,352,344, mamba2
  11,523,616. Two families' checkpoints travel in one call.
- ``m30`` (~30M, issue 20's 30-100M): hidden 512, MLP 1,024; twice ``ref``'s heads at its head dims (GDN 8 key
  / 32 value heads x 64 / 32, attention 8 heads x 64 with 2 KV, KDA 8 heads x 64, Mamba2 32 heads x 32, d_state
  64, MLP 1,792). Parameters: gdn 31,450,432, kda 29,663,280, mamba2 31,084,096 (transformers 5.24; gdn and
  mamba2 the same under 5.12). MLPs are 2 x hidden (Mamba2 3.5 x), not ``ref``'s 3 x (5.25 x): at 3 x GDN has
  37.7M parameters, ~51 MiB packed, which no call carries with the tree and tokenizer. One family per call:
  packed with its training state it is ~40-43 MiB (benchmarks/train/staged_parts.py ``PACKED_MIB``).
- ``pilot`` (~2M: gdn 1,711,480, kda 2,813,612, mamba2 2,845,128): hidden 128, 4 layers, recurrent state per
  layer 4 value heads x 32 x 32 (GDN), for pilots on a CPU (~2.5k tokens/s on one core, GDN).
- ``smoke``: tiny, for tests.

Decays start as each class's ``_init_weights`` draws them, except GDN's ``dt_bias``, redrawn log-uniform
in dt as the Gated DeltaNet authors' layer does (:data:`DECAY_INITS` says why); ``build_model``'s
``decay_init`` keeps the first trained GDN (started from transformers' dt_bias = 1) rebuildable.

Mamba2: ``NemotronHForCausalLM`` (``nemotron_h``, transformers >= 5.12). A Nemotron-H block holds one
mixer or one MLP; the same 8 mixers as above (6 Mamba2, 2 attention: :func:`layer_types`) each followed
by a ReLU^2 MLP except the Mamba2 layer just before an attention layer, as in the released pattern
``M-M-M-M*-``: ``M-M-M*-M-M-M*-`` (14 blocks, given as ``layers_block_type`` in the installed release's
names, :func:`nemotron_block_types`: 5.17 renamed the kinds to ``linear_attention`` / ``full_attention``).
``ref``: 16 heads x 32 x d_state 64 per Mamba2 layer (expand 2, 2 B/C groups), MLP 5.25 x hidden as released;
no positional encoding, untied embeddings as released.

A checkpoint directory (what ``save_checkpoint`` writes) is a Hugging Face model directory:
``config.json``, ``model-0000k-of-0000n.safetensors`` shards of at most 15 MB plus
``model.safetensors.index.json`` (tensor names as transformers' ``save_pretrained`` writes them: for
Kimi-Linear the released checkpoints' names, e.g. ``model.layers.0.self_attn.A_log``), tokenizer
files, ``provenance.json``. Weights are bf16 except ``A_log`` and ``dt_bias`` (fp32, as serving
engines keep them). The Kimi config also carries ``linear_attn_config`` (what dasc compile and the
released Kimi-Linear configs use). Nemotron-H checkpoints name their tensors as released
(``backbone.layers.{i}.mixer.A_log``; transformers renames ``backbone.`` to ``model.`` on load); the
config also carries ``hybrid_override_pattern`` and ``num_hidden_layers`` (as released; transformers'
``to_dict`` leaves them out), and infinities as ``{"__float__": "Infinity"}`` (transformers' own
spelling: ``time_step_limit`` is ``[0, inf]``).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch

from dasc_compile.atomic import replace_dir

FAMILIES = ("gdn", "kda", "mamba2")
MODEL_TYPES = {"gdn": "qwen3_next", "kda": "kimi_linear", "mamba2": "nemotron_h"}   # each family's config model_type
DECAY_SUFFIXES = ("A_log", "dt_bias")
SHARD_BYTES = 15_000_000          # < 16 MiB, the largest file a device call returns

# hidden, MLP, mixer layers, recurrent heads (GDN: key/value heads; KDA: heads), head dims, attention heads;
# Mamba2 (m2_): heads, head dim, d_state, B/C groups, conv kernel, scan chunk, MLP width
SIZES = {
    "ref": dict(hidden=256, mlp=768, layers=8, gdn_hk=4, gdn_hv=16, gdn_dk=64, gdn_dv=32, kda_h=4, kda_d=64,
                attn_heads=4, attn_kv=2, attn_dim=64,
                m2_h=16, m2_p=32, m2_n=64, m2_g=2, m2_k=4, m2_chunk=128, m2_mlp=1344),
    # ~30M (issue 20): hidden x2, heads x2 at ref's head dims; MLPs 2x hidden (Mamba2 3.5x, ref's ratio x 2/3)
    # so that one packed checkpoint with its training state travels in one call (models docstring)
    "m30": dict(hidden=512, mlp=1024, layers=8, gdn_hk=8, gdn_hv=32, gdn_dk=64, gdn_dv=32, kda_h=8, kda_d=64,
                attn_heads=8, attn_kv=2, attn_dim=64,
                m2_h=32, m2_p=32, m2_n=64, m2_g=2, m2_k=4, m2_chunk=128, m2_mlp=1792),
    # a CPU pilot (~2M, module docstring)
    "pilot": dict(hidden=128, mlp=256, layers=4, gdn_hk=2, gdn_hv=4, gdn_dk=32, gdn_dv=32, kda_h=4, kda_d=32,
                  attn_heads=2, attn_kv=1, attn_dim=64,
                  m2_h=8, m2_p=32, m2_n=32, m2_g=2, m2_k=4, m2_chunk=64, m2_mlp=448),
    "smoke": dict(hidden=32, mlp=64, layers=4, gdn_hk=2, gdn_hv=4, gdn_dk=8, gdn_dv=8, kda_h=2, kda_d=8,
                  attn_heads=2, attn_kv=1, attn_dim=16,
                  m2_h=4, m2_p=16, m2_n=8, m2_g=2, m2_k=4, m2_chunk=64, m2_mlp=128),
}


def layer_types(n_layers: int, attention: bool = True) -> list[str]:
    """Every 4th layer full attention (Qwen3-Next's and Kimi-Linear's 3 : 1); ``attention=False``: every layer
    recurrent (the control in which only the recurrent state can carry the prefix: no exact KV to read back)."""
    return ["full_attention" if attention and (i + 1) % 4 == 0 else "linear_attention" for i in range(n_layers)]


def nemotron_pattern(n_mixers: int, attention: bool = True) -> str:
    """Nemotron-H blocks for ``layer_types(n_mixers)``: M (Mamba2) or * (attention), each followed by an
    MLP (-) unless the next mixer is attention (released: ``M-M-M-M*-``); 8 mixers: ``M-M-M*-M-M-M*-``."""
    kinds = layer_types(n_mixers, attention)
    return "".join(("*" if k == "full_attention" else "M") + ("" if nxt == "full_attention" else "-")
                   for k, nxt in zip(kinds, kinds[1:] + [None]))


def model_config(family: str, size: str, vocab_size: int, eos_id: int, max_len: int = 8192, rope: bool = True,
                 attention: bool = True):
    """The transformers config of one reference model. ``rope=False`` (gdn only) gives Qwen3-Next's attention
    no rotary dimensions (``partial_rotary_factor`` 0: position-free, as Kimi-Linear's MLA is), the one change
    between a GDN reference and its no-RoPE control; the parameters, hence the seeded initialisation, are the
    same (the rotary embedding has none). ``attention=False``: every mixer recurrent (:func:`layer_types`), the
    same classes and sizes otherwise; the control in which retrieval must come from the recurrent state
    (``dasc eval`` runs it with transformers >= 5.17).

    Raises:
        ValueError: unknown ``family`` or ``size``; ``rope=False`` for a family without rotary attention, or
            together with ``attention=False``.
    """
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if size not in SIZES:
        raise ValueError(f"size must be one of {tuple(SIZES)}, got {size!r}")
    if not rope and family != "gdn":
        raise ValueError(f"rope=False: only gdn (Qwen3-Next) has rotary attention to switch off, not {family}")
    if not rope and not attention:
        raise ValueError("rope=False with attention=False: without attention layers there is no rotary embedding")
    s = SIZES[size]
    if family == "mamba2":
        return _nemotron_config(s, vocab_size, eos_id, max_len, attention)
    kinds = layer_types(s["layers"], attention)
    common = dict(vocab_size=vocab_size, hidden_size=s["hidden"], intermediate_size=s["mlp"],
                  num_hidden_layers=s["layers"], layer_types=kinds, num_attention_heads=s["attn_heads"],
                  # Kimi's MLA attention has one key/value per head (no grouped-query sharing)
                  num_key_value_heads=s["attn_kv"] if family == "gdn" else s["attn_heads"],
                  rms_norm_eps=1e-6, initializer_range=0.02,
                  bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id)
    if family == "gdn":
        from transformers import Qwen3NextConfig

        no_rope = {} if rope else dict(partial_rotary_factor=0.0, rope_parameters={
            "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.0})
        return Qwen3NextConfig(**no_rope,
            **common, head_dim=s["attn_dim"], linear_num_key_heads=s["gdn_hk"], linear_num_value_heads=s["gdn_hv"],
            linear_key_head_dim=s["gdn_dk"], linear_value_head_dim=s["gdn_dv"], linear_conv_kernel_dim=4,
            num_experts=0, mlp_only_layers=list(range(s["layers"])), tie_word_embeddings=True,
            max_position_embeddings=max_len)
    from transformers import KimiLinearConfig

    return KimiLinearConfig(
        **common, linear_num_heads=s["kda_h"], linear_head_dim=s["kda_d"], linear_conv_kernel_dim=4,
        mlp_layer_types=["dense"] * s["layers"], q_lora_rank=None, kv_lora_rank=s["attn_dim"],
        qk_rope_head_dim=s["attn_dim"] // 2, qk_nope_head_dim=s["attn_dim"], v_head_dim=s["attn_dim"],
        num_experts=1, num_experts_per_tok=1, moe_intermediate_size=s["mlp"], tie_word_embeddings=False,
        max_position_embeddings=max_len)


def nemotron_block_types(config_cls, pattern: str) -> list[str]:
    """``layers_block_type`` of ``pattern`` in the installed transformers' names (5.12: mamba / attention /
    mlp; 5.17+: linear_attention / full_attention / mlp).

    Uses the class's own ``_pattern_to_list`` unless something replaced it with one that drops MLP blocks:
    SGLang (``srt/utils/hf_transformers_patches.py``) does so in every process that imports it, which made
    the same seed build a 4-block model instead of 7 after an SGLang test ran in the same pytest process.
    """
    conv = config_cls._pattern_to_list
    if len(conv("M-")) == 2:
        return conv(pattern)
    names = {c: conv(c)[0] for c in "M*"}
    names["-"] = "mlp"
    return [names[c] for c in pattern]


def _nemotron_config(s: dict, vocab_size: int, eos_id: int, max_len: int, attention: bool = True):
    from transformers import NemotronHConfig

    # time steps as released: dt_0 log-uniform in [1e-3, 0.1] at init, time_step_limit (0, inf) (no clamp in
    # mamba_ssm and SGLang; the trainer's scan, benchmarks/train/mamba2_chunk.py, follows it). No mamba_ssm
    # kernels: nothing is looked up on the Hub and every machine runs the same arithmetic (5.24 ignores the flag
    # and picks kernels where installed, but not in training: the scan is replaced there).
    return NemotronHConfig(
        vocab_size=vocab_size, hidden_size=s["hidden"],
        layers_block_type=nemotron_block_types(NemotronHConfig, nemotron_pattern(s["layers"], attention)),
        intermediate_size=s["m2_mlp"], num_attention_heads=s["attn_heads"], num_key_value_heads=s["attn_kv"],
        head_dim=s["attn_dim"], mamba_num_heads=s["m2_h"], mamba_head_dim=s["m2_p"], ssm_state_size=s["m2_n"],
        n_groups=s["m2_g"], conv_kernel=s["m2_k"], chunk_size=s["m2_chunk"],
        expand=s["m2_h"] * s["m2_p"] // s["hidden"],
        time_step_min=1e-3, time_step_max=0.1, time_step_floor=1e-4, time_step_limit=[0.0, float("inf")],
        use_mamba_kernels=False, layer_norm_epsilon=1e-5, initializer_range=0.02, tie_word_embeddings=False,
        bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id, max_position_embeddings=max_len)


# How a reference model's decays start. "transformers": the class's own _init_weights. "log-uniform-dt"
# (GDN only): A_log as transformers draws it (log U(0.01, 16)), dt_bias redrawn as the Gated DeltaNet
# authors' layer in flash-linear-attention (fla/layers/gated_deltanet.py) and Mamba2 draw it: dt log-uniform
# in [1e-3, 0.1], floored at 1e-4, dt_bias = softplus^-1(dt). Qwen3-Next's _init_weights sets dt_bias = 1
# (an init that real checkpoints always overwrite): with softplus(1) = 1.31 a head's static horizon
# (Eq. 3, eps 1e-3) is ln(1000) / (1.31 A) tokens, above 16 only for A < 0.33, about 2 % of heads, so a plan
# at w_max >= 16 keeps (almost) nothing, and 15M tokens of training did not change that (benchmarks/notes/
# 2026-12-01-trained-refs-quality.md). With log-uniform dt the initial horizons span ~4 to ~10^5 tokens,
# as the trained Qwen3.5 decays do (../shared/data/trained-decays), and training has structure to move.
DECAY_INITS = ("transformers", "log-uniform-dt")
DEFAULT_DECAY_INIT = {"gdn": "log-uniform-dt", "kda": "transformers", "mamba2": "transformers"}


def build_model(family: str, size: str, vocab_size: int, eos_id: int, seed: int, decay_init: str | None = None,
                rope: bool = True, attention: bool = True):
    """The initialised model, fp32 on the CPU (``rope``, ``attention``: :func:`model_config`). The initialisation
    depends only on ``seed``, ``decay_init`` (default :data:`DEFAULT_DECAY_INIT` of the family; see :data:`DECAY_INITS`),
    the architecture and the
    torch / transformers versions, recorded in provenance: it runs on the CPU generator, whatever device
    training uses, so ``dasc eval``'s init control can rebuild it without a stored file.

    Raises:
        ValueError: an unknown ``decay_init``, or "log-uniform-dt" for a family other than gdn; ``rope=False``
            for a family other than gdn or with ``attention=False``.
    """
    from transformers import AutoModelForCausalLM

    from dasc_compile.refckpt import log_uniform_dt_bias

    decay_init = decay_init or DEFAULT_DECAY_INIT[family]
    if decay_init not in DECAY_INITS or (decay_init == "log-uniform-dt" and family != "gdn"):
        allowed = DECAY_INITS if family == "gdn" else ("transformers",)
        raise ValueError(f"decay_init {decay_init!r} for {family}: expected one of {allowed}")
    cfg = model_config(family, size, vocab_size, eos_id, rope=rope, attention=attention)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model = model.float()
    if decay_init == "log-uniform-dt":
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for n, p in model.named_parameters():          # layer order: the same draw for the same seed
                if n.endswith(".dt_bias"):
                    p.copy_(log_uniform_dt_bias(g, p.numel()).view_as(p))
    return model


def is_decay(name: str) -> bool:
    """``A_log`` / ``dt_bias`` of a recurrent layer (live or checkpoint name)."""
    return name.rsplit(".", 1)[-1] in DECAY_SUFFIXES


def decays(model) -> dict[str, torch.Tensor]:
    """Live decay parameters, fp32 copies on the CPU, by parameter name."""
    return {n: p.detach().float().cpu().clone() for n, p in model.named_parameters() if is_decay(n)}


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _json_floats(v):
    """inf / nan as transformers writes them (``{"__float__": "Infinity"}``): plain JSON, read back by
    transformers and by dasc compile."""
    if isinstance(v, float) and not math.isfinite(v):
        return {"__float__": "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")}
    if isinstance(v, dict):
        return {k: _json_floats(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_floats(x) for x in v]
    return v


def _config_json(model) -> dict:
    d = model.config.to_dict()
    d.pop("_name_or_path", None)        # where this process loaded it from (a resume's /tmp folder): not the model's
    if d.get("model_type") == "nemotron_h":
        d["hybrid_override_pattern"] = model.config.hybrid_override_pattern
        d["num_hidden_layers"] = len(d["layers_block_type"])
    if d.get("model_type") == "kimi_linear":
        kinds = d["layer_types"]
        d["linear_attn_config"] = {
            "num_heads": d["linear_num_heads"], "head_dim": d["linear_head_dim"],
            "short_conv_kernel_size": d["linear_conv_kernel_dim"],
            "kda_layers": [i + 1 for i, k in enumerate(kinds) if k == "linear_attention"],
            "full_attn_layers": [i + 1 for i, k in enumerate(kinds) if k == "full_attention"]}
    d["dtype"] = "bfloat16"
    return _json_floats(d)


def save_checkpoint(model, out: Path, tokenizer_dir: Path | None, provenance: dict | None) -> Path:
    """Write ``model`` as a checkpoint directory (format: module docstring); replaces ``out`` atomically
    (written beside it, then moved into place by :func:`dasc_compile.atomic.replace_dir`). Returns ``out``."""
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    sd, seen = {}, set()
    for n, t in model.state_dict().items():
        if t.data_ptr() in seen:          # tied (GDN's lm_head is its embedding): stored once, as transformers does
            continue
        seen.add(t.data_ptr())
        sd[n] = (t.detach().float() if is_decay(n) else t.detach().to(torch.bfloat16)).cpu().contiguous()
    model.save_pretrained(str(tmp), state_dict=sd, max_shard_size=SHARD_BYTES)
    (tmp / "config.json").write_text(json.dumps(_config_json(model), indent=1, sort_keys=True) + "\n")
    (tmp / "generation_config.json").unlink(missing_ok=True)
    if tokenizer_dir is not None:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy2(Path(tokenizer_dir) / f, tmp / f)
    if provenance is not None:
        (tmp / "provenance.json").write_text(json.dumps(provenance, indent=1) + "\n")
    replace_dir(tmp, out)
    return out


def family_unsupported(family: str) -> str | None:
    """Why this transformers cannot build or load ``family``'s model (one phrase), or None: KDA needs
    ``KimiLinearForCausalLM``, first in transformers 5.17."""
    import importlib.util

    if family == "kda" and importlib.util.find_spec("transformers.models.kimi_linear") is None:
        import transformers

        return f"needs transformers >= 5.17 (KimiLinearForCausalLM); this one is {transformers.__version__}"
    return None


def load_model(path: Path):
    """A checkpoint directory as an fp32 model on the CPU (transformers' own loader and name mapping)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).float()


def checkpoint_decays(path: Path) -> dict[str, torch.Tensor]:
    """The decay tensors of a checkpoint directory, by their names in the files (fp32)."""
    from safetensors import safe_open

    out = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(f), "pt") as fh:
            for k in fh.keys():
                if is_decay(k):
                    out[k] = fh.get_tensor(k).float()
    return out
