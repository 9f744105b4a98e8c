"""``dasc eval``'s work: check the inputs, load what is needed, run the protocol, build the JSON document.

Order (every refusal comes before any model runs): options (:mod:`dasc_compile.eval.inputs`: lengths, arms,
the device) -> transformers present -> the checkpoint's decay tensors -> the prefix (with ``--sharegpt`` also
the suffix) against the context -> the plans -> the model type against the transformers release (before any
transformers call that could print) -> the initial state (controls) -> tokenizer and prompts (options that act
on none of them refused) -> the prompts' real lengths against the context -> the model(s). With ``json_out`` the document is
rewritten (atomically) after every prompt, so an interrupted run keeps the prompts it finished
(``protocol.complete: false``).

JSON (keys read by tests and tools): ``model`` (path, model_type, family, recurrent_layer_ids,
decay_sha256, provenance, and ``provenance_json``: a ``provenance.json`` beside the weights),
``protocol`` (prefix/suffix lengths, k, arms, seeds, prompt source,
``prompts_sha256``, device, ``n_prompts`` done of ``n_prompts_planned``, ``complete``), ``plan`` and
``arms`` for the first plan, ``plans``: one ``{"plan", "arms"[, "untrained"]}`` per ``--plan`` in the
order given, and with an initial state ``init``: ``{"source", "drift"}`` (:func:`controls.decay_drift`).
``arms`` maps ``dense | nr | wr | init | random`` to the metrics of :mod:`dasc_compile.eval.protocol`;
``random`` gives ``{"mean", "sd"}`` per metric. Each ``plans`` entry also holds ``per_prompt`` (arm ->
metric -> values in the order of ``protocol.prompts``, 6 significant digits) and ``paired`` (``nr_minus_init``,
``nr_minus_random``: :func:`protocol.paired_summaries`), and with the untrained control
``untrained_per_prompt`` / ``untrained_paired``. ``--horizons`` writes ``{"model", "protocol",
"table_1b"}`` instead. Non-finite numbers (C_temp of a plan that keeps nothing) are written as null.
"""

from __future__ import annotations

import json
import math
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Optional

from dasc_compile.cli_exit import Interrupted
from dasc_compile.console import console, counted, progress_bar
from dasc_compile.errors import DascInputError
from dasc_compile.eval.inputs import (DEFAULT_GEN_TOKENS, DEFAULT_SUFFIX_LEN, check_common, check_context,
                                      check_device, make_prompts, parse_arms, refuse_idle_lengths)

#: stderr: progress bars and one-line errors (stdout carries the tables).
ERR = console(stderr=True, highlight=False, soft_wrap=True)
#: 3: per-prompt values, paired summaries and ``protocol.prompts`` added (every version-2 key kept).
EVAL_JSON_VERSION = 3
#: w_max values at which the decay drift (kept-set Jaccard with init) is always reported.
DRIFT_W_MAX = (16, 64, 128, 256)


class EvalInterrupted(Exception):
    """Ctrl-C (or SIGTERM) during the prompts; ``done`` of ``planned`` prompts are in the JSON written so
    far. ``signal_name`` / ``exit_code``: SIGINT / 130 or SIGTERM / 143."""

    def __init__(self, done: int, planned: int, json_out: Optional[Path], signum: int = signal.SIGINT):
        self.signal_name = signal.Signals(signum).name
        super().__init__(f"interrupted ({self.signal_name}) after {done} of {counted(planned, 'prompt')}")
        self.done, self.planned, self.json_out, self.exit_code = done, planned, json_out, 128 + signum


def checkpoint_decays(model: Path):
    """(spec, decay tensors, provenance) of the checkpoint, read as ``dasc compile`` reads it."""
    from dasc_compile.arch import arch_from_config, check_against_tensors
    from dasc_compile.checkpoint import open_checkpoint, read_decay_tensors
    from dasc_compile.eval.models import _read_config, model_family

    model_family(model, _read_config(model))
    src = open_checkpoint(model)
    spec = arch_from_config(src.config, str(src.config_path))
    if not spec.recurrent_layer_ids:
        raise DascInputError(f"{src.config_path}: the model has no recurrent (linear-attention) layers")
    check_against_tensors(spec, src.tensor_files.keys(), str(src.root))
    return spec, read_decay_tensors(src, spec), src.provenance


