"""The training recipe's opt-in options and what a checkpoint records about how it was trained.

Opt-in options of benchmarks/train/train.py (each default keeps the recipe, the token stream and the optimiser
groups exactly as before they existed, so a run started without them resumes bit for bit):

- ``--no-rope`` (gdn) and ``--no-attention``: architecture controls on a fresh start (attention without rotary
  dimensions; no attention layers at all, benchmarks/train/models.py ``layer_types``), recorded in ``state.json``
  and kept by every resume (:func:`check_architecture`);

- ``--recall-min-gap TOKENS`` (0): every recall answer's source at least TOKENS before its question
  (benchmarks/train/data.py ``min_gap``);
- ``--copy-frac F`` (0): share of the recall rows that are long-gap ``copy`` rows (data.py), scored per kind
  as ``recall_acc_copy``;
- ``--attn-lr-mult M`` (1): the softmax-attention layers' parameters in their own AdamW groups at M x the
  learning rate (benchmarks/train/optim.py; a resume may change M: the moments are kept per parameter);
- ``--stage-tokens TOKENS`` (none): on a resume, a new learning-rate schedule stage from the resumed step,
  TOKENS long, with its own warm-up and cooldown (:func:`schedule_span`; e.g. a recall stage with another
  ``--recall-frac`` and ``--lr`` after a finished plan), kept by later resumes;
- ``--log-attn-entropy``: each logged interval also gives the attention layers' mean attention entropy on one
  row (benchmarks/train/attention.py, which says the cost);
- ``--skip-source-loss``: the random values where a needle or record states them, and copy rows' source spans,
  carry no loss (benchmarks/train/data.py ``skip_sources``; the rows are unchanged).

Made for the KDA model, whose MLA attention layers stayed at uniform attention while its KDA layers answered
the (mostly short-range) recall alone. Each session records its recipe (:func:`recipe`) in ``state.json``'s
session list, the ``start`` log line and ``provenance.json``, so that a training note can say what ran.
``provenance.json``'s ``data`` says what ``--data`` held (:func:`data_description`: its meta.json, which
benchmarks/train/prepare.py writes and stages, else only the folder's name), not what it is usually given.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from benchmarks.cli_args import int_at_least
from benchmarks.train.tokenizer import EOS


def add_args(ap) -> None:
    """The opt-in options (module docstring) on the trainer's argparse parser."""
    ap.add_argument("--no-rope", action="store_true",
                    help="gdn: attention without rotary dimensions (position-free, as Kimi-Linear's MLA; the control "
                         "for whether RoPE matters to learning recall); a resume keeps its own (refused on a RoPE one)")
    ap.add_argument("--no-attention", action="store_true",
                    help="every mixer recurrent, no attention layer (the control in which recall must live in the "
                         "recurrent state); a resume keeps its own (refused on one with attention)")
    ap.add_argument("--recall-min-gap", type=int_at_least(0), default=0, metavar="TOKENS",
                    help="least distance from each recall answer's source to its question (0: any depth)")
    ap.add_argument("--copy-frac", type=float, default=0.0,
                    help="share of the recall rows that are long-gap copy rows (kind 'copy')")
    ap.add_argument("--attn-lr-mult", type=float, default=1.0,
                    help="softmax-attention layers' learning rate = lr x this, in their own groups")
    ap.add_argument("--stage-tokens", type=float, default=None, metavar="TOKENS",
                    help="on a resume: start a new schedule stage at the resumed step, TOKENS long, with its own "
                         "warm-up (--warmup) and cooldown (--cooldown); training stops at its end")
    ap.add_argument("--skip-source-loss", action="store_true",
                    help="no loss on the random values where needles and records state them (and copy sources)")
    ap.add_argument("--log-attn-entropy", action="store_true",
                    help="log the attention layers' attention entropy on one row per interval (one 1-row forward)")


def check(a) -> str | None:
    """What is wrong with the opt-in options of parsed args ``a`` (one line), or None."""
    if not 0 <= a.recall_min_gap <= a.seq // 2:
        return f"--recall-min-gap {a.recall_min_gap}: expected 0 to --seq / 2 = {a.seq // 2}"
    if not 0.0 <= a.copy_frac <= 1.0:
        return f"--copy-frac {a.copy_frac}: expected a share in [0, 1]"
    if a.copy_frac and not a.recall_frac:
        return "--copy-frac: a share of the recall rows, and --recall-frac is 0"
    if not (a.attn_lr_mult > 0 and math.isfinite(a.attn_lr_mult)):
        return f"--attn-lr-mult {a.attn_lr_mult}: expected a positive, finite factor"
    if a.stage_tokens is not None:
        if not (math.isfinite(a.stage_tokens) and a.stage_tokens >= a.seq * a.batch):
            return f"--stage-tokens {a.stage_tokens:g}: expected at least one step's tokens (--seq x --batch = {a.seq * a.batch})"
        if a.resume is None:
            return "--stage-tokens: a new stage continues a resumed checkpoint; give --resume (a fresh start has --total-tokens)"
        if a.total_tokens is not None:
            return "--stage-tokens and --total-tokens both set the plan's end; give one of them"
    return None


