"""Rebuild a trained reference model's initialisation (the "untrained model" / init-horizon controls of dasc eval).

    python -m benchmarks.train.init_model TRAINED_DIR --out INIT_DIR

TRAINED_DIR is a trainer checkpoint (``train_state/state.json`` and ``train_state/init_decays.safetensors``)
or a bundle (``plans/reference/NAME``: ``train_log.json`` holds the same state and the initial decays,
benchmarks/train/bundle.py). Rebuilds the initial model on the CPU from its seed (benchmarks/train/models.py
``build_model``), checks it against what training recorded (the initial ``A_log``/``dt_bias`` within a few
fp32 ulps, ``DECAY_RTOL``: another torch or device may round a log one ulp apart; the recorded values are
then copied in, so the controls start from exactly training's decays; the sha256 of all initial weights,
when torch and transformers are the versions that made it), and writes it as a new checkpoint directory
of the same format and tokenizer. Its weights are bf16 like the trained model's (A_log/dt_bias fp32), so
both controls see the same rounding.

Refusals (``error: ...``, one line, exit 2, nothing written): TRAINED_DIR missing or not a trained
reference; ``--out`` existing (nothing is replaced), equal to, inside or holding TRAINED_DIR, or not
writable; rebuilt decays that differ from the record by more than rounding.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from benchmarks.cli_args import OneLineParser, path_named


class InitError(ValueError):
    """Bad input or a rebuild that does not match the record: one line naming the path; nothing written."""


DECAY_RTOL = 1e-6   # relative: a few fp32 ulps (2^-23 = 1.2e-7)


def _recorded(trained: Path) -> tuple[dict, dict]:
    """(training state, {"live:<name>": initial decay tensor}) of a trainer checkpoint or a bundle.

    Raises:
        InitError: one line naming the file when neither layout is there or a file is not as written.
    """
    from safetensors.torch import load_file

    if not trained.is_dir():
        raise InitError(f"{trained}: {'not a directory' if trained.exists() else 'does not exist'}; expected a "
                        f"trained reference model (a trainer checkpoint or a bundle, plans/reference/NAME)")
    st_path, init_path = trained / "train_state" / "state.json", trained / "train_state" / "init_decays.safetensors"
    log_path = trained / "train_log.json"
    try:
        if st_path.is_file():
            return json.loads(st_path.read_text()), load_file(str(init_path))
        if log_path.is_file():
            log = json.loads(log_path.read_text())
            if not isinstance(log.get("init_decays"), dict):
                raise InitError(f"{log_path}: no init_decays record (bundled before 2026-12-02 session 11); "
                                f"rebuild from the trainer's checkpoint or bundle it again")
            return log, {k: torch.tensor(v, dtype=torch.float32) for k, v in log["init_decays"].items()}
    except InitError:
        raise
    except FileNotFoundError as exc:
        raise InitError(f"{exc.filename}: missing; expected the initial decays training recorded") from None
    except (ValueError, OSError, AttributeError, TypeError) as exc:
        raise InitError(f"{trained}: a training record not as written ({type(exc).__name__}: {exc})") from None
    raise InitError(f"{trained}: neither train_state/state.json (a trainer checkpoint) nor train_log.json "
                    f"(a bundle, benchmarks/train/bundle.py); expected a trained reference model")


def _check_out(trained: Path, out: Path) -> None:
    """Refuse an ``out`` that exists (nothing is replaced), is, holds or lies inside ``trained``, or whose
    parent folder is missing."""
    t, o = Path(trained).resolve(), Path(out).resolve()
    if o == t or t in o.parents or o in t.parents:
        raise InitError(f"--out {out}: is, holds or lies inside the trained model {trained}; expected a new folder "
                        f"elsewhere")
    for p in (Path(out), Path(out).with_name(Path(out).name + ".tmp")):   # .tmp: where save_checkpoint writes
        if os.path.lexists(p):
            what = "already exists" if p == Path(out) else f"{p.name} beside it already exists (the staging name)"
            raise InitError(f"--out {out}: {what}; expected a new folder (nothing is replaced)")
    if not o.parent.is_dir():
        raise InitError(f"--out {out}: its parent folder {o.parent} does not exist")


def rebuild(trained: Path, out: Path) -> dict:
    """Write the initial model of ``trained`` to ``out``; returns what was checked.

    Raises:
        InitError: ``trained`` is not a trained reference, ``out`` exists or overlaps it, or the rebuilt
            decays differ from the recorded initial ones (more than rounding).
    """
    from benchmarks.train.models import build_model, is_decay, save_checkpoint
    from benchmarks.train.recipe import attention_of, decay_init_of, rope_of
    from benchmarks.train.tokenizer import EOS, load_tokenizer
    from benchmarks.train.train import _sha, _versions

    _check_out(trained, out)
    state, init = _recorded(trained)
    tok = load_tokenizer(trained)
    model = build_model(state["family"], state["size"], tok.get_vocab_size(), tok.token_to_id(EOS), state["seed"],
                        decay_init_of(state), rope=rope_of(state), attention=attention_of(state))
    max_diff = 0.0
    for n, p in model.named_parameters():
        if is_decay(n) and f"live:{n}" not in init:
            raise InitError(f"{trained}: the recorded initial decays have no {n}; expected one entry per "
                             f"A_log / dt_bias of the {state['family']} model")
        if not is_decay(n):
            continue
        rec = init[f"live:{n}"].to(p.dtype).reshape(p.shape)
        diff = (p.detach() - rec).abs().max().item()
        max_diff = max(max_diff, diff)
        # another torch (or device) may round a log or an exp one ulp apart; more than that is another draw
        if not torch.allclose(p.detach(), rec, rtol=DECAY_RTOL, atol=0.0):
            raise InitError(f"{n}: the rebuilt initial decays differ from the recorded ones by up to {diff:.3g} "
                             f"(more than rounding; versions: recorded {state['init_versions']}, here {_versions()})")
        with torch.no_grad():
            p.copy_(rec)            # the controls use exactly the decays training started from
    same_versions = {k: v for k, v in state["init_versions"].items() if k != "python"} == \
        {k: v for k, v in _versions().items() if k != "python"}
    sha_ok = _sha(model.state_dict()) == state["init_sha256"]
    if same_versions and not sha_ok:
        raise InitError("the rebuilt initial weights differ from the recorded sha256 under the same versions")
    prov = {"model": f"initialisation of {trained}", "seed": state["seed"], "decay_init": decay_init_of(state),
            "decays_match_record": True, "decays_max_abs_diff_before_copy": max_diff,
            "weights_sha256_match_record": sha_ok, "versions_here": _versions(), "versions_recorded": state["init_versions"]}
    import transformers

    transformers.logging.disable_progress_bar()     # one line on success, as on failure
    try:
        save_checkpoint(model, out, trained, prov)
    except OSError as exc:
        import shutil

        shutil.rmtree(Path(out).with_name(Path(out).name + ".tmp"), ignore_errors=True)
        raise InitError(f"--out {out}: cannot write it ({exc.strerror or exc}); nothing was left there") from None
    return prov


def main(argv=None) -> None:
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trained", type=Path)
    ap.add_argument("--out", type=path_named("an output path"), required=True)
    a = ap.parse_args(argv)
    try:
        print(json.dumps(rebuild(a.trained, a.out), indent=1))
    except InitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