def load_plans(paths: list, spec, tensors) -> list:
    """``[(label, Plan)]`` of plan directories, or of ``(label, Plan)`` pairs already in memory (``dasc
    sweep``), each checked to be compiled from exactly these decay tensors and recurrent layers.

    Raises:
        DascInputError: a plan of other decay tensors or recurrent layers, or one plan given twice.
    """
    from dasc_compile.checkpoint import decay_fingerprint
    from dasc_compile.schema import load_plan

    fp = decay_fingerprint(tensors)
    plans, seen = [], {}
    for p in paths:
        if not isinstance(p, tuple):            # a plan given twice (its folder and its plan.json) runs twice
            where = Path(p).resolve()
            where = where.parent if where.is_file() else where
            if where in seen:
                raise DascInputError(f"--plan {p}: the same plan as --plan {seen[where]}; give each plan once")
            seen[where] = p
        p, plan = p if isinstance(p, tuple) else (p, load_plan(p, verify_kernels=False))
        if plan.fingerprint.decay_sha256 != fp:
            raise DascInputError(
                f"{p}: plan was compiled from other decay tensors (fingerprint {plan.fingerprint.decay_sha256[:12]}..., "
                f"this model's {fp[:12]}...); compile a plan for this model with 'dasc compile'")
        if list(plan.model.recurrent_layer_ids) != list(spec.recurrent_layer_ids):
            raise DascInputError(f"{p}: plan's recurrent layers {plan.model.recurrent_layer_ids} are not the model's "
                                 f"{list(spec.recurrent_layer_ids)}")
        check_kept_units(p, plan, spec, tensors)
        plans.append((str(p), plan))
    return plans


def check_kept_units(p, plan, spec, tensors) -> None:
    """Refuse a plan whose kept units are not the ones its own policy selects from these decay tensors (Eq. 3,
    §4.1): an edited ``a_s`` or ``eps``, or kept units swapped with every count kept, that the plan reader cannot
    see (it checks ``w_max`` only against the horizons the plan records: ``dasc_compile.schema.cutoff``), since the
    arms would be reported under a policy they were not made with.

    Raises:
        DascInputError: ``<plan>: plan field 'layers[i].kept_units' ...``.
    """
    from dasc_compile.compiler import layer_horizons
    from dasc_compile.selection import layer_kept_sets

    want = layer_kept_sets(spec, plan.policy, layer_horizons(spec, plan.policy, tensors))
    for i, (lp, k) in enumerate(zip(plan.layers, want)):
        k = k.tolist()
        if list(lp.kept_units) != k:
            diff = len(set(k) ^ set(lp.kept_units))
            pol = plan.policy
            why = ("the plan was edited, or it is a Random plan drawn by a torch whose randperm differs from this one's"
                   if pol.random_seed is not None else "the plan was edited")
            raise DascInputError(
                f"{p}: plan field 'layers[{i}].kept_units' holds {lp.n_kept} units, but its policy (w_max {pol.w_max}, "
                f"a_s {pol.a_s}, eps {pol.eps}) selects {len(k)} from this model's decays ({diff} differ): {why}; "
                f"recompile it with 'dasc compile'")


def warn_prefix_cut(prompts: list, prompts_file, prefix_len: int) -> None:
    """Print the ``warning:`` line of :func:`~dasc_compile.eval.prompts.prefix_cut_note` (stderr), if any."""
    from dasc_compile.eval.prompts import prefix_cut_note

    note = prefix_cut_note(prompts, prompts_file, prefix_len)
    if note:
        ERR.print(f"warning: {note}", markup=False)


def model_record(model: Path, em, spec, tensors, provenance) -> dict:
    from dasc_compile.checkpoint import decay_fingerprint

    rec = {"path": str(model), "model_type": spec.model_type, "family": spec.family,
           "recurrent_layer_ids": list(spec.recurrent_layer_ids), "num_heads": em.num_heads,
           "units_per_head": em.units_per_head, "decay_sha256": decay_fingerprint(tensors), "provenance": provenance}
    try:                                   # a training record beside the weights (how the model was trained)
        rec["provenance_json"] = json.loads((Path(model) / "provenance.json").read_text())
    except (OSError, ValueError):
        pass
    return rec


