"""Decay-only checkpoint of the tiny Nemotron-H of ``mamba2_smoke.sh`` (SGLang serves it with dummy weights).

``python -m benchmarks.h200.mamba2_smoke_model CONFIG OUT [--other-decay]`` writes ``OUT/config.json`` and
``OUT/model.safetensors`` holding only ``backbone.layers.{i}.mixer.{A_log,dt_bias}`` ``[H]`` FP32 of every
Mamba2 layer, SYNTHETIC values (not trained): head h of layer l has ``exp(A_log) = A[(h + l) % 8]`` with
A = (0.02, 0.05, 0.1, 0.3, 1, 3, 8, 15) and ``dt_bias = 1``, so at a_s = 0 the retention horizons are
ln(1e3) / (A softplus(1)) = 263, 105, 53, 18, 5.3, 1.8, 0.7, 0.4 tokens and W_max = 16 keeps 4 of every 8
heads. ``--other-decay`` shifts the table by one head (a plan from it must be refused by the real check).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
from benchmarks.cli_args import OneLineParser

A_TABLE = (0.02, 0.05, 0.1, 0.3, 1.0, 3.0, 8.0, 15.0)


def write(config_path: str, out: str, shift: int = 0) -> Path:
    from safetensors.torch import save_file

    from dasc_compile.arch import arch_from_config

    cfg = json.loads(Path(config_path).read_text())
    spec = arch_from_config(cfg, config_path)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    tensors = {}
    for layer, a_name, d_name in zip(spec.recurrent_layer_ids, spec.a_log_names, spec.dt_bias_names):
        a = [A_TABLE[(h + layer + shift) % len(A_TABLE)] for h in range(spec.num_value_heads)]
        tensors[a_name] = torch.log(torch.tensor(a, dtype=torch.float64)).to(torch.float32)
        tensors[d_name] = torch.ones(spec.num_value_heads, dtype=torch.float32)
    save_file(tensors, str(out_dir / "model.safetensors"),
              metadata={"format": "pt", "dasc_provenance": "synthetic smoke-test decay values, not trained"})
    horizons = [round(math.log(1e3) / (a * math.log1p(math.e)), 1) for a in A_TABLE]
    print(f"decay-only checkpoint {out_dir}: {len(spec.recurrent_layer_ids)} Mamba2 layers x "
          f"{spec.num_value_heads} heads, horizons {horizons} tokens (shift {shift})")
    return out_dir


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("out")
    ap.add_argument("--other-decay", action="store_true")
    a = ap.parse_args(argv)
    write(a.config, a.out, shift=1 if a.other_decay else 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