def schedule_span(a, state: dict, tokens_per_step: int) -> tuple[int, int]:
    """(first step, end step) of the learning-rate schedule this session runs under: a new stage from the resumed
    step with ``--stage-tokens`` (recorded in ``state["schedule_start"]`` so later resumes keep it), else the
    recorded or given plan from step 0 (or from the stage a resumed checkpoint is in). ``--total-tokens`` and
    the recorded ``total_steps`` count over all sessions."""
    from benchmarks.train.optim import total_steps_for

    if a.stage_tokens is not None:
        state["schedule_start"] = state["step"]
        return state["step"], state["step"] + total_steps_for(a.stage_tokens, tokens_per_step)
    total = (total_steps_for(a.total_tokens, tokens_per_step) if a.total_tokens is not None
             else state.get("total_steps") or total_steps_for(100e6, tokens_per_step))
    return state.get("schedule_start", 0), total


def recipe(a) -> dict:
    """What a session trained with (recorded per session)."""
    return {"recall_frac": a.recall_frac, "recall_min_gap": a.recall_min_gap, "copy_frac": a.copy_frac,
            "attn_lr_mult": a.attn_lr_mult, "log_attn_entropy": a.log_attn_entropy, "stage_tokens": a.stage_tokens,
            "skip_source_loss": a.skip_source_loss,
            "lr": a.lr,
            "decay_lr_mult": a.decay_lr_mult, "weight_decay": a.weight_decay, "seq": a.seq, "batch": a.batch,
            "warmup": a.warmup, "cooldown": a.cooldown}


def decay_init_of(state: dict) -> str:
    """The decay initialisation a run started from (runs begun before the choice existed: transformers')."""
    return state.get("decay_init", "transformers")


def rope_of(state: dict) -> bool:
    """Whether a run's attention had rotary dimensions (``--no-rope`` fresh starts record False; runs begun
    before the choice existed had them)."""
    return state.get("rope", True)


def attention_of(state: dict) -> bool:
    """Whether a run's model has attention layers (``--no-attention`` fresh starts record False; runs begun
    before the choice existed had them)."""
    return state.get("attention", True)


def check_architecture(a, resumed: dict | None) -> str | None:
    """What is wrong with ``--no-rope`` / ``--no-attention`` (and the options that act on attention layers) for
    the family and, on a resume, for the architecture recorded in the checkpoint's state ``resumed`` (a resume
    keeps its own; the flags may be left out there), in one line; or None."""
    if a.no_rope and a.family != "gdn":
        return f"--no-rope: only --family gdn (Qwen3-Next) has rotary attention to switch off, not {a.family}"
    if a.no_rope and a.no_attention:
        return "--no-rope with --no-attention: a model without attention layers has no rotary embedding to switch off"
    if resumed is not None and a.no_rope and not attention_of(resumed):
        return (f"--no-rope: {a.resume} has no attention layers (--no-attention), so no rotary embedding to switch "
                f"off; resume without it")
    if resumed is not None:
        for flag, given, had, what in (("--no-rope", a.no_rope, rope_of(resumed), "RoPE"),
                                       ("--no-attention", a.no_attention, attention_of(resumed), "attention layers")):
            if given and had:
                return (f"{flag}: {a.resume} was trained with {what}, and a resume keeps its own architecture "
                        f"(give {flag} on a fresh start, or resume without it)")
    if (a.no_attention or (resumed is not None and not attention_of(resumed))) and (
            a.attn_lr_mult != 1.0 or a.log_attn_entropy):
        return "--attn-lr-mult / --log-attn-entropy act on attention layers, and this model has none (--no-attention)"
    return None


def _recall_text(a) -> str:
    kinds = "needle and key-value" + (f" recall, {a.copy_frac:.0%} of it long-gap copy rows" if a.copy_frac
                                      else " recall")
    gap = f", every answer >= {a.recall_min_gap} tokens after its source" if a.recall_min_gap else ""
    skip = "; the sources' random values carry no loss" if a.skip_source_loss else ""
    return (f"{a.recall_frac:.0%} of rows: synthetic {kinds}{gap}{skip} (benchmarks/train/data.py); dasc eval's "
            "12 retrieval keys never appear")


