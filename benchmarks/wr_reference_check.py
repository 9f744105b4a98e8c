"""Check a device run of dasc-wr against a PyTorch replay on a CPU (issue 15, check (b) and the `dasc eval` agreement).

``benchmarks/h200/wr_smoke.sh`` serves the tiny Qwen3-Next smoke model (seeded random weights drawn
on a CPU generator, synthetic decays; ``benchmarks/h200/smoke_model.py``) from SGLang 0.5.17 and
writes, per wr server that omits units, the first refresh passes' active states after
``refresh_copy`` (``DASC_WR_DUMP``, :func:`dasc_runtime.wr_refresh.dump_pass`), plus every
server's top-20 next-token logprobs after a compressed hit (``client.json``, request ``agree``).
This script rebuilds the same checkpoint and plans on the CPU (each dump's global-unit mask must equal
the CPU plan's; the plans' content hashes are recorded but may differ across machines), loads the model with transformers through `dasc eval`'s loader
(float32) and, with `dasc eval`'s own arms (:mod:`dasc_compile.eval.arms`), computes:

* **state** (per dumped pass, per hit): the refreshed state of SGLang (``after``, ``[L, H, d_v, d_k]``
  fp32, transposed to transformers' ``[H, d_k, d_v]``) against `dasc eval`'s ``wr`` arm at the same
  prefix and window (scratch replay of the last W tokens from a zero recurrent state, attention on
  the exact cached KV before the window, Eq. 7):
  ``local_rel`` = ||after - ref||_F / ||ref||_F over the local (omitted, refreshed) units, and
  ``global_rel`` over the global units, whose reference is the full-prefix (dense) state: they are
  the restored checkpoint, never refreshed, so ``global_rel`` is the distance between SGLang's bf16
  prefill and transformers' fp32 one, the noise floor of any comparison of the two implementations.
  ``local_vs_dense_rel`` (the refreshed units against the full-history state) shows how far the
  refresh is from dense, i.e. that ``local_rel`` is not small by accident. Bit-identity of the
  global units to the restored checkpoint is checked on the device (``before_kept_equal``).
* **logits** (per server): SGLang's top-20 logprobs of the token after ``AGREE`` (a hit at 1088)
  against the log-softmax of `dasc eval`'s dense / nr / wr arm at that position, on SGLang's 20 ids:
  ``max_abs`` and ``mean_abs`` difference (nats) and whether the top-1 ids agree.

Verdict (the stated tolerance), per recurrent layer l: ``local_rel(l) <= max(1.5 * global_rel(l), 0.02)``:
the refreshed units are no farther from the PyTorch replay than the untouched global units are from
the full-prefix state at the same layer (both implementations' differences grow with depth: bf16
against fp32, and with random weights near-tied MoE routing flips), or within 2 % outright. The
comparison counts only when the first recurrent layer, whose inputs are the same token embeddings in
both, has ``global_rel <= 0.05`` (else the two do not even agree there: another checkpoint), and the
device found the global units bit-identical to the restored checkpoint. A server's logits agree with an arm when ``mean_abs`` for that
arm is at most ``max(1.25 * dense server's mean_abs against eval dense, 0.01)`` nats; a floor above 0.5 nats
(another model) or a first-layer state floor above 5 % is refused as an error, as are missing dumps.

Usage (CPU, ~30 s on 2 cores)::

    .venv/bin/python -m benchmarks.wr_reference_check benchmarks/results/2026-12-01-h200-wr-checks-run2 --dumps DIR
"""

from __future__ import annotations

import json
import sys
import tarfile
import tempfile
from pathlib import Path

import torch

from dasc_compile.errors import DascInputError
from benchmarks.cli_args import OneLineParser, path_named

