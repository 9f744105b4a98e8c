"""One H200 call: train the small GDN and KDA hybrids, compile plans, run ``dasc eval`` and horizon
validation on them, and probe flash-linear-attention's KDA kernels; everything lands in ``--out``.

    python -m benchmarks.h200.train_eval --data .dev/train/data --out $OUT [--deadline 560] [--smoke]

Stages share one deadline (seconds from start): training GDN then KDA (``--train-seconds`` each, the step
count fixed after 20 steps from the measured speed, see benchmarks/train_hybrid.py), ``dasc compile`` at
each ``--wmax`` (no kernels: the plans are only read by dasc eval), ``dasc eval`` (held-out ShareGPT
prompts + built-in retrieval prompts; time-capped per model), ``dasc eval --horizons`` (Table 1(b)), then
the fla probe in a subprocess with its own time limit (fla on ``PYTHONPATH`` only there, so transformers
never picks fla's GDN kernels). Output files (at most 8): ``run.log`` (written by the caller's tee),
``gdn.tar`` / ``kda.tar`` (checkpoint + train_log.json), ``results.tar`` (JSON documents and plots).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

T0 = time.time()


def left(deadline: float) -> float:
    return deadline - (time.time() - T0)


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


FLA_PROBE = r"""
import json, sys, time, torch
out = {"ok": False}
try:
    t0 = time.time()
    import fla
    from fla.ops.kda import chunk_kda
    from dasc_compile.eval.kda_ops import kda_chunked
    out["fla_version"] = getattr(fla, "__version__", "?")
    torch.manual_seed(0)
    B, T, H, K, V = 2, 512, 4, 64, 64
    dev = "cuda"
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev), dim=-1)
    v = torch.randn(B, T, H, V, device=dev)
    g = -torch.rand(B, T, H, K, device=dev) * 0.5
    beta = torch.rand(B, T, H, device=dev)
    xs = [t.to(torch.bfloat16).requires_grad_(True) for t in (q, k, v)]
    gg, bb = g.clone().requires_grad_(True), beta.to(torch.bfloat16).requires_grad_(True)
    o, s = chunk_kda(xs[0], xs[1], xs[2], gg, bb, output_final_state=True)
    torch.cuda.synchronize(); out["fwd_first_s"] = time.time() - t0
    ref, sref = kda_chunked(q, k, v, g, beta)
    out["fwd_max_abs_diff_vs_dasc"] = float((o.float() - ref).abs().max())
    out["state_max_abs_diff_vs_dasc"] = float((s.float() - sref).abs().max())
    t1 = time.time()
    o.float().sum().backward()
    torch.cuda.synchronize(); out["bwd_first_s"] = time.time() - t1
    out["ok"] = True
