"""Bundle a trained reference checkpoint for git: what a user of the model needs, in files of at most 16 MiB.

    python -m benchmarks.train.bundle SRC --out plans/reference/NAME [--max-shard-mib 16] [--replace]

SRC is a checkpoint directory as benchmarks/train/train.py saves it (format: benchmarks/train/models.py):
``config.json``, ``model*.safetensors`` (with ``model.safetensors.index.json`` when sharded), ``tokenizer.json``,
``tokenizer_config.json``, ``provenance.json`` and ``train_state/`` (``state.json``, ``log.jsonl``, the
optimiser state, the initial decays, ``exact.pt`` with ``--exact-state``); benchmarks/train/bundle_src.py reads
and checks it. OUT gets:

- ``config.json``, the tokenizer files: copied unchanged;
- the weights, tensor for tensor as SRC stores them (the trainer saves its fp32 master weights rounded to
  bf16, ``A_log`` / ``dt_bias`` fp32; nothing is converted): ``model.safetensors`` when it fits in one file
  of at most ``--max-shard-mib`` MiB (0 < MiB <= 16: what a device call returns and the repository takes per
  file), else ``model-0000k-of-0000n.safetensors`` shards and ``model.safetensors.index.json`` (Hugging Face
  layout: ``metadata.total_size`` in bytes of tensor data, ``metadata.total_parameters``, ``weight_map``),
  which transformers, ``dasc compile`` and ``dasc eval`` read;
- ``train_log.json``: state.json (sessions, recipes, optimiser groups, tokens) + ``provenance`` (provenance.json
  less its copy of the sessions) + ``log`` (every record of train_state/log.jsonl, in order) + ``init_decays``
  (the initial ``A_log`` / ``dt_bias`` training recorded, ``{"live:<name>": [floats]}``, so that
  benchmarks/train/init_model.py can check the initialisation it rebuilds from a bundle);
- ``PROVENANCE.md``, generated from those (benchmarks/train/bundle_md.py).

Left out: the optimiser moments and ``exact.pt`` (resume state, not the model).

Nothing is lost or half-written: OUT may not be, lie inside or hold SRC; an existing OUT is refused unless
``--replace`` is given and it is itself a bundle (PROVENANCE.md and only the files above; a file, a notes
folder or a folder of bundles is refused). OUT is staged, placed and replaced by dasc_compile/atomic.py, as
plans are: assembled in a hidden sibling (``atomic.staging_dir``) and moved into place, a replaced bundle
swapped out in one step (or moved aside and back, ``atomic.replace_dir``); a replacement a killed run left
half done is undone, and staging folders of dead runs for the same OUT removed, before OUT is checked
(``atomic.recover``). SIGTERM and SIGINT raise :class:`Interrupted` while it runs (a signal the process
ignores stays ignored), so the sibling is removed, and the CLI says so in one line (exit 130 / 143). Bad
input is refused with one line naming the path or flag and what was expected (:class:`BundleError`; the
CLI prints ``error: ...`` and exits 2).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from benchmarks.cli_args import OneLineParser, path_named
from benchmarks.train.bundle_md import provenance_md
from benchmarks.train.bundle_src import INDEX, TOKENIZER_FILES, BundleError, read_checkpoint
from dasc_compile import atomic
from dasc_compile.errors import DascInputError

__all__ = ["BundleError", "Interrupted", "bundle", "check_out", "plan_shards", "provenance_md", "read_checkpoint"]

MIB = 2 ** 20
MAX_FILE_BYTES = 16 * MIB             # the largest file a bundle holds (issue 20)
BUNDLE_FILES = ("config.json", INDEX, "train_log.json", "PROVENANCE.md", "model.safetensors", *TOKENIZER_FILES)
SHARD_NAME = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(BaseException):
    """SIGTERM or SIGINT while :func:`bundle` ran; ``written``: whether OUT was already complete."""

    def __init__(self, signum: int, written: bool = False):
        super().__init__(signum)
        self.signum, self.written = signum, written


def _raise(signum, _frame):
    for s in SIGNALS:                 # one is enough: the cleanup runs without another interrupting it
        signal.signal(s, signal.SIG_IGN)
    raise Interrupted(signum)


@contextlib.contextmanager
def _signals_raise():
    """SIGTERM / SIGINT raise :class:`Interrupted` inside (so ``finally`` cleans up); the previous handlers are
    restored after; a signal the process ignores (SIG_IGN) is left ignored. Outside the main thread, where Python
    cannot set handlers, nothing changes. (dasc_compile.cli_exit's handler is not this: it belongs to its
    run_guarded, whose latch only that resets, and it takes over an ignored signal.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # a signal the process ignores stays ignored (a background job of a non-interactive shell ignores SIGINT)
    prev = {s: signal.signal(s, _raise) for s in SIGNALS if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for s, h in prev.items():
            signal.signal(s, signal.SIG_DFL if h is None else h)


def _bundle_name(name: str) -> bool:
    return name in BUNDLE_FILES or SHARD_NAME.fullmatch(name) is not None


def check_out(src: Path, out: Path, replace: bool) -> Path:
    """The folder ``--out out`` names, resolved, once writing there can lose nothing (module docstring).

    First undoes a replacement of OUT that a killed run left half done (``atomic.recover``: the bundle it moved
    aside is put back, so OUT is checked as it was before that run).

    Raises:
        BundleError: OUT is a symbolic link, is / is inside / holds SRC, has a file for a parent, exists without
            ``replace``, or exists and is not a bundle (the message names what else it holds), or the bundle a
            killed run moved aside cannot be put back.
    """
    try:
        if out.is_symlink():
            raise BundleError(f"--out {out}: a symbolic link; expected the folder path itself")
        target, s = out.resolve(), Path(src).resolve()
        if target.is_relative_to(s) or s.is_relative_to(target):
            how = "is" if target == s else "is inside" if target.is_relative_to(s) else "holds"
            raise BundleError(f"--out {out}: {how} SRC {src}; expected a folder outside the checkpoint")
        up = next(p for p in target.parents if p.exists())
        if not up.is_dir():
            raise BundleError(f"--out {out}: {up} is a file; expected a folder path")
        try:
            atomic.recover(target)
        except OSError as exc:
            raise BundleError(f"--out {out}: cannot put back the bundle a killed --replace moved aside "
                              f"({exc.strerror or exc}); expected a folder path you can write") from None
        if not target.exists():
            return target
        if not target.is_dir():
            raise BundleError(f"--out {out}: a file; expected a folder (--replace replaces only a bundle folder)")
        if not replace:
            raise BundleError(f"--out {out}: already exists; expected a new folder (or --replace, for a bundle)")
        other = sorted(p.name + ("/" if p.is_dir() else "") for p in target.iterdir()
                       if p.is_symlink() or not p.is_file() or not _bundle_name(p.name))
        if other or not (target / "PROVENANCE.md").is_file():
            what = (f"it also holds {', '.join(other[:5])}{' ...' if len(other) > 5 else ''}" if other
                    else "no PROVENANCE.md")
            raise BundleError(f"--out {out}: not a bundle ({what}); --replace replaces only a folder this bundler "
                              f"wrote (PROVENANCE.md, config.json, model*.safetensors, tokenizer and log files)")
    except (OSError, RuntimeError) as exc:           # RuntimeError: a symlink loop (Python 3.11's resolve)
        raise BundleError(f"--out {out}: not usable ({type(exc).__name__}: {exc}); expected a folder path") from None
    return target


def _entry_bytes(name: str, t) -> int:
    """Upper bound of one tensor's bytes in a safetensors file: data + its header entry (+ separator)."""
    entry = {name: {"dtype": "F8_E4M3XX", "shape": list(t.shape), "data_offsets": [2 ** 48, 2 ** 48]}}
    return t.numel() * t.element_size() + len(json.dumps(entry, separators=(",", ":"))) + 1


def plan_shards(tensors: dict, meta: dict, max_bytes: int, flag: str | None = None) -> list[list[str]]:
    """Tensor names per file, in order, each file at most ``max_bytes`` bytes (header bound included);
    ``flag``: how the limit was given, for messages (default ``max_bytes N``).

    Raises:
        BundleError: one tensor alone does not fit in ``max_bytes``.
    """
    base = 8 + 8 + 2 + len(json.dumps({"__metadata__": meta}, separators=(",", ":")))   # length, padding, braces
    shards, cur, size = [], [], base
    for name, t in tensors.items():
        need = _entry_bytes(name, t)
        if base + need > max_bytes:
            raise BundleError(f"tensor '{name}' needs {base + need:,} bytes in a file, over the {max_bytes:,} bytes a "
                              f"file may hold ({flag or f'max_bytes {max_bytes}'}); expected tensors that fit")
        if cur and size + need > max_bytes:
            shards.append(cur)
            cur, size = [], base
        cur.append(name)
        size += need
    return shards + [cur]


def _write(ck: dict, tmp: Path, plan: list[list[str]], max_bytes: int, flag: str) -> dict[str, int]:
    """Write the bundle's files into ``tmp``; returns {file name: bytes}.

    Raises:
        BundleError: a file would be over ``max_bytes``, or a record in state.json / provenance.json is not
            shaped as the trainer writes it.
    """
    from safetensors.torch import save_file

    src, ts = ck["src"], ck["tensors"]
    names = (["model.safetensors"] if len(plan) == 1 else
             [f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors" for i in range(len(plan))])
    for name, keys in zip(names, plan):
        save_file({k: ts[k].contiguous() for k in keys}, str(tmp / name), metadata=ck["meta"])
    if len(plan) > 1:
        index = {"metadata": {"total_parameters": sum(t.numel() for t in ts.values()),
                              "total_size": sum(t.numel() * t.element_size() for t in ts.values())},
                 "weight_map": {k: n for n, keys in zip(names, plan) for k in sorted(keys)}}
        (tmp / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    shutil.copy2(src / "config.json", tmp / "config.json")
    for p in ck["tokenizer"]:
        shutil.copy2(p, tmp / p.name)
    prov = {k: v for k, v in ck["prov"].items() if k != "sessions"}
    extra = {} if ck.get("init_decays") is None else {"init_decays": ck["init_decays"]}
    (tmp / "train_log.json").write_text(json.dumps(ck["state"] | {"provenance": prov, "log": ck["log"]} | extra,
                                                   indent=1) + "\n")
    sha = {n: hashlib.sha256((tmp / n).read_bytes()).hexdigest() for n in names}
    files = {p.name: p.stat().st_size for p in tmp.iterdir()}
    try:
        md = provenance_md(ck, files, sha)
    except (TypeError, ValueError, AttributeError) as exc:
        raise BundleError(f"{src / 'train_state' / 'state.json'} / provenance.json: a record not shaped as the "
                          f"trainer writes it ({type(exc).__name__}: {exc}); expected {src} as saved") from None
    (tmp / "PROVENANCE.md").write_text(md)
    files["PROVENANCE.md"] = (tmp / "PROVENANCE.md").stat().st_size
    big = [f"{n} ({b:,} bytes)" for n, b in files.items() if b > max_bytes]
    if big:
        raise BundleError(f"{src}: the bundle's {', '.join(big)} would be over the {max_bytes:,} bytes a file may "
                          f"hold ({flag}); nothing was written")
    for p in tmp.iterdir():
        p.chmod(0o644)              # the folder: 0755 (atomic.fill_and_place)
    return files


def bundle(src: Path, out: Path, max_bytes: int = MAX_FILE_BYTES, replace: bool = False,
           flag: str | None = None) -> dict[str, int]:
    """Write the bundle of checkpoint ``src`` at ``out`` (module docstring); returns {file name: bytes}.

    Args:
        max_bytes: the most bytes any file of the bundle may hold (default 16 MiB).
        replace: replace an existing ``out`` that is a bundle (atomically) instead of refusing.
        flag: how ``max_bytes`` was given, for messages (the CLI: ``--max-shard-mib X`` as typed).
    Raises:
        BundleError: bad ``src`` (benchmarks/train/bundle_src.py), an ``out`` refused by :func:`check_out`,
            a tensor / file over ``max_bytes``, or ``out`` not writable; nothing is written then.
        Interrupted: SIGTERM / SIGINT (in the main thread); nothing is written unless ``written``.
    """
    src, out = Path(src), Path(out)
    flag = flag or f"max_bytes {max_bytes}"
    with _signals_raise():
        target = check_out(src, out, replace)
        ck = read_checkpoint(src) | {"now": time.time()}
        plan = plan_shards(ck["tensors"], ck["meta"], max_bytes, flag)
        made = [p for p in (target.parent, *target.parent.parents) if not p.exists()]
        files, tmp, tmp_id = {}, None, None

        def fill(d: Path) -> None:
            files.update(_write(ck, d, plan, max_bytes, flag))

        def cannot(why) -> str:
            return (f"--out {out}: cannot write there ({why}); expected a folder path you can write "
                    f"(nothing was written)")

        try:
            tmp = atomic.staging_dir(target)
            tmp_id = (st := tmp.stat()).st_dev, st.st_ino
            atomic.fill_and_place(tmp, target, fill, cannot)
            return files
        except OSError as exc:
            raise BundleError(cannot(f"{type(exc).__name__}: {exc}")) from None
        except DascInputError as exc:                   # fill_and_place's OSError, as cannot(...)
            raise BundleError(str(exc)) from None
        except Interrupted as exc:                      # held through the swap, delivered after it
            with contextlib.suppress(OSError):
                exc.written = tmp_id is not None and ((st := target.stat()).st_dev, st.st_ino) == tmp_id
            raise
        finally:
            if tmp is not None:                         # a signal before fill_and_place took it over
                shutil.rmtree(tmp, ignore_errors=True)
            for p in made if not target.exists() else []:       # folders made for a bundle that is not there
                with contextlib.suppress(OSError):
                    p.rmdir()


def parse_mib(text: str) -> float:
    """``--max-shard-mib`` as a number: finite, above 0, at most 16.

    Raises:
        BundleError: anything else (the message echoes ``text`` as given).
    """
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and 0 < x <= MAX_FILE_BYTES / MIB):
        raise BundleError(f"--max-shard-mib {text}: expected a number of MiB above 0 and at most 16 (the largest "
                          f"file a device call returns and the repository takes)")
    return x


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="checkpoint directory written by benchmarks/train/train.py")
    ap.add_argument("--out", type=path_named("an output path"), required=True, help="the bundle folder to write, e.g. plans/reference/NAME")
    ap.add_argument("--max-shard-mib", default="16", help="largest file, MiB (above 0, at most 16; default 16)")
    ap.add_argument("--replace", action="store_true", help="replace an existing --out that is a bundle")
    try:
        a = ap.parse_args(argv)
    except SystemExit as exc:                                   # --help: 0; a usage error: 2
        return exc.code if isinstance(exc.code, int) else 2
    try:
        mib = parse_mib(a.max_shard_mib)
        files = bundle(a.src, a.out, int(mib * MIB), a.replace, flag=f"--max-shard-mib {a.max_shard_mib}")
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (Interrupted, KeyboardInterrupt) as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        what = "interrupted" if signum == signal.SIGINT else f"terminated ({signal.Signals(signum).name})"
        done = f"{a.out} was already complete and is kept" if getattr(exc, "written", False) else "nothing written"
        print(f"error: {what}; {done}", file=sys.stderr)
        return 128 + signum
    print(f"bundled {a.src} -> {a.out}: {len(files)} files, {sum(files.values()) / MIB:.2f} MiB "
          f"(largest {max(files.values()) / MIB:.2f} MiB)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:          # before bundle() takes over SIGINT (main says the same after)
        print("error: interrupted; nothing written", file=sys.stderr)
        sys.exit(130)