REPO = Path(__file__).resolve().parent.parent
TINY_CONFIG = REPO / "benchmarks/h200/sglang/qwen3next-tiny.config.json"
#: server label -> (load policy, w_max) as in benchmarks/h200/wr_smoke.sh
#: a comparison means something only when the two implementations agree on what no refresh touches
FLOOR_MAX = 0.05            # relative error of the global units (restored checkpoint vs full-prefix state)
LOGIT_FLOOR_MAX = 0.5       # nats: Dense server vs eval dense, mean abs over SGLang's top-20 (another model: ~5)
SERVERS = {"dense": None, "nr-w64": ("nr", 64), "wr-keep": ("wr", 0), "wr-w16": ("wr", 16),
           "wr-w64": ("wr", 64), "wr-w128": ("wr", 128)}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b||_F / ||b||_F (0 when both are empty)."""
    if b.numel() == 0:
        return 0.0
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def sglang_to_hf(after: torch.Tensor) -> torch.Tensor:
    """SGLang's GDN ``temporal`` ``[L, H, d_v, d_k]`` -> transformers' ``recurrent_states`` layout ``[L, H, d_k, d_v]``."""
    return after.transpose(-1, -2)


def build(work: Path):
    """The smoke checkpoint and its five plans, compiled on the CPU; returns (eval model, plans by label, hashes)."""
    from benchmarks.h200 import smoke_model as sm
    from dasc_compile.compiler import compile_plan
    from dasc_compile.eval.models import load_eval_model
    from dasc_compile.policy import Policy

    ckpt = sm.write_checkpoint(str(TINY_CONFIG), str(work / "tiny"))
    plans, hashes = {}, {}
    for label, spec in SERVERS.items():
        if spec is None:
            continue
        pol, w = spec
        plan, _ = compile_plan(ckpt, Policy(w_max=w, load_policy=pol), work / f"plan-{label}", with_kernels=True)
        plans[label], hashes[(pol, w)] = plan, plan.content_hash
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["dasc_tokenizer"] = "bytes"               # ids are given directly; after compiling (hash unchanged)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    return load_eval_model(ckpt), plans, hashes


def device_hashes(plans_txt: Path) -> dict:
    """``(policy, w_max) -> content_hash`` from the device's ``plans.txt``."""
    out = {}
    for line in plans_txt.read_text().splitlines():
        parts = line.split()
        pol, w = parts[2], int(parts[3].split("=")[1])
        out[(pol, w)] = parts[parts.index("content_hash") + 1]
    return out


def grids_of(em, plan):
    from dasc_compile.eval.arms import keep_grids, plan_kept_units

    return keep_grids(plan_kept_units(plan), em.num_heads, em.units_per_head)


class Prefixes:
    """Dense prefix caches by token ids (each prefix is run once)."""

    def __init__(self, em):
        self.em, self.memo = em, {}

    def get(self, ids: list[int]):
        key = tuple(ids)
        if key not in self.memo:
            cache = self.em.new_cache()
            self.em.forward(ids, cache)
            self.memo[key] = cache
        return self.memo[key]


def state_rows(em, plan, prefixes: Prefixes, dump: dict) -> list[dict]:
    """Per hit of one dumped pass: ``local_rel``, ``global_rel``, ``local_vs_dense_rel`` (module docstring)."""
    from dasc_compile.eval.arms import arm_cache
    from dasc_compile.eval.hf_compat import recurrent_state

    grids = grids_of(em, plan)
    want = torch.stack([g.view(g.shape[0], 1, 1).expand(-1, *dump["kept_mask"].shape[-2:]) for g in grids]) \
        if em.units_per_head == 1 else None
    if want is not None and not torch.equal(want, dump["kept_mask"]):
        raise DascInputError("dump: the device plan's global units differ from the CPU plan's "
                             f"({int(dump['kept_mask'].sum())} vs {int(want.sum())} state elements kept)")
    rows = []
    for i, (ids, w, n_p) in enumerate(zip(dump["ids"], dump["windows"], dump["n_p"])):
        if len(ids) != n_p:
            raise DascInputError(f"dump: hit {i} has {len(ids)} prefix ids, expected n_p = {n_p}")
        dense = prefixes.get(ids)
        ref = arm_cache(em, dense, ids, "wr", grids, window=w)
        after = sglang_to_hf(dump["after"][:, i].float())                      # [L, H, d_k, d_v]
        kept = sglang_to_hf(dump["kept_mask"])
        # batch row 0 of each layer's temporal state, read through the one transformers adapter (a tensor in
        # 5.12, a dict of them by 5.24: indexing the attribute itself took the whole batch there)
        ref_s = torch.stack([recurrent_state(ref.layers[lid])[0].float() for lid in em.layer_ids])
        den_s = torch.stack([recurrent_state(dense.layers[lid])[0].float() for lid in em.layer_ids])
        loc, glob = ~kept, kept
        r = {"n_p": n_p, "window": w, "rid": dump["rids"][i] if dump["rids"] else None,
             "local_rel": rel(after[loc], ref_s[loc]), "global_rel": rel(after[glob], den_s[glob]),
             "local_vs_dense_rel": rel(after[loc], den_s[loc]), "ref_wr_vs_dense_local_rel": rel(ref_s[loc], den_s[loc]),
             "global_bit_identical_on_device": bool(dump["before_kept_equal"][i]),
             "per_layer": [{"layer": lid, "local_rel": rel(after[j][loc[j]], ref_s[j][loc[j]]),
                            "global_rel": rel(after[j][glob[j]], den_s[j][glob[j]]),
                            "local_vs_dense_rel": rel(after[j][loc[j]], den_s[j][loc[j]]),
                            "ref_wr_vs_dense_local_rel": rel(ref_s[j][loc[j]], den_s[j][loc[j]])}
                           for j, lid in enumerate(em.layer_ids)]}
        first = r["per_layer"][0]             # the first recurrent layer: both implementations see the same inputs
        r["floor_ok"] = first["global_rel"] <= FLOOR_MAX
        r["layers_agree"] = all(p["local_rel"] <= max(1.5 * p["global_rel"], 0.02) for p in r["per_layer"])
        r["agrees"] = r["floor_ok"] and r["layers_agree"] and r["global_bit_identical_on_device"]
        rows.append(r)
    return rows


