"""How far training moved the decays: parameter movement, and the overlap of dasc's kept unit sets with init.

The kept sets come from dasc's own compiler (``dasc_compile.compiler.compile_plan``, default policy
at each ``w_max``), run on the trained checkpoint and on a copy of it whose decay tensors are the
initial ones, so only the decays differ. Jaccard = |kept_trained & kept_init| / |union| over
(layer, unit) pairs (1.0 when both are empty); issue 20's target is at most 0.8 at ``w_max`` 64.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch

W_MAX = (16, 64, 128, 256)


def movement(init: dict[str, torch.Tensor], now: dict[str, torch.Tensor]) -> dict:
    """Mean / max |change| of ``A_log`` and ``dt_bias`` over all their entries (by parameter-name suffix)."""
    out = {}
    for suffix in ("A_log", "dt_bias"):
        keys = [k for k in init if k.endswith(suffix)]
        if not keys:
            continue
        d = torch.cat([(now[k].float() - init[k].float()).abs().flatten() for k in keys])
        vals = torch.cat([now[k].float().flatten() for k in keys])
        out[suffix] = {"mean_abs_change": float(d.mean()), "max_abs_change": float(d.max()),
                       "min": float(vals.min()), "max": float(vals.max()), "n": int(d.numel())}
    return out


def _kept(model_dir: Path, w_max: int, work: Path) -> tuple[set, int]:
    from dasc_compile.compiler import compile_plan
    from dasc_compile.policy import Policy

    plan, _ = compile_plan(model_dir, Policy(w_max=w_max), work / f"plan-{w_max}", with_kernels=False)
    kept = {(layer.layer_id, u) for layer in plan.layers for u in layer.kept_units}
    return kept, plan.totals.n_units


def kept_overlap(ckpt: Path, init_decays: dict[str, torch.Tensor], w_max=W_MAX) -> dict:
    """Per ``w_max``: kept counts of the trained and the initial decays and their Jaccard overlap.

    Args:
        ckpt: a checkpoint directory (benchmarks/train/models.py format).
        init_decays: the initial decay tensors by their names in the checkpoint files, fp32.
    """
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        init_dir = tmp / "init"
        init_dir.mkdir()
        shutil.copy2(Path(ckpt) / "config.json", init_dir / "config.json")
        save_file({k: v.contiguous() for k, v in init_decays.items()}, str(init_dir / "model.safetensors"))
        out = {}
        for w in w_max:
            a, n = _kept(Path(ckpt), w, tmp / "trained")
            b, _ = _kept(init_dir, w, tmp / "initial")
            union = a | b
            out[str(w)] = {"kept_trained": len(a), "kept_init": len(b), "units": n,
                           "jaccard": (len(a & b) / len(union)) if union else 1.0}
        return out


def main(argv=None) -> None:
    """``python -m benchmarks.train.decays CKPT``: movement and kept-set overlap of a checkpoint vs its init."""
    from benchmarks.cli_args import OneLineParser

    from safetensors.torch import load_file

    from benchmarks.train.models import checkpoint_decays

    ap = OneLineParser(description=main.__doc__)
    ap.add_argument("ckpt", type=Path)
    a = ap.parse_args(argv)
    path = a.ckpt / "train_state" / "init_decays.safetensors"
    if not path.is_file():      # a bundled reference or an init_model folder keeps no training state
        ap.error(f"{path}: missing; expected a training checkpoint (benchmarks.train.train --out). For a bundled "
                 f"reference, dasc eval MODEL --plan P --arms nr,init --init-from DIR (DIR from python -m "
                 f"benchmarks.train.init_model MODEL --out DIR) prints the kept-set Jaccard with init")
    init = load_file(str(path))
    print(json.dumps({"movement": movement(init, checkpoint_decays(a.ckpt)), "kept": kept_overlap(a.ckpt, init)},
                     indent=1))


if __name__ == "__main__":
    main()
