"""Does flash-linear-attention's Triton code run here, agree with the PyTorch paths, and how much faster is it?

    python -m benchmarks.train.fla_probe --fla /tmp/fla [--batch 4]

Runs the GDN and KDA chunk ops at the reference models' training shapes (benchmarks/train/models.py
``ref``, sequence 2560), forward and backward: fla's ``chunk_gated_delta_rule`` / ``chunk_kda`` against
the paths training uses without fla (transformers' ``torch_chunk_gated_delta_rule``,
benchmarks/train/kda_chunk.py). Reports the first call's time (Triton compile and autotune), the
steady time of each path, and the largest output / gradient differences, as one ``FLA_PROBE {json}``
line. transformers' modules are imported before fla is put on ``sys.path``, so they keep their PyTorch
paths. A probe that fails reports the error; it never raises.
"""

from __future__ import annotations

import json
import sys
import time

import torch
from benchmarks.cli_args import OneLineParser


def _inputs(B, T, H, K, V, per_channel: bool, dev):
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k = (torch.randn(B, T, H, K, device=dev, generator=gen, dtype=torch.bfloat16) for _ in range(2))
    v = torch.randn(B, T, H, V, device=dev, generator=gen, dtype=torch.bfloat16)
    shape = (B, T, H, K) if per_channel else (B, T, H)
    g = -torch.rand(*shape, device=dev, generator=gen) * 0.2
    beta = torch.rand(B, T, H, device=dev, generator=gen).to(torch.bfloat16)
    return [q, k, v, g, beta]


def _run(fn, xs, n: int):
    ts, out = [], None
    for _ in range(n):
        ins = [x.detach().clone().requires_grad_(True) for x in xs]
        torch.cuda.synchronize()
        t = time.time()
        o, _ = fn(*ins, use_qk_l2norm_in_kernel=True)
        o.float().square().mean().backward()
        torch.cuda.synchronize()
        ts.append(time.time() - t)
        out = (o.detach().float(), ins[0].grad.float(), ins[3].grad.float())
    return ts, out


def probe(fla_path: str, batch: int) -> dict:
    res: dict = {"ok": False}
    try:
        from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

        from benchmarks.train.kda_chunk import chunk_kda as torch_kda

        sys.path.insert(0, fla_path)
        t = time.time()
        import fla
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from fla.ops.kda import chunk_kda as fla_kda

        res.update(fla_version=fla.__version__, import_s=round(time.time() - t, 1))
        dev = "cuda"
        cases = {"gdn": (chunk_gated_delta_rule, torch_chunk_gated_delta_rule, _inputs(batch, 2560, 16, 64, 32, False, dev)),
                 "kda": (fla_kda, torch_kda, _inputs(batch, 2560, 4, 64, 64, True, dev))}
        for name, (fast, ref, xs) in cases.items():
            t = time.time()
            first, _ = _run(fast, xs, 1)
            steady, (o1, gq1, gg1) = _run(fast, xs, 5)
            ref_t, (o2, gq2, gg2) = _run(ref, xs, 3)
            res[name] = {"first_call_s": round(first[0], 1), "fla_ms": round(1e3 * min(steady), 2),
                         "torch_ms": round(1e3 * min(ref_t[1:]), 2), "speedup": round(min(ref_t[1:]) / min(steady), 2),
                         "max_abs_diff_out": float((o1 - o2).abs().max()), "out_scale": float(o2.abs().max()),
                         "max_abs_diff_grad_q": float((gq1 - gq2).abs().max()), "grad_q_scale": float(gq2.abs().max()),
                         "max_abs_diff_grad_g": float((gg1 - gg2).abs().max()), "grad_g_scale": float(gg2.abs().max()),
                         "wall_s": round(time.time() - t, 1)}
            print(f"[fla_probe] {name}: {json.dumps(res[name])}", flush=True)
        res["ok"] = True
    except Exception as exc:  # the probe reports, it does not fail the call
        res["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
    return res


def main(argv=None) -> None:
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fla", default="/tmp/fla")
    ap.add_argument("--batch", type=int, default=4)
    a = ap.parse_args(argv)
    print("FLA_PROBE " + json.dumps(probe(a.fla, a.batch)), flush=True)


if __name__ == "__main__":
    main()
