"""AdamW groups, the learning-rate schedule, and the optimiser state that travels between device calls.

Groups: ``decay`` (``A_log``, ``dt_bias``: no weight decay, ``decay_lr_mult`` x the learning rate),
``matrix`` (tensors of two or more dims: weight decay), ``vector`` (norms and other 1-d tensors: no
weight decay). With ``attn_lr_mult`` other than 1 (opt-in; 1 keeps exactly the three groups above) the
softmax-attention layers' parameters (benchmarks/train/attention.py) move to ``attn_matrix`` (weight decay)
and ``attn_vector`` (none), at ``attn_lr_mult`` x the learning rate: the same weight-decay rule, their own rate.

Optimiser state is stored per parameter name, not per group: a resume whose grouping differs (another
``attn_lr_mult``) restores every tensor's moments into whatever group the parameter is now in; only the
learning rate applied from then on changes. Matrices' moments travel factored whichever matrix group they are in.

Schedule (warmup-stable-decay, so that training can stop after any call and continue in the next):
linear warm-up over ``warmup`` steps, constant, then linear decay to ``final_frac`` over the last
``cooldown`` of the planned ``total_steps``; after that, ``final_frac``.

Travelling state (``compact_state``): a call cannot return the full Adam moments (8 bytes per
parameter). It keeps, per tensor: for the decay and vector groups both moments in full (they are
small); for matrices only the row and column means of the second moment (Adafactor's factorisation),
and no first moment. On resume the second moment is rebuilt as ``outer(row, col) / mean(row)`` and
the first moment restarts at zero with the step count kept, so Adam's bias correction turns the
restart into a ~10-step momentum warm-up instead of a full-size first step. The full state
(``full_state``) exists for exact resumes where it fits (the tests).
"""

from __future__ import annotations

import math

import torch

from benchmarks.train.models import is_decay

FACTORED = ("matrix", "attn_matrix")      # groups whose second moment travels as row / column means


def param_groups(model, lr: float, weight_decay: float, decay_lr_mult: float,
                 attn_lr_mult: float = 1.0) -> list[dict]:
    """AdamW groups (module docstring): three, or five with ``attn_lr_mult`` != 1; each carries ``name``,
    ``lr_mult`` and the names of its params (empty groups are left out)."""
    groups = {"decay": [], "matrix": [], "vector": [], "attn_matrix": [], "attn_vector": []}
    attn = set()
    if attn_lr_mult != 1.0:
        from benchmarks.train.attention import attention_param_names

        attn = attention_param_names(model)
        if not attn:
            raise ValueError("attn_lr_mult: this model has no softmax-attention layers "
                             "(benchmarks/train/attention.py ATTENTION_CLASSES)")
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        kind = "decay" if is_decay(n) else "matrix" if p.dim() >= 2 else "vector"
        groups[f"attn_{kind}" if n in attn and kind != "decay" else kind].append((n, p))
    spec = {"decay": (0.0, decay_lr_mult), "matrix": (weight_decay, 1.0), "vector": (0.0, 1.0),
            "attn_matrix": (weight_decay, attn_lr_mult), "attn_vector": (0.0, attn_lr_mult)}
    return [{"name": g, "params": [p for _, p in items], "param_names": [n for n, _ in items],
             "weight_decay": spec[g][0], "lr_mult": spec[g][1], "lr": lr * spec[g][1]}
            for g, items in groups.items() if items]


def lr_at(step: int, lr: float, warmup: int, total_steps: int, cooldown: float, final_frac: float) -> float:
    """Learning rate of ``step`` (0-based) under the warmup-stable-decay schedule."""
    if step < warmup:
        return lr * (step + 1) / warmup
    start = int(total_steps * (1.0 - cooldown))
    if step < start:
        return lr
    frac = min(1.0, (step - start) / max(1, total_steps - start))
    return lr * (1.0 - (1.0 - final_frac) * frac)


def set_lr(opt, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr * g["lr_mult"]


def _named(opt, with_group: bool = False):
    for g in opt.param_groups:
        for n, p in zip(g["param_names"], g["params"]):
            yield (g["name"], n, p, g) if with_group else (g["name"], n, p)


def compact_state(opt) -> dict[str, torch.Tensor]:
    """The travelling optimiser state (module docstring) as fp32 CPU tensors keyed ``<kind>:<param name>``."""
    out = {}
    for group, n, p in _named(opt):
        st = opt.state.get(p)
        if not st:
            continue
        out[f"step:{n}"] = torch.as_tensor(float(st["step"]))
        v, m = st["exp_avg_sq"].float().cpu(), st["exp_avg"].float().cpu()
        if group in FACTORED:
            v2 = v.reshape(v.shape[0], -1)
            out[f"v_row:{n}"], out[f"v_col:{n}"] = v2.mean(dim=1), v2.mean(dim=0)
        else:
            out[f"v:{n}"], out[f"m:{n}"] = v.clone(), m.clone()
    return out


def full_state(opt) -> dict[str, torch.Tensor]:
    """Both Adam moments and the step of every tensor (exact resume)."""
    out = {}
    for _, n, p in _named(opt):
        st = opt.state.get(p)
        if st:
            out[f"step:{n}"] = torch.as_tensor(float(st["step"]))
            out[f"v:{n}"], out[f"m:{n}"] = st["exp_avg_sq"].float().cpu().clone(), st["exp_avg"].float().cpu().clone()
    return out


def load_state(opt, state: dict[str, torch.Tensor]) -> dict:
    """Restore ``compact_state`` or ``full_state`` output into a fresh AdamW; returns counts of what was restored."""
    counts = {"full": 0, "factored": 0, "missing": 0}
    for _, n, p, g in _named(opt, with_group=True):
        if f"step:{n}" not in state:
            counts["missing"] += 1
            continue
        st = opt.state[p]
        on_device = g.get("fused") or g.get("capturable")       # where AdamW itself keeps the step count
        st["step"] = torch.tensor(float(state[f"step:{n}"]), dtype=torch.float32,
                                  device=p.device if on_device else "cpu")
        if f"v:{n}" in state:
            st["exp_avg_sq"] = state[f"v:{n}"].to(p.device, torch.float32).reshape(p.shape).clone()
            st["exp_avg"] = state[f"m:{n}"].to(p.device, torch.float32).reshape(p.shape).clone()
            counts["full"] += 1
        else:
            row, col = state[f"v_row:{n}"].float(), state[f"v_col:{n}"].float()
            v = torch.outer(row, col) / row.mean().clamp_min(1e-30)
            st["exp_avg_sq"] = v.reshape(p.shape).to(p.device).contiguous()
            st["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
            counts["factored"] += 1
    return counts


def describe(opt) -> dict:
    """``{group name: {"lr_mult", "weight_decay", "params"}}`` of an optimiser built from :func:`param_groups`
    (what a session records)."""
    return {g["name"]: {"lr_mult": g["lr_mult"], "weight_decay": g["weight_decay"], "params": len(g["params"])}
            for g in opt.param_groups}


def total_steps_for(tokens: float, tokens_per_step: int) -> int:
    return max(1, math.ceil(tokens / tokens_per_step))