def _init_control(model, spec, tensors, loaded, init_from, init_seed):
    """(init_kept per plan, the ``init`` record) from the initial decay tensors.

    Raises:
        DascInputError: as :func:`dasc_compile.eval.controls.init_decay_tensors`.
    """
    from dasc_compile.compiler import layer_horizons, resolve_family_policy
    from dasc_compile.eval.controls import decay_drift, init_decay_tensors, init_kept_units

    init_t, source = init_decay_tensors(model, spec, init_from, init_seed, model_tensors=tensors)
    kept, drift = [], None
    for _, plan in loaded:
        pol = resolve_family_policy(spec, plan.policy)
        init_h = layer_horizons(spec, pol, init_t)
        kept.append(init_kept_units(plan, init_h))
        if drift is None:
            w = sorted(set(DRIFT_W_MAX) | {p.policy.w_max for _, p in loaded})
            drift = dict(decay_drift(layer_horizons(spec, pol, tensors), init_h, w), a_s=pol.a_s, eps=pol.eps)
    return kept, {"source": source, "drift": drift}


def run_eval(model: Path, plans: list[Path], *, prompts_file: Optional[Path] = None, sharegpt: Optional[int] = None,
             sharegpt_offset: int = 0, retrieval: Optional[int] = None, arms: str = "dense,nr,wr,random",
             prefix_len: int = 512, suffix_len: Optional[int] = None, gen_tokens: Optional[int] = None,
             device: str = "cpu", seed: Optional[int] = None,
             progress: bool = True, time_budget_s: Optional[float] = None, init_from: Optional[Path] = None,
             init_seed: Optional[int] = None, json_out: Optional[Path] = None) -> dict:
    """The cached-prefix evaluation of ``plans`` on ``model`` (:mod:`dasc_compile.eval.protocol`).

    ``plans``: plan directories, or ``(label, Plan)`` pairs compiled in memory (``dasc sweep --eval``).
    ``time_budget_s`` (benchmarks only): start no new prompt after this many seconds. ``init_from`` /
    ``init_seed``: the initial state for the ``init`` / ``untrained`` arms and the decay drift.
    ``json_out``: the document is rewritten there after every prompt. ``suffix_len`` (cuts text prompts),
    ``gen_tokens`` (k of prompts without an answer), ``seed`` (of the built-in retrieval prompts): None when
    not given, then :data:`DEFAULT_SUFFIX_LEN` / :data:`DEFAULT_GEN_TOKENS` / :data:`DEFAULT_SEED` where they
    act; ``protocol.suffix_len`` / ``gen_tokens`` record the value used, null when it acted on no prompt.

    Raises:
        DascInputError: no plan, bad options, transformers missing, a model without recurrent layers, a
            plan compiled from other decay tensors, prompts shorter than the prefix or longer than the
            context, no initial state for the controls, an unusable device; ``suffix_len`` / ``gen_tokens`` /
            ``seed`` given where they act on no prompt (:func:`~dasc_compile.eval.inputs.refuse_idle_lengths`).
        EvalInterrupted: Ctrl-C; the prompts finished so far are in ``json_out``.
    """
    from dasc_compile.eval.arms import RANDOM_SEEDS
    from dasc_compile.eval.hf_compat import library_versions, warn_untested_transformers
    from dasc_compile.eval.models import _read_config, load_eval_model, preflight, require_model_support
    from dasc_compile.eval.tokenizer import load_tokenizer
    from dasc_compile.eval.prompts import prompt_record, prompts_hash
    from dasc_compile.eval.protocol import (make_case, paired_summaries, per_prompt_values, plan_record, rounded,
                                            run_prompt, summarize_plan)

    arm_t = parse_arms(arms)
    suffix_used = DEFAULT_SUFFIX_LEN if suffix_len is None else suffix_len
    k = DEFAULT_GEN_TOKENS if gen_tokens is None else gen_tokens
    check_common(prefix_len, suffix_used, k)
    check_device(device)
    if not plans:
        raise DascInputError("give at least one --plan DIR (or --horizons for horizon validation)")
    warn_untested_transformers()
    spec, tensors, provenance = checkpoint_decays(model)
    if sharegpt is not None:       # ShareGPT prompts are cut from text; the others' lengths are known once read
        check_context(model, prefix_len + suffix_used, "--prefix-len + --suffix-len")
    else:
        check_context(model, prefix_len, "--prefix-len")
    loaded = load_plans(plans, spec, tensors)
    require_model_support(model)     # before any transformers call (the initial state's may print otherwise)
    controls = {"init", "untrained"} & set(arm_t)
    init_kept, init_rec = ([None] * len(loaded), None)
    if controls or init_from is not None or init_seed is not None:
        init_kept, init_rec = _init_control(model, spec, tensors, loaded, init_from, init_seed)
    preflight(model)
    if "untrained" in arm_t and init_from is not None:
        try:                                # name the flag and the arm that reads the whole initial weights
            preflight(init_from, need="--arms untrained needs the whole initial checkpoint (--arms init reads only "
                                      "its decay tensors)")
        except DascInputError as exc:
            raise DascInputError(f"--init-from {exc}") from None
    tok = load_tokenizer(model, _read_config(model))
    prompts, source = make_prompts(tok, prompts_file, sharegpt, sharegpt_offset, retrieval, prefix_len, suffix_len, seed)
    refuse_idle_lengths(prompts, suffix_len, gen_tokens)
    longest = max(len(p.prefix) + len(p.suffix) + (len(p.answer) if p.answer else k) for p in prompts)
    check_context(model, longest, "the longest prompt (prefix + suffix + answer or --gen-tokens)")
    warn_prefix_cut(prompts, prompts_file, prefix_len)
    em = load_eval_model(model, device, tokenizer=tok)
    cases = [make_case(em, plan, label, arm_t, init_kept=k) for (label, plan), k in zip(loaded, init_kept)]
    untrained = None
    if "untrained" in arm_t:
        em_u = load_eval_model(init_from or model, device, init_seed=None if init_from else init_seed, tokenizer=tok)
        u_arms = tuple(a for a in arm_t if a in ("dense", "nr", "wr", "random"))
        untrained = (em_u, u_arms, [make_case(em_u, plan, label, u_arms) for label, plan in loaded])

    t0, done = time.time(), []

    def document(complete: bool) -> dict:
        per_plan = []
        for c in cases:
            pp = per_prompt_values(c)
            per_plan.append({"plan": plan_record(c.plan, c.label), "arms": summarize_plan(c),
                             "per_prompt": rounded(pp), "paired": paired_summaries(pp)})
        if untrained is not None:
            for rec, cu in zip(per_plan, untrained[2]):
                pp = per_prompt_values(cu)
                rec.update(untrained=summarize_plan(cu), untrained_per_prompt=rounded(pp),
                           untrained_paired=paired_summaries(pp))
        doc = {
            "dasc_eval_version": EVAL_JSON_VERSION,
            "model": model_record(model, em, spec, tensors, provenance),
            "protocol": {
                "name": "cached-prefix: prefix -> state checkpoint -> arm on the recurrent temporal state "
                        "(conv state and full-attention KV exact) -> suffix + tail scored against dense",
                "prefix_len": prefix_len, "arms": list(arm_t),
                "suffix_len": suffix_used if any(p.kind == "text" for p in prompts) else None,
                "gen_tokens": k if any(p.answer is None for p in prompts) else None,
                "random_seeds": list(RANDOM_SEEDS), "prompt_source": source, "n_prompts": len(done),
                "n_prompts_planned": len(prompts), "complete": complete,
                "n_retrieval_prompts": sum(p.answer is not None for p in done), "prompts_sha256": prompts_hash(done),
                "prompts": [prompt_record(i, p) for i, p in enumerate(done)],
                "device": str(em.device), "dtype": "float32", "stopped_early": len(done) < len(prompts),
                "versions": library_versions(),
                "wall_s": round(time.time() - t0, 3),
            },
            "plan": per_plan[0]["plan"], "arms": per_plan[0]["arms"], "plans": per_plan,
        }
        if init_rec is not None:
            doc["init"] = init_rec
        return doc

    try:
        with progress_bar(ERR, progress) as bar:
            task = bar.add_task(f"dasc eval: {counted(len(prompts), 'prompt')} x {len(cases)} plan(s)",
                                total=len(prompts))
            for p in prompts:
                if time_budget_s is not None and done and time.time() - t0 > time_budget_s:
                    break
                run_prompt(em, p, cases, arm_t, k)
                if untrained is not None:
                    run_prompt(untrained[0], p, untrained[2], untrained[1], k)
                done.append(p)
                if json_out is not None:
                    write_json(document(False), json_out)
                bar.advance(task)
    except (KeyboardInterrupt, Interrupted) as exc:   # the CLI's handlers raise Interrupted (cli_exit)
        if json_out is not None and done:
            write_json(document(False), json_out)
        raise EvalInterrupted(len(done), len(prompts), json_out if done else None,
                              getattr(exc, "signum", signal.SIGINT)) from None
    doc = document(len(done) == len(prompts))
    if json_out is not None:
        write_json(doc, json_out)
    return doc


