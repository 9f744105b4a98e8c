"""Tiny Qwen3-Next checkpoint, plans and a kernel self-test for the H200 runtime smoke (runtime_smoke.sh).

Subcommands (run on the device, one call):

* ``checkpoint CONFIG OUT``: a full safetensors checkpoint in the on-disk Qwen3-Next format
  (names / shapes / dtypes from ``dasc_compile.refckpt.parameter_table``): every weight a
  seeded random draw (std 0.02, norms 1), the decay tensors set to SYNTHETIC values (not trained):
  per recurrent layer, value head h has exp(A_log) = A[(h + layer) % 8] with
  A = (0.02, 0.05, 0.1, 0.3, 1, 3, 8, 15) and dt_bias = 1, i.e. retention horizons of about
  313, 125, 63, 21, 6, 2, 0.8, 0.4 tokens, so W_max = 16 keeps 4 of 8 heads in every layer.
  ``--other-decay`` shifts A by one head (a different model for the mismatch check).
* ``plan CKPT OUT --wmax N``: ``dasc_compile.compiler.compile_plan`` with the kernels rendered.
* ``selftest PLAN``: the plan's Triton kernels vs the PyTorch reference on a CUDA pool (bit-exact);
  prints ``KERNELS OK`` or ``KERNELS FAIL ...`` and exits 0 / 1.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
from benchmarks.cli_args import OneLineParser

A_TABLE = (0.02, 0.05, 0.1, 0.3, 1.0, 3.0, 8.0, 15.0)


def _decay(name: str, shape, layer: int, shift: int) -> torch.Tensor:
    h = shape[0]
    if name.endswith("A_log"):
        a = [A_TABLE[(j + layer + shift) % len(A_TABLE)] for j in range(h)]
        return torch.log(torch.tensor(a, dtype=torch.float64)).to(torch.float32)
    return torch.ones(h, dtype=torch.bfloat16)


def write_checkpoint(config_path: str, out: str, *, shift: int = 0, seed: int = 0, decay_only: bool = False) -> Path:
    """Write ``out/config.json`` + ``out/model.safetensors`` (see module docstring)."""
    from safetensors.torch import save_file

    from dasc_compile.refckpt import parameter_table

    cfg = json.loads(Path(config_path).read_text())
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    # a CPU generator on every machine: the same seed gives the same weights on the H200 and on a
    # CPU, so benchmarks/wr_reference_check.py can replay a device run's windows on a CPU
    dev = "cpu"
    gen = torch.Generator(device=dev).manual_seed(seed)
    dt = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16}
    tensors = {}
    for name, shape, code in parameter_table(cfg):
        if name.startswith("mtp."):
            continue
        if name.endswith(("A_log", "dt_bias")):
            layer = int(name.split(".layers.")[1].split(".")[0])
            tensors[name] = _decay(name, shape, layer, shift)
            continue
        if decay_only:
            continue
        if name.endswith("norm.weight") or "layernorm" in name:
            t = torch.ones(shape, dtype=dt[code], device=dev)
        else:
            t = (torch.randn(shape, generator=gen, device=dev, dtype=torch.float32) * 0.02).to(dt[code])
        tensors[name] = t.cpu()
    save_file(tensors, str(out_dir / "model.safetensors"),
              metadata={"format": "pt", "dasc_provenance": "synthetic smoke-test weights, not trained"})
    n = sum(math.prod(t.shape) for t in tensors.values())
    print(f"checkpoint {out_dir}: {len(tensors)} tensors, {n / 1e6:.1f} M parameters (decay shift {shift})")
    return out_dir


def compile_plan_dir(ckpt: str, out: str, w_max: int, **policy) -> None:
    from dasc_compile.compiler import compile_plan
    from dasc_compile.policy import Policy

    plan, path = compile_plan(ckpt, Policy(w_max=w_max, **policy), out, with_kernels=True)
    t = plan.totals
    print(f"plan {path}: w_max={w_max}, kept {t.n_kept}/{t.n_units} heads, per layer "
          f"{[lp.kept_units for lp in plan.layers]}, C_ckpt={t.c_ckpt:.2f}, decay sha256 "
          f"{plan.fingerprint.decay_sha256[:16]}...")


def selftest(plan_dir: str) -> int:
    """Kernels vs reference on CUDA for the served shapes (TP = 1)."""
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape
    from sglang.srt.mem_cache.memory_pool import MambaPool

    from dasc_compile.schema import load_plan
    from dasc_runtime.ops import KernelOps, select_ops
    from dasc_runtime.ops import TorchOps as ReferenceOps
    from dasc_runtime.pool import DascCheckpointPool
    from dasc_runtime.rank_layout import build_rank_layout as rank_layout

    plan = load_plan(plan_dir)
    m = plan.model
    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=m.num_value_heads * m.head_v_dim,
                                    n_groups=m.conv_groups or m.num_key_heads, num_heads=m.num_value_heads,
                                    head_dim=m.head_v_dim,
                                    state_size=m.head_k_dim, conv_kernel=m.conv_kernel)
    layers = list(range(len(plan.layers)))
    cp = Mamba2CacheParams(shape=shape, layers=layers, dtype=Mamba2StateDType(conv=torch.bfloat16,
                                                                               temporal=torch.float32))
    layout = rank_layout(plan, 0, 1, len(layers))
    kops = select_ops(plan, plan_dir, layout, "cuda")
    if not isinstance(kops, KernelOps):
        print("KERNELS FAIL: no kernel module in the plan")
        return 1
    results = []
    for ops in (ReferenceOps(), kops):
        torch.manual_seed(0)
        mp = MambaPool(size=8, spec_state_size=8, cache_params=cp, mamba_layer_ids=layers, device="cuda")
        mp.mamba_cache.temporal.normal_()
        for c in mp.mamba_cache.conv:
            c.normal_()
        dp = DascCheckpointPool(layout=layout, num_slots=4, conv_shapes=shape.conv, native_size=8, device="cuda",
                                ops=ops)
        ids = torch.cat([dp.alloc(1), dp.alloc(1), dp.alloc(1)])
        dp.store_from_active(mp, torch.tensor([5, 2, 7], device="cuda"), ids)
        dp.load_to_active(mp, ids.flip(0), torch.tensor([1, 3, 4], device="cuda"))
        torch.cuda.synchronize()
        results.append((dp.temporal.clone(), [c.clone() for c in dp.conv], mp.mamba_cache.temporal.clone(),
                        [c.clone() for c in mp.mamba_cache.conv]))
    (a_t, a_c, a_s, a_sc), (b_t, b_c, b_s, b_sc) = results
    same = (torch.equal(a_t, b_t) and all(torch.equal(x, y) for x, y in zip(a_c, b_c))
            and torch.equal(a_s, b_s) and all(torch.equal(x, y) for x, y in zip(a_sc, b_sc)))
    print("KERNELS OK (pack + load bit-exact vs the PyTorch reference)" if same
          else "KERNELS FAIL: kernel pool or restored state differs from the reference")
    return 0 if same else 1


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{checkpoint,plan,selftest}")
    c = sub.add_parser("checkpoint")
    c.add_argument("config")
    c.add_argument("out")
    c.add_argument("--other-decay", action="store_true")
    c.add_argument("--decay-only", action="store_true")
    p = sub.add_parser("plan")
    p.add_argument("ckpt")
    p.add_argument("out")
    p.add_argument("--wmax", type=int, required=True)
    s = sub.add_parser("selftest")
    s.add_argument("plan")
    a = ap.parse_args(argv)
    if a.cmd == "checkpoint":
        write_checkpoint(a.config, a.out, shift=1 if a.other_decay else 0, decay_only=a.decay_only)
        return 0
    if a.cmd == "plan":
        compile_plan_dir(a.ckpt, a.out, a.wmax)
        return 0
    return selftest(a.plan)


if __name__ == "__main__":
    sys.exit(main())
