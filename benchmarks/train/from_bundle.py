"""Rebuild a trainer checkpoint from a bundled reference model, so that training continues from the bundle
(e.g. a recall stage, ``train.py --resume DIR/<family> --stage-tokens N``) when the trainer's own checkpoint is lost.

    python -m benchmarks.train.from_bundle BUNDLE --out DIR [--pack-to PARTS_DIR]

BUNDLE: a folder written by benchmarks/train/bundle.py (config.json, model*.safetensors, tokenizer.json,
tokenizer_config.json, train_log.json with ``init_decays``). DIR: a new or empty folder. Writes ``DIR/<family>/``
as train.py's ``finish()`` lays a checkpoint out: the weights (read as fp32 by ``models.load_model``, written by
``models.save_checkpoint``: bf16, ``A_log``/``dt_bias`` fp32), the bundle's tokenizer files, ``provenance.json``
(train_log.json's ``provenance``: the bundler left its session list out, which ``state.json`` holds and the next
session writes back) and ``train_state/``:

- ``state.json``: train_log.json less ``provenance``, ``log`` and ``init_decays``, plus ``from_bundle``
  (``{"bundle": BUNDLE as given, "optimizer": "not carried: ..."}``), which later sessions keep;
- ``init_decays.safetensors``: every ``init_decays`` entry (the bundle keeps them flat) as an fp32 tensor in the
  shape of the bundle's tensor of its name, or of the model parameter of a ``live:`` name;
- ``log.jsonl``: train_log.json's ``log``, one JSON record a line (as the trainer wrote them).

No ``optim.safetensors``: a bundle carries no optimiser state, so the resumed session starts a fresh AdamW (its
``optimizer_restore`` says so). The step count is kept, and a bundle's plan has ended (its last step is the plan's), so
a resume without ``--stage-tokens`` stops at once ("plan"); give ``--stage-tokens`` for a new stage that warms up
again from the bundle's step.

Before it is placed, the rebuilt checkpoint's weight files are compared with the bundle's: the same tensor names,
dtypes and bits (bf16 -> fp32 -> bf16 is exact); a difference refuses the bundle. DIR is assembled in a hidden
sibling and moved into place whole (``dasc_compile.atomic.write_new_dir``). ``--pack-to``: the checkpoint packed
(benchmarks/train/pack.py) as ``<family>.tzp.NN``, what ``python -m benchmarks.train.prepare stage --returned
PARTS_DIR --families <family> --size <size>`` takes; packed beside PARTS_DIR before DIR is placed (an interrupt
leaves neither) and moved in after.

Prints one JSON line: out, family, size, step, tokens, tensors compared, ``weights_equal_bundle``, parts (packed).
Bad input (a missing BUNDLE or one that is not a bundle, no train_log.json or no ``init_decays`` in it, a KDA
bundle on a transformers without ``kimi_linear`` (< 5.17), an --out that is not a new or empty folder, a
--pack-to that is a file or holds that family's parts, either inside BUNDLE): one line ``error: ...`` naming the
path and what was expected, exit status 2, nothing written.
"""

from __future__ import annotations

if __name__ == "__main__":      # a Ctrl-C while torch is imported: held, then one line (dasc_compile.cli_exit)
    from dasc_compile.cli_exit import hold_signals

    hold_signals()

import contextlib
import json
import shutil
import sys
from pathlib import Path

import torch

from benchmarks.cli_args import OneLineParser, path_named
from benchmarks.train.bundle_src import BundleError, read_json, read_tensors
from benchmarks.train.models import FAMILIES, MODEL_TYPES, SIZES, family_unsupported, load_model, save_checkpoint
from dasc_compile import atomic
from dasc_compile.errors import DascInputError, short_text

BUNDLER = "a folder written by benchmarks/train/bundle.py"
TOKENIZER = ("tokenizer.json", "tokenizer_config.json")
OPTIMIZER = "not carried: the next session starts a fresh AdamW"


class FromBundleError(ValueError):
    """Bad input: one line naming the path and what was expected; nothing is written."""


def _json(path: Path, what: str):
    return read_json(path, what, BUNDLER, FromBundleError)


