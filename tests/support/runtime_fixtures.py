"""Tiny plans and SGLang pools for the runtime tests (CPU, the installed SGLang's own classes: 0.5.17 or 0.5.23).

Plans come from the real compiler (``dasc_compile.compiler.compile_plan``) run on a tiny
decay-only checkpoint written here, so the runtime is tested against what users will load.

Tiny GDN model (``qwen3_next``): 4 layers, full-attention interval 4 -> recurrent layers 0, 1, 2;
4 value heads, 2 key heads, d_v = d_k = 16, conv kernel 4 (the shapes of
/work/shared/sglang-cpu/smoke.py). A_log per head is chosen so W_max = 16 keeps heads
{0, 1} / {0, 3} / {0, 1, 2} (7 of 12), i.e. a ragged plan; dt_bias = 1.
Tiny KDA model (``kimi_linear``): 4 layers, KDA layers 1-3 (1-indexed), 2 heads, d = 8.
"""

from __future__ import annotations

import json
import math
import struct
from array import array
from pathlib import Path

import torch

SGLANG_SKIP_REASON = ""
try:  # the runtime tests need SGLang's cache classes (a tested release: dasc_runtime.sglang_api)
    import sglang  # noqa: F401
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape
except Exception as exc:  # pragma: no cover - depends on the environment
    SGLANG_SKIP_REASON = f"sglang cannot be imported ({type(exc).__name__}: {exc})"


def as_on_a_gpu_machine(visible: bool = True):
    """Make this process's launches see a CUDA GPU (``visible``) or none: the launch's last check,
    ``startup_checks.cuda_visible``, is a property of the machine, and the runtime tests launch SGLang's option
    parsing and cache classes on CPU machines. Returns the function replaced (to put back)."""
    from dasc_runtime import startup_checks

    replaced = startup_checks.cuda_visible
    startup_checks.cuda_visible = lambda: visible
    return replaced


GDN_HEADS, GDN_KEY_HEADS, GDN_D = 4, 2, 16
GDN_LINEAR, GDN_FULL = [0, 1, 2], [3]
# per recurrent layer: a = exp(A_log); H_s = ln(1e3) / (a * softplus(-0.3 + 1)) = 6.26 / a tokens
GDN_A = [[0.02, 0.1, 1.0, 8.0], [0.02, 3.0, 5.0, 0.05], [0.01, 0.02, 0.03, 9.0]]
GDN_KEPT_W16 = [[0, 1], [0, 3], [0, 1, 2]]


def gdn_config() -> dict:
    return {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "num_hidden_layers": 4,
        "full_attention_interval": 4, "hidden_size": 64, "head_dim": 16, "num_attention_heads": 2,
        "num_key_value_heads": 1, "linear_conv_kernel_dim": 4, "linear_key_head_dim": GDN_D,
        "linear_value_head_dim": GDN_D, "linear_num_key_heads": GDN_KEY_HEADS, "linear_num_value_heads": GDN_HEADS,
        "intermediate_size": 64, "vocab_size": 512, "torch_dtype": "bfloat16",
    }


KDA_HEADS, KDA_D = 2, 8


def kda_config() -> dict:
    return {
        "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "num_hidden_layers": 4,
        "hidden_size": 64, "num_attention_heads": 2, "vocab_size": 512, "dtype": "bfloat16",
        "linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4], "num_heads": KDA_HEADS,
                               "head_dim": KDA_D, "short_conv_kernel_size": 4},
    }


# Tiny Mamba2 model (``nemotron_h``, pattern "MMM*"): recurrent layers 0, 1, 2; 4 heads of [head_dim 8,
# d_state 16], 2 B/C groups, conv 4. dt_bias = softplus^-1(0.1), a_s = 0: H_s = ln(1e3) / (0.1 a) = 69.08 / a
# tokens, so W_max = 16 keeps a < 4.32: heads {0, 2} / {1, 3} / {0, 1, 2} (7 of 12).
M2_HEADS, M2_HEAD_DIM, M2_STATE, M2_GROUPS = 4, 8, 16, 2
M2_A = [[0.5, 8.0, 2.0, 16.0], [10.0, 1.0, 9.0, 3.0], [0.1, 0.2, 0.4, 30.0]]
M2_KEPT_W16 = [[0, 2], [1, 3], [0, 1, 2]]


def mamba2_config(n_groups: int = M2_GROUPS) -> dict:
    return {
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "num_hidden_layers": 4,
        "hybrid_override_pattern": "MMM*", "hidden_size": 32, "mamba_num_heads": M2_HEADS,
        "mamba_head_dim": M2_HEAD_DIM, "ssm_state_size": M2_STATE, "n_groups": n_groups, "conv_kernel": 4,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 512,
        "torch_dtype": "bfloat16",
    }