def data_description(data: Path) -> dict:
    """``text`` and ``held_out`` of the token shards in ``data``, from its meta.json (``source``, ``seed``,
    ``held_out``, ``tokenizer``: benchmarks/train/prepare.py) or, without a readable one, only the folder's name."""
    try:
        meta = json.loads((data / "meta.json").read_text())
    except (OSError, ValueError):
        meta = None
    if not isinstance(meta, dict) or not isinstance(meta.get("source"), str):
        return {"text": f"the token shards of --data {data.name}/ (it has no meta.json naming their source)",
                "held_out": "not recorded (no meta.json)", "folder": data.name}
    tok = f"; tokenized with {meta['tokenizer']}" if isinstance(meta.get("tokenizer"), str) else ""
    return {"text": f"{meta['source']}, shuffled with seed {meta.get('seed', '?')}, packed with <|endoftext|> "
                    f"between documents{tok} (--data {data.name}/meta.json)",
            "held_out": str(meta.get("held_out", "not recorded in meta.json")), "folder": data.name}


def _schedule_text(a, state: dict) -> str:
    start, total = state.get("schedule_start", 0), state["total_steps"]
    return (f"warmup {a.warmup}, constant, linear to 10% over the last {a.cooldown:.0%} of "
            + (f"{total} planned steps" if not start else
               f"a stage of {total - start} steps begun at step {start} (--stage-tokens; steps before it ran "
               f"under the earlier plan, each session's recipe in the sessions below)"))


def provenance(a, state: dict, tok) -> dict:
    """What ``provenance.json`` says: how the model was trained, over all sessions so far (each session's
    ``recipe`` is in ``sessions``; ``data`` and ``training`` describe the latest)."""
    s = state["sessions"]
    groups = "A_log/dt_bias (no weight decay, lr x decay_lr_mult), matrices (weight decay), other vectors (none)"
    if a.attn_lr_mult != 1.0:
        groups += f"; the attention layers' matrices and vectors apart, at lr x attn_lr_mult {a.attn_lr_mult:g}"
    training = {"steps": state["step"], "tokens": state["tokens"], "seq": a.seq, "batch": a.batch,
                "lr": a.lr, "decay_lr_mult": a.decay_lr_mult, "weight_decay": a.weight_decay,
                "schedule": _schedule_text(a, state), "total_steps_planned": state["total_steps"],
                "optimizer": f"AdamW(0.9, 0.95, eps 1e-8), clip 1.0; groups: {groups}",
                "precision": "fp32 master weights, bf16 autocast; recurrences in fp32",
                "between_sessions": "weights travel as bf16 (A_log/dt_bias fp32); Adam's first moment restarts "
                                    "at zero and matrices' second moment is rebuilt from row/column means",
                "seed": a.seed}
    if a.attn_lr_mult != 1.0:
        training["attn_lr_mult"] = a.attn_lr_mult
    model = {"gdn": "GDN hybrid, Qwen3-Next architecture (transformers Qwen3NextForCausalLM)",
                  "kda": "KDA hybrid, Kimi-Linear architecture (transformers KimiLinearForCausalLM)",
                  "mamba2": "Mamba2 hybrid, Nemotron-H architecture (transformers NemotronHForCausalLM), trained "
                            "with dt unclamped (time_step_limit (0, inf), as mamba_ssm and SGLang)"}[a.family]
    if not attention_of(state):
        model = model.replace(" hybrid,", " model without attention layers (every mixer recurrent; --no-attention),")
    return {
        "model": model,
        "trained_by": "benchmarks/train/train.py (dasc), sessions driven by benchmarks/h200/train_refs.sh",
        "parameters": s[-1]["params"] if s else None,
        "tokenizer": json.loads((a.data / "tokenizer" / "tokenizer_config.json").read_text()).get("dasc_source"),
        "vocab_size": tok.get_vocab_size(),
        "data": data_description(a.data) | {"recall": _recall_text(a)},
        "training": training,
        "init": {"seed": a.seed, "decay_init": decay_init_of(state), "rope": rope_of(state),
                 "attention": attention_of(state),
                 "rebuild": f"benchmarks.train.models.build_model('{a.family}', '{a.size}', "
                            f"{tok.get_vocab_size()}, {tok.token_to_id(EOS)}, {a.seed}, '{decay_init_of(state)}'"
                            + ("" if rope_of(state) else ", rope=False")
                            + ("" if attention_of(state) else ", attention=False") + ")",
                 "sha256_fp32": state["init_sha256"], "versions": state["init_versions"],
                 "decays": "train_state/init_decays.safetensors"},
        "sessions": [{k: v for k, v in x.items() if k not in ("shards",)} | {"shards": [y["file"] for y in x["shards"]]}
                     for x in s],
    }
