"""The controls that tell whether a plan's quality comes from *trained* decays (issue 20):

* **init-horizon masks** (arm ``init``): per recurrent layer keep the ``r_l`` units with the longest
  static horizon H_s (Eq. 2, 3) computed from the *initial* decay tensors, where ``r_l`` is the trained
  plan's kept count in that layer (count-matched, as Random is); then dasc-nr on the trained model.
  If training left the decays where they started, these are the plan's own masks.
* **the untrained model** (arm ``untrained``): the initial checkpoint run under the same plans' masks
  (dense, dasc-nr and Random against its own dense): fast-decaying units forget the prefix whether or
  not a model learned anything, so a gap that survives here is not evidence about trained decays.
* **decay drift**: how far training moved the horizons: per layer the Spearman correlation of H_s with
  the initial H_s, and at each w_max the Jaccard overlap of the kept sets {u : H_s(u) > w_max}.

The initial state comes from a checkpoint directory (``--init-from DIR``: the decay tensors suffice
for ``init`` and the drift; ``untrained`` needs the whole checkpoint) or from a seed
(``--init-seed N``: transformers' own initialisation after ``torch.manual_seed(N)``,
:func:`dasc_compile.eval.models.build_from_config`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from dasc_compile.errors import DascInputError
from dasc_compile.eval.metrics import median_iqr, spearman


def init_decay_tensors(model: Path, spec, init_from: Path | None, init_seed: int | None, *,
                       model_tensors: list | None = None) -> tuple[list, str]:
    """The initial decay tensors in ``read_decay_tensors``' layout (``[(A_log name, A_log), (dt_bias
    name, dt_bias), ...]`` per recurrent layer, float32) and a line saying where they came from.
    ``model_tensors``: the model's own decay tensors when the caller has read them already (else, with
    ``init_from``, they are read here for the check that the init checkpoint is not the model itself).

    Raises:
        DascInputError: neither source given; an init checkpoint of another architecture (other
            recurrent layers, or decay tensors of other shapes), or one whose decays equal the model's; a seed
            whose rebuild contradicts the recorded initial decays (:func:`_check_against_recorded_init`).
    """
    if init_from is not None:
        from dasc_compile.arch import arch_from_config
        from dasc_compile.checkpoint import open_checkpoint, read_decay_tensors

        if not Path(init_from).exists():
            raise DascInputError(f"--init-from {init_from}: does not exist; expected the model's initial checkpoint "
                                 f"directory (config.json and weights, e.g. from python -m benchmarks.train.init_model)")
        if not Path(init_from).is_dir():
            raise DascInputError(f"--init-from {init_from}: not a directory; expected the model's initial checkpoint "
                                 f"directory (config.json and weights, e.g. from python -m benchmarks.train.init_model)")
        if not (Path(init_from) / "config.json").is_file():
            raise DascInputError(f"--init-from {init_from}: no config.json in it; expected the model's initial "
                                 f"checkpoint directory (config.json and weights, e.g. from "
                                 f"python -m benchmarks.train.init_model)")
        src = open_checkpoint(init_from)
        ispec = arch_from_config(src.config, str(src.config_path))
        if (ispec.recurrent_layer_ids, ispec.a_log_shape, ispec.dt_bias_shape) != \
                (spec.recurrent_layer_ids, spec.a_log_shape, spec.dt_bias_shape):
            raise DascInputError(f"--init-from {init_from}: not an initial checkpoint of this model (recurrent layers "
                                 f"{list(ispec.recurrent_layer_ids)}, decay shapes {ispec.a_log_shape} / "
                                 f"{ispec.dt_bias_shape}; the model's {list(spec.recurrent_layer_ids)}, "
                                 f"{spec.a_log_shape} / {spec.dt_bias_shape})")
        init_t = [(n, t.float()) for n, t in read_decay_tensors(src, ispec)]
        own = model_tensors if model_tensors is not None else read_decay_tensors(open_checkpoint(model), spec)
        if len(own) == len(init_t) and all(torch.equal(a.float(), b) for (_, a), (_, b) in zip(own, init_t)):
            raise DascInputError(f"--init-from {init_from}: its decay tensors equal the model's (the trained checkpoint "
                                 f"itself?), so the init control would repeat the plan; give the model's initial "
                                 f"checkpoint")
        return init_t, f"checkpoint {init_from}"
    if init_seed is not None:
        from dasc_compile.eval.models import _read_config, build_from_config, recurrent_mixers

        built = build_from_config(model, _read_config(model), init_seed)
        mixers, _, _ = recurrent_mixers(built)
        out = []
        for j, lid in enumerate(spec.recurrent_layer_ids):
            m = mixers[lid]
            gate = m.forget_gate if hasattr(m, "forget_gate") else m
            out += [(spec.a_log_names[j], gate.A_log.detach().float().reshape(spec.a_log_shape)),
                    (spec.dt_bias_names[j], gate.dt_bias.detach().float().reshape(spec.dt_bias_shape))]
        _check_against_recorded_init(model, out, init_seed)
        return out, f"transformers' initialisation, torch.manual_seed({init_seed})"
    raise DascInputError("--arms init / untrained need the initial state: give --init-from DIR or --init-seed N")


#: Largest difference between a rebuilt and a recorded initial decay value still taken as rounding.
RECORD_ATOL = 1e-4


def _check_against_recorded_init(model: Path, built: list, init_seed: int) -> None:
    """Refuse an ``--init-seed`` rebuild that contradicts the initial decays the model folder records.

    The references trained here (``plans/reference/*-hybrid-*``) keep their initial ``A_log`` / ``dt_bias`` in
    ``train_log.json`` (``init_decays``: ``{"live:<tensor name>": [values]}``), a checkpoint of
    ``benchmarks/train`` in ``train_state/init_decays.safetensors`` (the same names), and were not initialised by
    transformers' plain ``from_config`` (e.g. GDN's log-uniform ``dt``): a seed then rebuilds other decays, and
    the init / untrained controls would be wrong without a word (session 19 audit: ``dt_bias`` off by up to 7.1).
    Models without that file are not checked. Record and rebuild are matched by layer index and tensor kind
    (:func:`_decay_key`): the record names the live parameters (Kimi-Linear's ``...self_attn.forget_gate.A_log``),
    the rebuild the checkpoint's (``...self_attn.A_log``), and an exact-name match silently checked nothing there.

    Raises:
        DascInputError: a rebuilt tensor differs from the record by more than :data:`RECORD_ATOL`; the file is
            there but unreadable, or records initial decays none of which name this model's.
    """
    import json

    log = Path(model) / "train_log.json"
    st = Path(model) / "train_state" / "init_decays.safetensors"      # a checkpoint as benchmarks/train writes it
    if not log.is_file() and st.is_file():
        log = st
    if not log.is_file():
        return
    try:
        if log.suffix == ".safetensors":
            from safetensors.torch import load_file

            rec = {k: v.reshape(-1).tolist() for k, v in load_file(str(log)).items()}
        else:
            doc = json.loads(log.read_text())
            rec = doc.get("init_decays") if isinstance(doc, dict) else None
    except Exception as exc:        # any unreadable record (safetensors raises its own kinds)
        raise DascInputError(f"--init-seed {init_seed}: {log} is there but unreadable ({type(exc).__name__}), so the "
                             f"rebuild cannot be checked against the initial decays it records; repair it, or give "
                             f"--init-from DIR") from None
    if not isinstance(rec, dict):
        return
    recorded = {_decay_key(k): v for k, v in rec.items() if k.startswith("live:") and _decay_key(k) is not None}
    matched = 0
    for name, t in built:
        want = recorded.get(_decay_key(name))
        if want is None:
            continue
        matched += 1
        want = torch.tensor(want, dtype=torch.float32).reshape(-1)
        diff = (t.reshape(-1) - want).abs().max().item() if want.numel() == t.numel() else float("inf")
        if diff > RECORD_ATOL:
            raise DascInputError(f"--init-seed {init_seed}: transformers' initialisation differs from the initial decays "
                                 f"{log} records ({name} by up to {diff:.3g}); this model was initialised otherwise (another seed "
                                 f"or another draw): "
                                 f"build its initial checkpoint with python -m benchmarks.train.init_model {model} "
                                 f"--out DIR and give --init-from DIR")
    if recorded and not matched:
        raise DascInputError(f"--init-seed {init_seed}: {log} records initial decays, but for none of this model's "
                             f"decay tensors, so the rebuild cannot be checked; give --init-from DIR")


def _decay_key(name: str) -> tuple[int, str] | None:
    """(layer index, ``A_log`` or ``dt_bias``) of a decay tensor's name, live or as stored (``live:`` prefix,
    ``model.`` / ``backbone.`` roots and the mixer's sub-module do not matter); None for other names."""
    import re

    m = re.search(r"layers\.(\d+)\..*\b(A_log|dt_bias)$", name)
    return (int(m.group(1)), m.group(2)) if m else None


def count_matched_top(horizons: list[torch.Tensor], counts: list[int]) -> list[list[int]]:
    """Per layer, the ``counts[l]`` unit ids with the longest horizons (ties: lower unit id first), sorted.

    Args:
        horizons: per recurrent layer, float64 ``[n_units]`` static horizons (tokens).
        counts: per layer, how many to keep (``0 <= counts[l] <= n_units``).
    """
    out = []
    for h, r in zip(horizons, counts):
        order = sorted(range(h.numel()), key=lambda u: (-float(h[u]), u))
        out.append(sorted(order[:r]))
    return out


def init_kept_units(plan, init_h: list[torch.Tensor]) -> list[list[int]]:
    """The init-horizon masks of ``plan``: per layer the plan's ``n_kept`` units ranked by the initial H_s."""
    return count_matched_top(init_h, [lp.n_kept for lp in plan.layers])


def jaccard(a: set, b: set) -> float:
    """|a & b| / |a | b|; 1.0 for two empty sets."""
    return len(a & b) / len(a | b) if (a or b) else 1.0


def decay_drift(trained_h: list[torch.Tensor], init_h: list[torch.Tensor], w_maxes: list[int]) -> dict:
    """How far training moved the horizons (float64 ``[n_units]`` per layer, both under the same a_s, eps).

    Returns ``{"spearman_per_layer": [rho_l], "spearman_median": m, "jaccard": {str(w): {"per_layer":
    [J_l], "all": J}}}`` where J compares {u : H_s(u) > w} of the trained and the initial horizons
    (``all`` pools the layers' (layer, unit) pairs).
    """
    rho = [spearman(t, i) for t, i in zip(trained_h, init_h)]
    out = {"spearman_per_layer": rho, "spearman_median": median_iqr(rho)["median"], "jaccard": {}}
    for w in w_maxes:
        per, all_t, all_i = [], set(), set()
        for li, (t, i) in enumerate(zip(trained_h, init_h)):
            st = {u for u in range(t.numel()) if float(t[u]) > w}
            si = {u for u in range(i.numel()) if float(i[u]) > w}
            per.append(jaccard(st, si))
            all_t |= {(li, u) for u in st}
            all_i |= {(li, u) for u in si}
        out["jaccard"][str(w)] = {"per_layer": per, "all": jaccard(all_t, all_i)}
    return out
