"""Train one reference hybrid (GDN: Qwen3-Next architecture, KDA: Kimi-Linear, Mamba2: Nemotron-H) for one
time-boxed session, starting fresh or resuming from a checkpoint directory, and save where it stopped.

    python -m benchmarks.train.train --family gdn --data .dev/train/call --out DIR [--resume DIR]
        [--stop-at EPOCH_S] [--pack-to $OUT] [--max-steps N] ...

A session: load (or build, from ``--seed`` on the CPU) the model, train until ``--max-steps`` or
until the next step would pass ``--stop-at`` minus ``--save-reserve`` (or SIGTERM), then write
``OUT/<family>/`` (benchmarks/train/models.py format) with ``train_state/`` beside the weights:
``state.json`` (step, tokens, schedule, one record per session, ``saved_utc``), ``optim.safetensors`` (the
travelling optimiser state, benchmarks/train/optim.py; a resume without it, e.g. of a checkpoint rebuilt from a
bundle by benchmarks/train/from_bundle.py, starts a fresh AdamW, and its session's ``optimizer_restore`` says so),
``init_decays.safetensors`` (the initial ``A_log``/``dt_bias``, checkpoint names and ``live:``-prefixed parameter
names), ``log.jsonl`` (every logged interval of every session). ``--exact-state`` also writes ``exact.pt`` (fp32
weights + full Adam moments), from which a resume continues exactly. Then the decay report (movement; dasc
compile's kept sets vs init, benchmarks/train/decays.py) and, with ``--pack-to``, the packed parts (pack.py).

Every logged interval prints one JSON line: loss (text rows and recall rows), teacher-forced accuracy
on recall answers (``recall_acc`` over all, ``recall_acc_<kind>`` per synthetic row kind, the answer tokens
of each in ``recall_tokens``: benchmarks/train/scoring.py), tokens/s, learning rate, gradient norm, mean
|change| of A_log and dt_bias; with ``--log-attn-entropy`` the attention layers' attention entropy.
Opt-in recipe options (``--recall-min-gap``, ``--copy-frac``, ``--attn-lr-mult``, ``--log-attn-entropy``,
recorded per session as ``recipe``): benchmarks/train/recipe.py; their defaults change nothing.
Precision: fp32 master weights, bf16 autocast on CUDA; the recurrences run in fp32.

Kernels (``kernels_in_use``, recorded per session): GDN transformers' PyTorch fallbacks, KDA
benchmarks/train/kda_chunk.py, both flash-linear-attention's when it is importable. Mamba2 always runs
benchmarks/train/mamba2_chunk.py's scan inside transformers' Nemotron-H mixers: without mamba_ssm /
causal_conv1d (and the config sets ``use_mamba_kernels`` off) transformers 5.12 would run its
``torch_forward``, whose chunked scan is wrong past the first ``chunk_size`` tokens; the conv is the
mixer's own ``nn.Conv1d``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import shutil
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from benchmarks.cli_args import (OneLineParser, fraction, int_at_least, number_above_zero, path_named,
                                 refuse_unusable_device)
from benchmarks.train import attention
from benchmarks.train import decays as decay_report
from benchmarks.train import optim as O
from benchmarks.train import recipe, scoring
from benchmarks.train.data import KINDS, Batches, read_shard
from benchmarks.train.models import (DECAY_INITS, DEFAULT_DECAY_INIT, FAMILIES, SIZES, build_model, checkpoint_decays,
                                     decays, family_unsupported, load_model, n_params, save_checkpoint)
from benchmarks.train.recipe import provenance
from benchmarks.train.tokenizer import EOS, load_tokenizer

T0 = time.time()
_STOP = {"signal": None}


def _on_term(signum, _frame) -> None:
    _STOP["signal"] = signum


def log(rec: dict, fh=None) -> None:
    line = json.dumps(rec)
    print(line, flush=True)
    if fh is not None:
        fh.write(line + "\n")
        fh.flush()


def parse(argv=None) -> argparse.Namespace:
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=FAMILIES, required=True)
    ap.add_argument("--size", choices=SIZES, help="models.py SIZES (default ref); a resume keeps its own size")
    ap.add_argument("--data", type=Path, required=True, help="folder with tokenizer/ and shard-*.u16.xz")
    ap.add_argument("--out", type=path_named("an output path"), required=True)
    ap.add_argument("--resume", type=Path, default=None, help="checkpoint directory written by an earlier session")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--decay-init", choices=DECAY_INITS, default=None,
                    help="how A_log/dt_bias start on a fresh start (default: the family's, benchmarks/train/models.py "
                         "DEFAULT_DECAY_INIT: log-uniform-dt for gdn, transformers otherwise); a resume keeps its own")
    ap.add_argument("--seq", type=int_at_least(1), default=2560)
    ap.add_argument("--batch", type=int_at_least(1), default=16)
    ap.add_argument("--micro-batch", type=int_at_least(0), default=0, help="rows per forward pass (0: the whole batch)")
    ap.add_argument("--lr", type=number_above_zero("a learning rate"), default=2e-3)
    ap.add_argument("--decay-lr-mult", type=number_above_zero("times --lr"), default=5.0,
                    help="A_log/dt_bias learning rate = lr x this")
    ap.add_argument("--weight-decay", type=fraction, default=0.1)
    ap.add_argument("--warmup", type=int_at_least(0), default=200)
    ap.add_argument("--total-tokens", type=number_above_zero("tokens"), default=None,
                    help="planned tokens over all sessions, which places the cooldown; training stops there (default: 100e6 on a fresh "
                         "start, the recorded plan on a resume; giving it on a resume replaces the plan)")
    ap.add_argument("--cooldown", type=fraction, default=0.2, help="final fraction of the planned steps with decaying lr")
    ap.add_argument("--recall-frac", type=fraction, default=0.3)
    recipe.add_args(ap)
    ap.add_argument("--max-steps", type=int_at_least(0), default=0, help="stop after this many steps in this session (0: none)")
    ap.add_argument("--stop-at", type=number_above_zero("Unix seconds"), default=math.inf,
                    help="wall-clock deadline (Unix seconds)")
    ap.add_argument("--save-reserve", type=float, default=20.0,
                    help="seconds kept for saving before --stop-at (save, decay report and pack took 3-11 s in every device "
                         "call of 2026-12-01..03, three families side by side included; 60 left ~50 s of each call unused)")
    ap.add_argument("--log-every", type=int_at_least(1), default=25)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--memory-fraction", type=fraction, default=0.0,
                    help="cap on this process's share of GPU memory (0: none)")
    ap.add_argument("--exact-state", action="store_true", help="also save fp32 weights and full Adam moments")
    ap.add_argument("--pack-to", type=Path, default=None)
    ap.add_argument("--no-decay-report", action="store_true")
    ap.add_argument("--commit", default=os.environ.get("DASC_COMMIT", "unknown"))
    a = ap.parse_args(argv)
    # checked before the model is built: a device call should not start to find a typo
    if (err := recipe.check(a) or recipe.check_architecture(a, None)) is not None:
        _refuse(err)
    if not (a.data / "tokenizer" / "tokenizer.json").is_file() or not any(a.data.glob("shard-*.u16.xz")):
        _refuse(f"--data {a.data}: expected a folder with tokenizer/tokenizer.json and shard-*.u16.xz "
                f"(python -m benchmarks.train.prepare data / stage)")
    if a.resume is not None:
        if not (a.resume / "train_state" / "state.json").is_file():
            _refuse(f"--resume {a.resume}: not a checkpoint of an earlier session (no train_state/state.json)")
        try:
            st = json.loads((a.resume / "train_state" / "state.json").read_text())
            was = (st["family"], st["seed"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            _refuse(f"--resume {a.resume}: unreadable train_state/state.json ({type(exc).__name__}: {exc})")
        if was != (a.family, a.seed):
            _refuse(f"--resume {a.resume}: trained as --family {was[0]} --seed {was[1]}, asked --family {a.family} "
                    f"--seed {a.seed}")
        if a.size not in (None, st.get("size", "ref")):
            _refuse(f"--size {a.size}: {a.resume} was trained at --size {st.get('size', 'ref')}, and a resume keeps its "
                    f"own size (give that, or no --size)")
        a.size = st.get("size", "ref")       # what provenance's rebuild line names
        if (err := recipe.check_architecture(a, st)) is not None:
            _refuse(err)
    a.size = a.size or "ref"
    refuse_unusable_device(ap, a.device)
    if (why := family_unsupported(a.family)) is not None:
        _refuse(f"--family {a.family}: {why}")
    if a.decay_init == "log-uniform-dt" and a.family != "gdn":
        _refuse(f"--decay-init log-uniform-dt: only for --family gdn (the {a.family} classes draw dt themselves)")
    if a.decay_init is not None and a.resume is not None:
        _refuse("--decay-init: a resume continues from its own initialisation; give it on a fresh start only")
    if a.out.exists() and not a.out.is_dir():
        _refuse(f"--out {a.out}: a file; give a folder (the checkpoint goes into OUT/{a.family})")
    if a.resume is None and (a.out / a.family / "train_state" / "state.json").is_file():
        _refuse(f"--out {a.out}: already holds a trained {a.family} checkpoint ({a.out / a.family}); a fresh start "
                f"would replace it: continue it with --resume {a.out / a.family}, or give a new --out")
    if not (math.isfinite(a.save_reserve) and a.save_reserve >= 0):
        _refuse(f"--save-reserve {a.save_reserve}: expected seconds >= 0")
    return a


def _refuse(msg: str):
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def load_stream(data: Path) -> tuple[np.ndarray, list[dict]]:
    files = sorted(data.glob("shard-*.u16.xz"))
    if not files:
        raise SystemExit(f"{data}: no shard-*.u16.xz files")
    arrays = [read_shard(f) for f in files]
    info = [{"file": f.name, "tokens": int(a.size), "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
            for f, a in zip(files, arrays)]
    return np.concatenate(arrays), info


def _sha(sd: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(sd):
        h.update(k.encode())
        h.update(sd[k].detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def kernels_in_use(family: str) -> str:
    if family == "mamba2":      # installed on the model by main() (benchmarks.train.mamba2_chunk.use_chunk_scan)
        return ("benchmarks/train/mamba2_chunk.py (plain PyTorch chunked SSD, dt unclamped as time_step_limit "
                "says) in transformers' NemotronHMamba2Mixer; conv: its nn.Conv1d")
    if importlib.util.find_spec("fla") is not None:
        return "flash-linear-attention (picked by transformers at import)"
    if family == "kda":
        from benchmarks.train.kda_chunk import use_chunk_kda_in_transformers

        use_chunk_kda_in_transformers()
        return "benchmarks/train/kda_chunk.py (plain PyTorch); conv: transformers' torch fallback"
    return "transformers' pure-PyTorch fallbacks (torch_chunk_gated_delta_rule, causal_conv1d_fn)"


def start(a, tok):
    """(model on CPU, state dict, init decays {checkpoint names + live:...}, optimiser state or None, exact or None)."""
    vocab, eos = tok.get_vocab_size(), tok.token_to_id(EOS)
    if a.resume is None:
        decay_init = a.decay_init or DEFAULT_DECAY_INIT[a.family]
        model = build_model(a.family, a.size, vocab, eos, a.seed, decay_init, rope=not a.no_rope,
                            attention=not a.no_attention)
        tmp = a.out / f".init-{a.family}"
        save_checkpoint(model, tmp, None, None)
        init = checkpoint_decays(tmp) | {f"live:{k}": v for k, v in decays(model).items()}
        shutil.rmtree(tmp, ignore_errors=True)
        state = {"family": a.family, "size": a.size, "seed": a.seed, "decay_init": decay_init, "rope": not a.no_rope,
                 "attention": not a.no_attention, "step": 0, "tokens": 0, "sessions": [],
                 "init_sha256": _sha(model.state_dict()), "init_versions": _versions()}
        return model, state, init, None, None
    from safetensors.torch import load_file

    ts = a.resume / "train_state"       # family and seed: checked by parse()
    state = json.loads((ts / "state.json").read_text())
    model = load_model(a.resume)
    exact = torch.load(ts / "exact.pt", map_location="cpu") if (ts / "exact.pt").exists() else None
    if exact is not None:
        model.load_state_dict(exact["model"])
    optim = load_file(str(ts / "optim.safetensors")) if (ts / "optim.safetensors").is_file() else None
    return model, state, load_file(str(ts / "init_decays.safetensors")), optim, exact


def _versions() -> dict:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0]}


def main(argv=None) -> dict:
    """Train one session (``parse`` lists the flags); returns the saved training state.

    While it runs, SIGTERM asks for a save and a stop, and denormal floats flush to zero (CPU: the decays'
    exp() underflows through denormals, 100x slower). Both are process-wide, so both are put back as they were
    on return, also on a refusal or an error. Before, an in-process caller (the tests) kept flushing, and a
    later test's denormal horizon read as 0.

    Raises:
        SystemExit: status 2 with one line on stderr for a bad flag, data folder or resume checkpoint (``parse``,
            ``_refuse``).
    """
    before = signal.getsignal(signal.SIGTERM)
    flushing = _flushing_denormals()
    _STOP["signal"] = None
    try:
        signal.signal(signal.SIGTERM, _on_term)
        torch.set_flush_denormal(True)
        return _train(parse(argv))
    finally:
        torch.set_flush_denormal(flushing)
        if before is not None:      # None: a handler not set from Python, which cannot be put back
            signal.signal(signal.SIGTERM, before)


def _flushing_denormals() -> bool:
    """Whether this process flushes denormal floats to zero now (PyTorch has a setter but no getter)."""
    return (torch.tensor([1e-39], dtype=torch.float32) * 1.0).item() == 0.0


def _train(a) -> dict:
    torch.manual_seed(a.seed)
    kernels = kernels_in_use(a.family)
    tok = load_tokenizer(a.data / "tokenizer")
    stream, shards = load_stream(a.data)
    try:        # before the model: a recipe the rows cannot hold is refused in one line (it draws no numbers)
        batches = Batches(stream, tok, a.seq, a.batch, a.seed, a.recall_frac, a.recall_min_gap, a.copy_frac,
                          a.skip_source_loss)
    except ValueError as exc:
        given = [f"--seq {a.seq}"] + [f"{f} {v}" for f, v in (("--recall-min-gap", a.recall_min_gap),
                                                               ("--copy-frac", a.copy_frac)) if v]
        _refuse(f"{' / '.join(given)}: {exc}")
    a.out.mkdir(parents=True, exist_ok=True)
    model, state, init, opt_state, exact = start(a, tok)
    if a.family == "mamba2":
        from benchmarks.train.mamba2_chunk import use_chunk_scan

        use_chunk_scan(model)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        if a.memory_fraction:
            torch.cuda.set_per_process_memory_fraction(a.memory_fraction)
    model = model.to(dev).train()
    groups = O.param_groups(model, a.lr, a.weight_decay, a.decay_lr_mult, a.attn_lr_mult)
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=cuda)
    fresh = {"fresh": "the checkpoint carried no optimiser state"} if a.resume and not (opt_state or exact) else None
    restored = O.load_state(opt, exact["optim"] if exact else opt_state) if (exact or opt_state) else fresh
    tps = a.batch * a.seq
    first, total = recipe.schedule_span(a, state, tps)
    state["total_steps"] = total
    init_live = {k[5:]: v for k, v in init.items() if k.startswith("live:")}
    micro = a.micro_batch or a.batch
    logf = open(a.out / f"log-{a.family}.jsonl", "w")   # this session only: a warm machine keeps --out
    session = {"session": len(state["sessions"]), "start_step": state["step"], "device": str(dev),
               "device_name": torch.cuda.get_device_name() if cuda else "cpu", "kernels": kernels,
               "commit": a.commit, "shards": shards, "stream_tokens": int(stream.size),
               "optimizer_restore": restored, "params": n_params(model), **_versions(),
               "recipe": recipe.recipe(a), "optimizer_groups": O.describe(opt)}
    log({"event": "start", "family": a.family, **{k: v for k, v in session.items() if k != "shards"},
         "shards": [s["file"] for s in shards], "total_steps": total, "schedule_start": first,
         "tokens_per_step": tps}, logf)
    step0, t_loop, step_s = state["step"], time.time(), None
    acc = _fresh_interval()
    while True:
        if a.max_steps and state["step"] - step0 >= a.max_steps:
            break
        if state["step"] >= total:   # the plan's cooldown has ended: more steps would run at the floor lr unasked
            break
        if _STOP["signal"] is not None or (step_s and time.time() + 1.5 * step_s > a.stop_at - a.save_reserve):
            break
        t_step = time.time()
        lr = O.lr_at(state["step"] - first, a.lr, a.warmup, total - first, a.cooldown, 0.1)
        O.set_lr(opt, lr)
        xb, mask, kind, unscored = batches.batch(state["step"])
        while True:
            try:
                opt.zero_grad(set_to_none=True)
                stats = scoring.forward_backward(model, xb, mask, kind, micro, dev, cuda, unscored)
                break
            except torch.OutOfMemoryError:
                if micro == 1:
                    raise
                micro = max(1, micro // 2)
                opt.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                log({"event": "oom", "step": state["step"], "micro_batch_now": micro}, logf)
        gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        opt.step()
        state["step"] += 1
        state["tokens"] += tps
        acc["loss_text"] += stats["text"]
        acc["loss_recall"] += stats["recall"]
        for key in ("hit", "n_ans", "exact_hit", "n_exact"):
            acc[key] = [x + y for x, y in zip(acc[key], stats[key])]
        acc["steps"] += 1
        acc["gn"] += gn
        if cuda and state["step"] - step0 <= 3:
            torch.cuda.synchronize()
        dt = time.time() - t_step
        step_s = dt if step_s is None else 0.9 * step_s + 0.1 * dt
        if state["step"] % a.log_every == 0 or state["step"] - step0 in (1, 5):
            if cuda:
                torch.cuda.synchronize()
            el = time.time() - acc["t"]
            mv = decay_report.movement(init_live, decays(model))
            log({"step": state["step"], "tokens": state["tokens"], "lr": lr,
                 "loss_text": _mean(acc["loss_text"]), "loss_recall": _mean(acc["loss_recall"]),
                 **scoring.interval_fields(acc["hit"], acc["n_ans"], acc["exact_hit"], acc["n_exact"]),
                 "grad_norm": acc["gn"] / acc["steps"], "tok_s": acc["steps"] * tps / el,
                 "dA_log": mv.get("A_log", {}).get("mean_abs_change"),
                 "ddt_bias": mv.get("dt_bias", {}).get("mean_abs_change"), "micro_batch": micro,
                 "elapsed_s": round(time.time() - T0, 1),
                 "gpu_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 1) if cuda else None,
                 **(attention.entropy_fields(model, xb, kind, dev, cuda) if a.log_attn_entropy else {})}, logf)
            acc = _fresh_interval()
    wall = time.time() - t_loop
    steps = state["step"] - step0
    session.update({"end_step": state["step"], "steps": steps, "tokens": steps * tps, "loop_s": round(wall, 1),
                    "tok_s": steps * tps / wall if wall > 0 else None,
                    "stopped_by": _stopped_by(a, steps, state["step"] >= total),
                    "micro_batch": micro})
    return finish(a, model, opt, state, session, init, tok, logf)


def _stopped_by(a, steps: int, plan_done: bool) -> str:
    if _STOP["signal"] is not None:
        return f"signal {_STOP['signal']}"
    if plan_done:
        return "plan"
    return "max_steps" if a.max_steps and steps >= a.max_steps else "deadline"


def _fresh_interval() -> dict:
    """Accumulators of one logged interval; ``hit`` / ``n_ans``: answer hits / tokens per kind id (KINDS); ``exact_hit``
    / ``n_exact``: whole answers right / answers per kind id."""
    return {"loss_text": [], "loss_recall": [], "t": time.time(), "steps": 0, "gn": 0.0,
            **{key: [0] * len(KINDS) for key in ("hit", "n_ans", "exact_hit", "n_exact")}}


def _mean(xs):
    return float(np.mean(xs)) if xs else None


def finish(a, model, opt, state, session, init, tok, logf) -> dict:
    """Save the checkpoint and its training state, report the decays, pack for the way back."""
    from safetensors.torch import save_file

    t = time.time()
    name = a.family
    ck = a.out / name
    state["sessions"].append(session)
    prov = provenance(a, state, tok)
    save_checkpoint(model.float(), ck, a.data / "tokenizer", prov)
    ts = ck / "train_state"
    ts.mkdir(exist_ok=True)
    save_file({k: v.contiguous() for k, v in O.compact_state(opt).items()}, str(ts / "optim.safetensors"))
    save_file({k: v.contiguous() for k, v in init.items()}, str(ts / "init_decays.safetensors"))
    if a.exact_state:
        torch.save({"model": {k: v.detach().cpu() for k, v in model.state_dict().items()}, "optim": O.full_state(opt)},
                   ts / "exact.pt")
    prev = a.resume / "train_state" / "log.jsonl" if a.resume else None
    logf.close()
    lines = (prev.read_text() if prev and prev.exists() else "") + (a.out / f"log-{name}.jsonl").read_text()
    (ts / "log.jsonl").write_text(lines)
    report = {"movement": decay_report.movement({k: v for k, v in init.items() if not k.startswith("live:")},
                                                checkpoint_decays(ck))}
    if not a.no_decay_report:
        try:
            report["kept"] = decay_report.kept_overlap(ck, {k: v for k, v in init.items() if not k.startswith("live:")})
        except Exception as exc:      # the report is a convenience: the checkpoint is already saved
            report["kept_error"] = f"{type(exc).__name__}: {exc}"
    session["decays"] = report
    session["save_s"] = round(time.time() - t, 1)
    # when it saved, by this clock (a file's time changes with a copy); read by benchmarks/train/bundle.py
    state["saved_utc"] = session["saved_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    (ts / "state.json").write_text(json.dumps(state, indent=1) + "\n")
    prov = provenance(a, state, tok)
    (ck / "provenance.json").write_text(json.dumps(prov, indent=1) + "\n")
    if a.pack_to is not None:
        from benchmarks.train.pack import pack

        session["packed"] = [p.name for p in pack(ck, a.pack_to)]
    log({"event": "saved", "family": name, "step": state["step"], "tokens": state["tokens"],
         "session_tokens": session["tokens"], "session_tok_s": session["tok_s"], "stopped_by": session["stopped_by"],
         "decays": report, "packed": session.get("packed"), "elapsed_s": round(time.time() - T0, 1)})
    return state


if __name__ == "__main__":
    main()