def mamba2_decay_tensors(a_table=M2_A) -> list[tuple[str, torch.Tensor]]:
    dt_bias = math.log(math.expm1(0.1))
    out = []
    for layer, a in zip((0, 1, 2), a_table):
        p = f"backbone.layers.{layer}.mixer"
        out.append((f"{p}.A_log", torch.log(torch.tensor(a, dtype=torch.float64)).to(torch.float32)))
        out.append((f"{p}.dt_bias", torch.full((M2_HEADS,), dt_bias, dtype=torch.float32)))
    return out


_ST = {torch.float32: "F32", torch.bfloat16: "BF16"}


def write_safetensors(path: Path, tensors: list[tuple[str, torch.Tensor]]) -> None:
    """Minimal safetensors writer (header + raw little-endian bytes, tensors in the given order)."""
    header, blobs, off = {}, [], 0
    for name, t in tensors:
        raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": _ST[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = {"format": "pt", "dasc_provenance": "synthetic test values, not trained"}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def gdn_decay_tensors(a_table=GDN_A) -> list[tuple[str, torch.Tensor]]:
    out = []
    for layer, a in zip(GDN_LINEAR, a_table):
        p = f"model.layers.{layer}.linear_attn"
        out.append((f"{p}.A_log", torch.log(torch.tensor(a, dtype=torch.float64)).to(torch.float32)))
        out.append((f"{p}.dt_bias", torch.ones(GDN_HEADS, dtype=torch.bfloat16)))
    return out


def kda_decay_tensors(seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for layer in (0, 1, 2):
        p = f"model.layers.{layer}.self_attn"
        a = torch.log(0.01 + 3.0 * torch.rand(KDA_HEADS, generator=g, dtype=torch.float64))
        d = torch.randn(KDA_HEADS * KDA_D, generator=g, dtype=torch.float64) * 2.0 - 1.0
        out.append((f"{p}.A_log", a.reshape(1, 1, KDA_HEADS, 1).to(torch.float32)))
        out.append((f"{p}.dt_bias", d.to(torch.float32)))
    return out


def write_checkpoint(root: Path, config: dict, tensors) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config))
    write_safetensors(root / "model.safetensors", tensors)
    return root


def compile_tiny(tmp: Path, kind: str = "gdn", with_kernels: bool = False, **policy):
    """Compile a plan for the tiny GDN, KDA or Mamba2 (``n_groups`` policy key: its B/C groups) model;
    returns ``(plan, plan_dir, ckpt_dir)``."""
    from dasc_compile.compiler import compile_plan
    from dasc_compile.policy import Policy

    ckpt = tmp / f"{kind}-ckpt"
    if kind == "gdn":
        write_checkpoint(ckpt, gdn_config(), gdn_decay_tensors(policy.pop("a_table", GDN_A)))
    elif kind == "mamba2":
        n_groups = policy.pop("n_groups", M2_GROUPS)
        ckpt = tmp / f"{kind}-g{n_groups}-ckpt"
        write_checkpoint(ckpt, mamba2_config(n_groups), mamba2_decay_tensors(policy.pop("a_table", M2_A)))
    else:
        write_checkpoint(ckpt, kda_config(), kda_decay_tensors(policy.pop("seed", 0)))
    policy.setdefault("w_max", 16)
    name = f"{ckpt.name[:-5]}-{'k' if with_kernels else 'n'}-{abs(hash(json.dumps(policy, sort_keys=True)))}.dasc"
    plan, out = compile_plan(ckpt, Policy(**policy), tmp / name, with_kernels=with_kernels)
    return plan, out, ckpt


# ---------------------------------------------------------------- SGLang pools on device="cpu"

def as_scheduler_env() -> None:
    """Mark this process's ``DASC_*`` settings as a scheduler process inherits them: checked by its launcher, another
    process (``launcher.CHECKED_VAR``), so a ``ServerArgs(...)`` built here is not a launch to check again."""
    import os

    from dasc_runtime.launcher import CHECKED_VAR, checked_mark

    os.environ[CHECKED_VAR] = checked_mark(os.environ, os.getppid())


def set_server_args(chunk: int = 64, **options):
    """Publish ``ServerArgs(model_path="dummy", page_size=1, **options)`` as a scheduler would; options are
    given at construction (0.5.23's record is read-only once published)."""
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    sa = ServerArgs(model_path="dummy", page_size=1, **options)
    sa._mamba_cache_chunk_size = chunk
    set_global_server_args_for_scheduler(sa)
    return sa