def read_bundle(path: Path) -> dict:
    """The bundle's train_log.json, checked: family, size, step, tokens, seed, sessions, provenance, log and
    init_decays as bundle.py writes them, a config of the family's model_type, weights and tokenizer files.

    Raises:
        FromBundleError: ``path`` is not such a bundle (the message names the file and what was expected).
    """
    path = Path(path)
    if not path.is_dir():
        raise FromBundleError(f"{path}: {'a file' if path.exists() else 'missing'}; expected {BUNDLER}")
    if not (path / "train_log.json").is_file():
        raise FromBundleError(f"{path}: no train_log.json; expected {BUNDLER} (the training state and log it keeps)")
    log = _json(path / "train_log.json", "the bundle's training state and log")
    if not isinstance(log, dict) or log.get("init_decays") is None:
        raise FromBundleError(f"{path / 'train_log.json'}: no init_decays; expected a bundle of a checkpoint with "
                              f"train_state/init_decays.safetensors (the decays a resume measures movement from)")
    init = log["init_decays"]
    if (not isinstance(init, dict) or not init
            or not all(isinstance(v, list) and all(isinstance(x, (int, float)) for x in v) for v in init.values())):
        raise FromBundleError(f"{path / 'train_log.json'}: init_decays is not a non-empty map of name to a list of "
                              f"numbers; expected it as bundle.py writes it")
    if (log.get("family") not in FAMILIES or log.get("size") not in SIZES
            or not all(isinstance(log.get(k), int) for k in ("step", "tokens", "seed"))
            or not isinstance(log.get("sessions"), list) or not log["sessions"]
            or not isinstance(log.get("provenance"), dict)
            or not isinstance(log.get("log"), list) or not all(isinstance(r, dict) for r in log["log"])):
        raise FromBundleError(f"{path / 'train_log.json'}: expected family (one of {', '.join(FAMILIES)}), size (one "
                              f"of {', '.join(SIZES)}), integer step, tokens and seed, a non-empty session list, a "
                              f"provenance object and a log list of records")
    cfg = _json(path / "config.json", "the model's config")
    want = MODEL_TYPES[log["family"]]
    if not isinstance(cfg, dict) or cfg.get("model_type") != want:
        got = cfg.get("model_type") if isinstance(cfg, dict) else None
        raise FromBundleError(f"{path / 'config.json'}: model_type {got!r}; expected {want!r}, the family "
                              f"train_log.json records ({log['family']})")
    missing = [n for n in TOKENIZER if not (path / n).is_file()]
    if missing or not list(path.glob("model*.safetensors")):
        what = ", ".join(missing) if missing else "model*.safetensors"
        raise FromBundleError(f"{path}: no {what}; expected {BUNDLER}")
    return log


def check_places(bundle: Path, out: Path, pack_to: Path | None, family: str) -> None:
    """``out`` new or an empty folder; ``pack_to`` (if given) new or a folder without ``family``'s parts, and not
    inside ``out/family`` (the parts would land in the checkpoint they pack); neither inside ``bundle`` (a
    committed reference model that nothing here may change).

    Raises:
        FromBundleError: otherwise.
    """
    for flag, place in (("--out", out), ("--pack-to", pack_to)):
        if place is not None and place.resolve().is_relative_to(bundle.resolve()):
            raise FromBundleError(f"{flag} {place}: inside the bundle {bundle}; expected a folder outside it (the "
                                  f"bundle is left as it is)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FromBundleError(f"--out {out}: {'a file' if not out.is_dir() else 'not empty'}; expected a new or "
                              f"empty folder (DIR/{family}/ is written there)")
    if pack_to is None:
        return
    if pack_to.exists() and not pack_to.is_dir():
        raise FromBundleError(f"--pack-to {pack_to}: a file; expected a folder for the {family}.tzp.NN parts")
    if pack_to.is_dir() and list(pack_to.glob(f"{family}.tzp.*")):
        raise FromBundleError(f"--pack-to {pack_to}: already holds {family}.tzp.* files; expected a folder without "
                              f"them (move them away, or give another folder)")
    if pack_to.resolve().is_relative_to((out / family).resolve()):
        raise FromBundleError(f"--pack-to {pack_to}: inside the checkpoint {out / family}; expected a folder outside")


def weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``folder``'s weight files, as stored (dtype kept), by name (bundle_src's reader).

    Raises:
        FromBundleError: a weight file that cannot be read.
    """
    try:
        return read_tensors(folder)[0]
    except BundleError as exc:
        raise FromBundleError(str(exc)) from None


def init_decay_tensors(init: dict[str, list], shapes: dict[str, torch.Size],
                       where: Path) -> dict[str, torch.Tensor]:
    """train_log.json's flat ``init_decays`` lists as fp32 tensors, each in ``shapes[name]`` (``live:`` names by
    the parameter's name without the prefix); ``where``: the train_log.json they came from (for the message).

    Raises:
        FromBundleError: a name with no tensor of that name, or of another number of elements.
    """
    out = {}
    for name, values in init.items():
        shape = shapes.get(name.removeprefix("live:"))
        if shape is None or shape.numel() != len(values):
            why = "no tensor or parameter of that name" if shape is None else f"{len(values)} values for {list(shape)}"
            raise FromBundleError(f"{where}: init_decays '{name}': {why}; expected the initial decays of the "
                                  f"bundle's own model")
        out[name] = torch.tensor(values, dtype=torch.float32).reshape(shape)
    return out


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> str | None:
    """None when ``a`` and ``b`` hold the same names, dtypes and bits; else what differs first."""
    if sorted(a) != sorted(b):
        only_a, only_b = sorted(set(a) - set(b))[:3], sorted(set(b) - set(a))[:3]
        return f"tensor names differ (only rebuilt: {only_a}, only bundled: {only_b})"
    return next((f"tensor '{k}' differs ({a[k].dtype} vs {b[k].dtype})" for k in sorted(a)
                 if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])), None)


def _write(bundle: Path, log: dict, model, ck: Path) -> int:
    """Write the checkpoint ``ck`` (module docstring) and compare its weights with the bundle's; returns the number of
    tensors compared.

    Raises:
        FromBundleError: the rebuilt weights differ from the bundle's.
    """
    from safetensors.torch import save_file

    save_checkpoint(model, ck, bundle, log["provenance"])
    bundled, rebuilt = weights(bundle), weights(ck)
    if (diff := _same(rebuilt, bundled)) is not None:
        raise FromBundleError(f"{bundle}: the rebuilt weights differ from the bundle's ({diff}); expected a bundle "
                              f"that transformers reads back bit for bit")
    shapes = {k: t.shape for k, t in bundled.items()} | {n: p.shape for n, p in model.named_parameters()}
    init = init_decay_tensors(log["init_decays"], shapes, bundle / "train_log.json")
    ts = ck / "train_state"
    ts.mkdir()
    state = {k: v for k, v in log.items() if k not in ("provenance", "log", "init_decays")}
    state["from_bundle"] = {"bundle": str(bundle), "optimizer": OPTIMIZER}
    (ts / "state.json").write_text(json.dumps(state, indent=1) + "\n")
    save_file({k: v.contiguous() for k, v in init.items()}, str(ts / "init_decays.safetensors"))
    (ts / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log["log"]))
    return len(rebuilt)


def _move_parts(parts: list[Path], dest: Path) -> list[Path]:
    """Move the packed ``parts`` (in a staging folder beside ``dest``) into ``dest``; returns their new paths."""
    dest.mkdir(parents=True, exist_ok=True)
    return [p.rename(dest / p.name) for p in parts]


def from_bundle(bundle: Path, out: Path, pack_to: Path | None = None) -> dict:
    """Write ``out/<family>/`` from ``bundle`` (and its parts in ``pack_to``); returns the summary the CLI prints.

    Raises:
        FromBundleError: bad input (module docstring), a bundle transformers cannot load, rebuilt weights that differ
            from the bundle's, or ``out`` / ``pack_to`` not writable; ``out`` is then as it was, except when only
            the packing failed (``out`` is then complete, and the message says so).
    """
    bundle, out = Path(bundle), Path(out)
    log = read_bundle(bundle)
    family = log["family"]
    check_places(bundle, out, pack_to, family)
    if (why := family_unsupported(family)) is not None:
        raise FromBundleError(f"{bundle}: a {family} bundle {why}")
    try:
        model = load_model(bundle)
    except Exception as exc:         # transformers raises many kinds on a config or file it cannot read
        raise FromBundleError(f"{bundle}: transformers cannot load it ({type(exc).__name__}: "
                              f"{short_text(' '.join(str(exc).split()))}); expected {BUNDLER}") from None
    got, made = {}, [p for p in (out.absolute(), *out.absolute().parents) if not p.exists()]
    try:
        staging = atomic.staging_dir(pack_to) if pack_to is not None else None
    except OSError as exc:
        raise FromBundleError(f"--pack-to {pack_to}: cannot write beside it ({exc.strerror or exc}); nothing was "
                              f"written") from None

    def fill(tmp: Path) -> None:
        got["n"] = _write(bundle, log, model.float(), tmp / family)
        if staging is not None:    # packed before out is placed: an interrupt here leaves neither
            from benchmarks.train.pack import pack

            got["parts"] = pack(tmp / family, staging)

    try:
        atomic.write_new_dir(out, fill)
        summary = {"out": str(out / family), "family": family, "size": log["size"], "step": log["step"],
                   "tokens": log["tokens"], "tensors": got["n"], "weights_equal_bundle": True}
        if pack_to is not None:
            try:
                summary["parts"] = [str(p) for p in _move_parts(got["parts"], pack_to)]
            except OSError as exc:
                raise FromBundleError(f"--pack-to {pack_to}: cannot write there ({exc.strerror or exc}); "
                                      f"{out / family} is complete, no part was written") from None
    except DascInputError as exc:
        raise FromBundleError(f"--out {exc}") from None
    finally:
        for p in made[1:] if not out.exists() else []:         # folders made for an --out that is not there
            with contextlib.suppress(OSError):
                p.rmdir()
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path, help="bundle folder written by benchmarks/train/bundle.py")
    ap.add_argument("--out", type=path_named("an output path"), required=True, help="new or empty folder; the checkpoint lands in OUT/<family>")
    ap.add_argument("--pack-to", type=Path, default=None, help="also pack the checkpoint here (<family>.tzp.NN)")
    try:
        a = ap.parse_args(argv)
    except SystemExit as exc:                                   # --help: 0; a usage error: 2
        return exc.code if isinstance(exc.code, int) else 2
    try:
        summary = from_bundle(a.bundle, a.out, a.pack_to)
    except FromBundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    from dasc_compile.cli_exit import finish, run_guarded     # Ctrl-C: one line, no traceback
    finish(run_guarded(main))