except Exception as exc:  # the probe reports, it does not fail the call
    out["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
print("FLA_PROBE " + json.dumps(out))
"""


def fla_probe(timeout: float, fla_path: str) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{fla_path}:{os.environ.get('PYTHONPATH', '')}")
    try:
        r = subprocess.run([sys.executable, "-c", FLA_PROBE], env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"no result within {timeout:.0f} s (Triton compile/autotune still running)"}
    for line in r.stdout.splitlines():
        if line.startswith("FLA_PROBE "):
            return json.loads(line[len("FLA_PROBE "):])
    return {"ok": False, "error": (r.stderr or r.stdout)[-400:]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--deadline", type=float, default=560)
    ap.add_argument("--train-seconds", type=float, nargs=2, default=(170, 150), metavar=("GDN", "KDA"))
    ap.add_argument("--eval-seconds", type=float, default=55)
    ap.add_argument("--wmax", type=int, nargs="+", default=[4, 16, 64, 128])
    ap.add_argument("--eval-prompts", type=int, default=24)
    ap.add_argument("--retrieval", type=int, default=20)
    ap.add_argument("--horizon-prefixes", type=int, default=32)
    ap.add_argument("--fla", default="/tmp/fla")
    ap.add_argument("--smoke", action="store_true", help="tiny models, short runs: a CPU check of this script")
    a = ap.parse_args(argv)

    import torch

    from benchmarks.train_hybrid import train
    from dasc_compile.compiler import compile_plan
    from dasc_compile.eval.command import run_eval, run_horizons, write_json
    from dasc_compile.eval.plotting import plot_quality
    from dasc_compile.policy import Policy

    dev = "cuda" if torch.cuda.is_available() and not a.smoke else "cpu"
    work = Path("/tmp/dasc_train") if not a.smoke else a.out / "_work"
    res = work / "results"
    res.mkdir(parents=True, exist_ok=True)
    log(f"torch {torch.__version__}, device {dev} {torch.cuda.get_device_name() if dev == 'cuda' else ''}")
    import transformers

    log(f"transformers {transformers.__version__} from {transformers.__file__}")
    prompts = work / "eval_prompts.jsonl"
    lines = (a.data / "eval_prompts.jsonl").read_text().splitlines()
    prompts.write_text("\n".join(lines[: max(a.eval_prompts, a.horizon_prefixes)]) + "\n")
    kw = dict(batch=2, seq=128, smoke=True) if a.smoke else dict(batch=32, seq=1024)
    steps = 40 if a.smoke else 5000
    summary = {"device": dev, "stages": {}}
    for fam, secs in zip(("gdn", "kda"), a.train_seconds):
        d = work / fam
        try:
            rec = train(fam, a.data, d, steps=steps, max_seconds=min(secs, max(30.0, left(a.deadline) - 200)),
                        lr=3e-3, seed=0, device=dev, log=log, **kw)
            summary["stages"][f"train_{fam}"] = {k: v for k, v in rec.items() if k != "losses"}
            log(f"[{fam}] trained: {rec['params']} params, {rec['steps']} steps, {rec['tokens_per_s']:.0f} tok/s, "
                f"loss {rec['final_loss']:.3f}, decays moved {json.dumps(rec['decay_movement'])}")
        except Exception as exc:
            log(f"[{fam}] training FAILED: {type(exc).__name__}: {exc}")
            summary["stages"][f"train_{fam}"] = {"error": f"{type(exc).__name__}: {exc}"}
    plen, slen = (96, 16) if a.smoke else (512, 64)
    for fam in ("gdn", "kda"):
        d = work / fam
        if not (d / "model.safetensors").exists():
            continue
        plans = []
        for w in a.wmax:
            plan, path = compile_plan(d, Policy(w_max=w), work / f"{fam}-w{w}.dasc", with_kernels=False)
            plans.append(path)
            log(f"[{fam}] w_max {w}: kept {plan.totals.n_kept}/{plan.totals.n_units}, C_ckpt {plan.totals.c_ckpt:.2f}x, "
                f"W_replay cap {plan.refresh.w_replay_cap}")
        budget = min(a.eval_seconds, max(5.0, left(a.deadline) - 90))
        try:
            doc = run_eval(d, plans, prompts_file=prompts if not a.smoke else None, retrieval=a.retrieval,
                           prefix_len=plen, suffix_len=slen, gen_tokens=16, device=dev, progress=False,
                           time_budget_s=budget)
            write_json(doc, res / f"eval-{fam}.json")
            plot_quality(doc, res / f"eval-{fam}.png")
            log(f"[{fam}] eval: {doc['protocol']['n_prompts']} prompts in {doc['protocol']['wall_s']:.0f} s")
            for entry in doc["plans"]:
                ar = entry["arms"]
                log(f"[{fam}]   w{entry['plan']['w_max']}: " + "; ".join(
                    f"{k} nll+{(v['nll_delta'] if k != 'random' else v['nll_delta']['mean']) or 0:.4f} "
                    f"acc {(v['retrieval_acc'] if k != 'random' else v['retrieval_acc']['mean']) or 0:.3f}"
                    for k, v in ar.items()))
        except Exception as exc:
            log(f"[{fam}] eval FAILED: {type(exc).__name__}: {exc}")
        try:
            hdoc = run_horizons(d, prompts_file=prompts if not a.smoke else None, retrieval=0 if not a.smoke else 3,
                                prefix_len=1024 if not a.smoke else 96, device=dev, progress=False)
            write_json(hdoc, res / f"horizons-{fam}.json")
            log(f"[{fam}] Table 1(b): {json.dumps({k: hdoc['table_1b'][k] for k in ('hs_he', 'hs_ms')})}")
        except Exception as exc:
            log(f"[{fam}] horizons FAILED: {type(exc).__name__}: {exc}")
    if dev == "cuda" and left(a.deadline) > 40:
        summary["fla_probe"] = fla_probe(min(90.0, left(a.deadline) - 15), a.fla)
        log(f"fla probe: {json.dumps(summary['fla_probe'])}")
    write_json(summary, res / "summary.json")
    with tarfile.open(a.out / "results.tar", "w") as tf:
        tf.add(res, arcname="results")
    for fam in ("gdn", "kda"):
        if (work / fam).exists():
            with tarfile.open(a.out / f"{fam}.tar", "w") as tf:
                tf.add(work / fam, arcname=fam)
    log("done")


if __name__ == "__main__":
    main()