def gdn_cache_params(tp_size: int = 1):
    shape = Mamba2StateShape.create(tp_world_size=tp_size, intermediate_size=GDN_HEADS * GDN_D, n_groups=GDN_KEY_HEADS,
                                    num_heads=GDN_HEADS, head_dim=GDN_D, state_size=GDN_D, conv_kernel=4)
    return Mamba2CacheParams(shape=shape, layers=GDN_LINEAR,
                             dtype=Mamba2StateDType(conv=torch.bfloat16, temporal=torch.float32))


def kda_cache_params(tp_size: int = 1):
    from sglang.srt.configs.mamba_utils import KimiLinearCacheParams, KimiLinearStateShape, Mamba2StateDType

    shape = KimiLinearStateShape.create(tp_world_size=tp_size, num_heads=KDA_HEADS, head_dim=KDA_D, conv_kernel_size=4)
    return KimiLinearCacheParams(shape=shape, layers=[0, 1, 2],
                                 dtype=Mamba2StateDType(conv=torch.bfloat16, temporal=torch.float32))


def mamba2_cache_params(tp_size: int = 1, n_groups: int = M2_GROUPS):
    """SGLang's own Mamba2 state shape for the tiny Nemotron-H (``configs/nemotron_h.py`` passes these fields)."""
    shape = Mamba2StateShape.create(tp_world_size=tp_size, intermediate_size=M2_HEADS * M2_HEAD_DIM, n_groups=n_groups,
                                    num_heads=M2_HEADS, head_dim=M2_HEAD_DIM, state_size=M2_STATE, conv_kernel=4)
    return Mamba2CacheParams(shape=shape, layers=[0, 1, 2],
                             dtype=Mamba2StateDType(conv=torch.bfloat16, temporal=torch.float32))


def cache_params_for(kind: str, tp_size: int = 1):
    """SGLang cache parameters of the tiny model of ``kind`` (``gdn`` | ``kda`` | ``mamba2``)."""
    return {"gdn": gdn_cache_params, "kda": kda_cache_params, "mamba2": mamba2_cache_params}[kind](tp_size)


def hybrid_pools(cache_params, mamba_size: int = 8, req_size: int = 8, kv_size: int = 4096,
                 extra_buffer: bool = False, wr_plan=None, refresh_slots=None):
    """SGLang's HybridReqToTokenPool + KV pool + allocator on CPU (as in smoke.py); with ``wr_plan``
    the pool gets dasc-wr's hidden scratch rows and slots (``wr_scratch.build_pool_with_scratch``)."""
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool

    lin = list(cache_params.layers)
    kwargs = dict(size=req_size, mamba_size=mamba_size, mamba_spec_state_size=req_size, max_context_len=512,
                  device="cpu", enable_memory_saver=False, cache_params=cache_params, mamba_layer_ids=lin,
                  enable_mamba_extra_buffer=extra_buffer)
    if wr_plan is None:
        pool = HybridReqToTokenPool(**kwargs)
    else:
        from dasc_runtime.wr_scratch import build_pool_with_scratch

        pool = HybridReqToTokenPool.__new__(HybridReqToTokenPool)
        build_pool_with_scratch(HybridReqToTokenPool.__init__, pool, kwargs, wr_plan, refresh_slots=refresh_slots)
    kv = HybridLinearKVPool(size=kv_size, dtype=torch.bfloat16, page_size=1, head_num=1, head_dim=16,
                            full_attention_layer_ids=[max(lin) + 1], device="cpu", enable_memory_saver=False,
                            mamba_pool=pool.mamba_pool)
    alloc = TokenToKVPoolAllocator(size=kv_size, dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=False)
    return pool, alloc


def fill_random(mamba_pool, seed: int = 0) -> None:
    """Distinct random values in every native slot (temporal FP32, conv BF16)."""
    g = torch.Generator().manual_seed(seed)
    c = mamba_pool.mamba_cache
    c.temporal.copy_(torch.randn(c.temporal.shape, generator=g))
    for t in c.conv:
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))


def radix_key(tokens):
    from sglang.srt.mem_cache.radix_cache import RadixKey

    return RadixKey(array("q", list(tokens)))


def math_horizon(a: float) -> float:
    """H_s for GDN with dt_bias = 1, a_s = -0.3, eps = 1e-3 (Eq. 2-3), tokens."""
    return math.log(1e3) / (a * math.log1p(math.exp(0.7)))