def _finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def write_json(doc: dict, out: Path) -> None:
    """Write ``doc`` to ``out`` atomically (temporary file in the same folder, then rename); non-finite
    numbers become null (strict JSON)."""
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".dasc-", suffix=".json.tmp", dir=out.parent)  # short: see figures.save_png
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(_finite(doc), f, indent=1, allow_nan=False)
                f.write("\n")
            os.chmod(tmp, 0o644)           # like the plan files: readable by others, not a private temp file
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as exc:
        raise DascInputError(f"{out}: cannot write the JSON output ({exc.strerror})") from None


def run_horizons(model: Path, plan: Optional[Path] = None, *, prompts_file: Optional[Path] = None,
                 sharegpt: Optional[int] = None, sharegpt_offset: int = 0, retrieval: Optional[int] = None,
                 prefix_len: int = 512, device: str = "cpu", seed: Optional[int] = None, progress: bool = True,
                 init_from: Optional[Path] = None, init_seed: Optional[int] = None) -> dict:
    """Table 1(b) for ``model``: Spearman of H_s with H_e and with M_S per (prefix, layer) (Eq. 4, 5);
    with an initial state (``init_from`` whole checkpoint, or ``init_seed``) also for the untrained model
    (``table_1b_untrained``, its own H_s), on the same prefixes.

    H_s uses the plan's policy (a_s, eps) when ``plan`` is given, else the family defaults; ``protocol.plan``
    names the plan (null without one), ``protocol.a_s`` / ``eps`` the values used. ``seed``: as :func:`run_eval`.

    Raises:
        DascInputError: as :func:`run_eval`.
    """
    from dasc_compile.compiler import layer_horizons, resolve_family_policy
    from dasc_compile.eval import horizons as hz
    from dasc_compile.eval.controls import init_decay_tensors
    from dasc_compile.eval.hf_compat import warn_untested_transformers
    from dasc_compile.eval.models import _read_config, load_eval_model, require_model_support
    from dasc_compile.eval.prompts import prompts_hash
    from dasc_compile.eval.tokenizer import load_tokenizer
    from dasc_compile.policy import Policy

    check_common(prefix_len, 2, 1)
    check_device(device)
    warn_untested_transformers()
    spec, tensors, provenance = checkpoint_decays(model)
    check_context(model, prefix_len, "--prefix-len")
    policy = Policy()
    if plan is not None:
        policy = load_plans([plan], spec, tensors)[0][1].policy
    require_model_support(model)     # before the tokenizer or the initial state: transformers may print otherwise
    policy = resolve_family_policy(spec, policy)
    models = [("table_1b", None, layer_horizons(spec, policy, tensors))]
    if init_from is not None or init_seed is not None:
        init_t, _ = init_decay_tensors(model, spec, init_from, init_seed, model_tensors=tensors)
        models.append(("table_1b_untrained", True, layer_horizons(spec, policy, init_t)))
    tok = load_tokenizer(model, _read_config(model))
    prompts, source = make_prompts(tok, prompts_file, sharegpt, sharegpt_offset, retrieval, prefix_len, 2, seed)
    warn_prefix_cut(prompts, prompts_file, prefix_len)
    out = {}
    em = None
    for key, untrained, static_h in models:
        m = (load_eval_model(init_from or model, device, init_seed=None if init_from else init_seed, tokenizer=tok)
             if untrained else load_eval_model(model, device, tokenizer=tok))
        em = em or m
        rows = []
        with progress_bar(ERR, progress) as bar:
            task = bar.add_task(f"dasc eval --horizons: {len(prompts)} prefixes", total=len(prompts))
            for p in prompts:
                rows += hz.validate_prefix(m, p.prefix, static_h, policy.eps)
                bar.advance(task)
        out[key] = hz.summarize(rows)
    return {
        "dasc_eval_version": EVAL_JSON_VERSION,
        "model": model_record(model, em, spec, tensors, provenance),
        "protocol": {"name": "horizon validation (Eq. 4, 5): Spearman across units per (prefix, layer)",
                     "prefix_len": prefix_len, "n_prefixes": len(prompts), "prompt_source": source,
                     "prompts_sha256": prompts_hash(prompts), "plan": None if plan is None else str(plan),
                     "a_s": policy.a_s, "eps": policy.eps,
                     "device": str(em.device)},
        **out,
    }