def arm_logprobs(em, plan, prefixes: Prefixes, prompt: list[int], n_p: int, arm: str) -> torch.Tensor:
    """Log-softmax ``[vocab]`` (float32) after ``prompt`` with ``arm`` applied to the checkpoint at ``n_p``."""
    from dasc_compile.eval.arms import arm_cache, replay_window

    pre = prompt[:n_p]
    dense = prefixes.get(pre)
    grids = grids_of(em, plan) if plan is not None else None
    w = replay_window(plan, n_p) if arm == "wr" else 0
    cache = arm_cache(em, dense, pre, arm, grids, window=w)
    return torch.log_softmax(em.forward(prompt[n_p:], cache)[-1], dim=-1)


def logit_row(top: list, ref: torch.Tensor) -> dict:
    lp = torch.tensor([t[0] for t in top])
    ids = torch.tensor([t[1] for t in top])
    d = (lp - ref[ids]).abs()
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean()), "top1_equal": int(ids[0]) == int(ref.argmax())}


def run(results: Path, work: Path, dumps: Path | None = None) -> dict:
    client = {r["label"]: r for r in json.loads((results / "client.json").read_text())}
    if not any((dumps or results).glob("dumps-wr-w*.tar.gz")):
        raise DascInputError(f"{dumps or results}: no dumps-wr-w*.tar.gz (the state check needs the call's dumps; "
                             f"pass their folder with --dumps)")
    em, plans, hashes = build(work)
    dev = device_hashes(results / "plans.txt")
    prefixes = Prefixes(em)
    from benchmarks.h200.wr_smoke_client import AGREE

    # content hashes may differ across machines (horizon floats from another torch build); what the
    # comparison needs is the same global units: each dump's mask is checked against the CPU plan
    doc = {"states": {}, "logits": {}, "plans_cpu": {f"{p}-w{w}": h for (p, w), h in hashes.items()},
           "plans_device": {f"{p}-w{w}": h for (p, w), h in dev.items()}}
    for label in ("wr-w16", "wr-w64", "wr-w128"):
        tar = (dumps or results) / f"dumps-{label}.tar.gz"
        if not tar.is_file():
            continue
        with tarfile.open(tar) as tf:
            tf.extractall(work / "dumps", filter="data")
        rows = []
        for f in sorted((work / "dumps" / label).glob("pass-*.pt")):
            rows += state_rows(em, plans[label], prefixes, torch.load(f))
        doc["states"][label] = rows
    if not doc["states"]:
        raise DascInputError(f"{dumps or results}: no dumps-wr-w*.tar.gz with pass-*.pt (the state check needs the "
                             f"call's dumps; pass their folder with --dumps)")
    bad = [f"{label} n_p={r['n_p']}: {r['per_layer'][0]['global_rel']:.3f}" for label, rows in doc["states"].items()
           for r in rows if not r["floor_ok"]]
    if bad:
        raise DascInputError(f"{results}: the device and the CPU disagree on untouched units of the first layer "
                             f"({', '.join(bad[:3])} > {FLOOR_MAX}): not the weights rebuilt here (runs before commit "
                             f"7a5d30c drew them on the GPU's generator), so nothing can be compared")
    for label, r in client.items():
        if "error" in r or not r.get("agree", {}).get("top"):
            continue
        n_p = int(r["agree"]["cached"])
        arms = {"dense": None}
        if SERVERS.get(label):
            arms.update(nr=plans[label], wr=plans[label])
        doc["logits"][label] = {arm: logit_row(r["agree"]["top"], arm_logprobs(em, p, prefixes, AGREE, n_p, arm))
                                for arm, p in arms.items()}
    floor = doc["logits"].get("dense", {}).get("dense", {}).get("mean_abs")
    if floor is not None and floor > LOGIT_FLOOR_MAX:
        raise DascInputError(f"{results}: the Dense server's logprobs are {floor:.3f} nats from dasc eval's dense arm "
                             f"(> {LOGIT_FLOOR_MAX}): not the model rebuilt here, so no logits can be compared")
    if floor is not None:
        tol = max(1.25 * floor, 0.01) if floor <= LOGIT_FLOOR_MAX else 0.0      # 0: nothing can agree
        doc["logit_floor_ok"] = floor <= LOGIT_FLOOR_MAX
        doc["logit_tolerance_nats"] = tol
        for label, arms in doc["logits"].items():
            for row in arms.values():
                row["within_tolerance"] = row["mean_abs"] <= tol
            if "wr" in arms and "nr" in arms:     # closer to its own arm than to dasc-nr's
                arms["wr"]["closer_than_nr"] = arms["wr"]["mean_abs"] < arms["nr"]["mean_abs"]
    return doc


def render(doc: dict) -> str:
    lines = ["state after refresh vs dasc eval's wr arm (PyTorch replay of the window from zero):",
             "| server | n_p | W | local rel. err. | global rel. err. (noise floor) | local vs dense | eval wr vs dense (local) | "
             "global bit-identical (device) | agrees |", "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for label, rows in doc["states"].items():
        for r in rows:
            lines.append(f"| {label} | {r['n_p']} | {r['window']} | {r['local_rel']:.2e} | {r['global_rel']:.2e} | "
                         f"{r['local_vs_dense_rel']:.3f} | {r['ref_wr_vs_dense_local_rel']:.3f} | "
                         f"{r['global_bit_identical_on_device']} | {r['agrees']} |")
    lines += ["", "per recurrent layer (first pass at n_p = 1088 of each server): local rel. err. / global rel. err. "
              "(noise floor) / eval wr vs dense (local)", "| server | " + " | ".join(
                  f"layer {p['layer']}" for p in next(iter(doc["states"].values()))[0]["per_layer"]) + " |"
              if doc["states"] else "", "|---|" + "---|" * 6 if doc["states"] else ""]
    for label, rows in doc["states"].items():
        row = next((r for r in rows if r["n_p"] == 1088), rows[0])
        lines.append(f"| {label} | " + " | ".join(f"{p['local_rel']:.3f} / {p['global_rel']:.3f} / "
                                                 f"{p['ref_wr_vs_dense_local_rel']:.3f}" for p in row["per_layer"]) + " |")
    lines += ["", f"next-token logprobs after the hit at 1088 vs dasc eval (top-20 of SGLang; tolerance "
              f"{doc.get('logit_tolerance_nats', float('nan')):.4f} nats mean):",
              "| server | eval arm | mean abs (nats) | max abs | top-1 equal | within tolerance | wr closer than nr |",
              "|---|---|---:|---:|---|---|---|"]
    for label, arms in doc["logits"].items():
        for arm, r in arms.items():
            lines.append(f"| {label} | {arm} | {r['mean_abs']:.4f} | {r['max_abs']:.4f} | {r['top1_equal']} | "
                         f"{r.get('within_tolerance')} | {r.get('closer_than_nr', '')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    """CLI (module docstring): prints the tables, writes RESULTS/reference_check.json; 0, or 2 on bad input."""
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="a wr_smoke.sh results folder (client.json, plans.txt, dumps-*.tar.gz)")
    ap.add_argument("--dumps", type=Path, default=None,
                    help="folder of the dumps-wr-w*.tar.gz (default RESULTS; ~10 MB each, kept out of git)")
    ap.add_argument("--out", type=path_named("an output path"), default=None, help="JSON (default RESULTS/reference_check.json)")
    a = ap.parse_args(argv)
    try:
        for f in ("client.json", "plans.txt"):
            if not (a.results / f).is_file():
                raise DascInputError(f"{a.results}: no {f} (expected a wr_smoke.sh results folder)")
        with tempfile.TemporaryDirectory() as t:
            if a.dumps is not None and not a.dumps.is_dir():
                raise DascInputError(f"--dumps {a.dumps}: not a folder")
            doc = run(a.results, Path(t), a.dumps)
    except DascInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(render(doc))
    out = a.out or a.results / "reference_check.json"
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
