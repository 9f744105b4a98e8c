"""Park tracked files a device call does not need (bundled trained models), so that they do not travel.

    python -m benchmarks.h200.park park PATH...   # remove these tracked files / folders from the working tree
    python -m benchmarks.h200.park park bundles   # every bundled trained model (:func:`bundled_models`)
    python -m benchmarks.h200.park status         # what is parked and how many MiB a call saves
    python -m benchmarks.h200.park restore        # bring every parked file back (git checkout -- ...)

A device call sends the checkout's tracked and untracked-not-ignored files that exist (at most 64 MiB with
what it carries); a tracked file deleted from the working tree does not travel. ``park`` deletes the tracked
files under each PATH (a symlink is parked like a file) and appends them, with their sizes in bytes, to
``.dev/parked.txt``; ``restore`` checks them out of the index again and clears the record. So that
``git checkout`` gives back exactly what was there, each PATH must be tracked and hold no uncommitted change:
no edit, no staged change, no untracked file under it, no file marked assume-unchanged or skip-worktree, and
each file's content must hash to its index blob. Names with a newline or carriage return are refused. A
recorded file that is back in the working tree unchanged (``git checkout`` by hand) is deleted again by the
next ``park`` of its path. If a file cannot be deleted, the files deleted so far are checked out again and the
record is left as it was. Emptied folders are removed, but not the current one. ``restore`` without a record
counts the tracked files deleted by hand and prints the command that checks out just those. While files are
parked, do not ``git add -A`` / ``git commit -a``: that would commit their deletion. Which calls park what:
benchmarks/h200/README.md ("Parking bundled models").

Refusals (bad paths, a malformed record): one line ``error: ...`` naming the path, exit 2, nothing changed.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

RECORD = Path(".dev") / "parked.txt"
MIB = 2 ** 20
_ENTRY = re.compile(r"([0-9]+)\t([^\r]+)")


class ParkError(ValueError):
    """A path that cannot be parked or restored: one line naming it; nothing was changed."""


def _q(s: str) -> str:
    """``s`` for a one-line message: as it is when printable, else quoted (line breaks, undecodable bytes)."""
    return s if s.isprintable() else ascii(s)


def _git(root: Path, *args: str, check: bool = True, stdin: str | None = None) -> str:
    """``git ARGS`` in ``root`` (paths taken literally, no globs); its stdout, bytes decoded as they are.
    Raises ParkError (git's last stderr line) if git fails and ``check``."""
    r = subprocess.run(["git", "--literal-pathspecs", *args], cwd=root, capture_output=True,
                       input=None if stdin is None else stdin.encode("utf-8", "surrogateescape"))
    if check and r.returncode != 0:
        err = r.stderr.decode("utf-8", "replace").strip().splitlines() or ["failed"]
        raise ParkError(f"git {' '.join(args[:3])}...: {_q(err[-1])}")
    return r.stdout.decode("utf-8", "surrogateescape")


def _z(root: Path, *args: str) -> list[str]:
    """The NUL-separated entries git prints for ``ARGS`` (which include ``-z``)."""
    return [e for e in _git(root, *args).split("\0") if e]


def repo_root(cwd: Path | None = None) -> Path:
    """The top of the git checkout holding ``cwd``; ParkError if there is none."""
    cwd = cwd or Path.cwd()
    r = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=cwd, capture_output=True)
    if r.returncode != 0:
        raise ParkError(f"{_q(str(cwd))}: not inside a git checkout; expected to run in the dasc checkout")
    return Path(r.stdout.decode("utf-8", "surrogateescape").rstrip("\n")).resolve()


def parked(root: Path) -> dict[str, int]:
    """``{repo-relative file: bytes}`` recorded in ``.dev/parked.txt`` (empty when nothing is parked).

    Raises:
        ParkError: the record is not a file, cannot be read, or has a line other than ``SIZE<TAB>PATH``.
    """
    rec = root / RECORD
    if not os.path.lexists(rec):
        return {}
    if not rec.is_file():
        raise ParkError(f"{RECORD}: is not a file; expected the record park writes (move it away)")
    try:
        text = rec.read_bytes().decode("utf-8", "surrogateescape")
    except OSError as exc:
        raise ParkError(f"{RECORD}: cannot be read ({exc.strerror}); expected the record park writes") from None
    out = {}
    for n, line in enumerate(text.split("\n"), 1):
        if line and not line.startswith("#"):
            m = _ENTRY.fullmatch(line)
            if not m or m[2].startswith("/") or {"", ".", ".."} & set(m[2].split("/")):
                raise ParkError(f"{RECORD} line {n}: expected SIZE<TAB>PATH (bytes, a tab, a path in the "
                                f"checkout); fix or delete the line")
            out[m[2]] = int(m[1])
    return out


def _differs(root: Path, blobs: dict[str, str]) -> list[str]:
    """The files of ``blobs`` (``{file: index blob}``) that exist and whose content is not their blob
    (what ``git status`` does not see under assume-unchanged / skip-worktree)."""
    there = [f for f in blobs if os.path.lexists(root / f)]
    links = {f for f in there if os.path.islink(root / f)}
    plain = [f for f in there if f not in links]
    got = dict(zip(plain, _git(root, "hash-object", "--stdin-paths", stdin="\n".join(plain)).split())) if plain else {}
    for f in links:
        got[f] = _git(root, "hash-object", "--stdin", "--no-filters", stdin=os.readlink(root / f)).strip()
    return [f for f in there if got[f] != blobs[f]]


def _rel(root: Path, cwd: Path, p: str) -> str:
    """``p`` (relative to ``cwd`` or absolute) relative to ``root``; symlinks above its last part resolved."""
    a = cwd / p
    a = a.resolve() if a.name in ("", "..") else a.parent.resolve() / a.name
    return os.path.relpath(a, root)


def park(root: Path, paths: list[str], cwd: Path | None = None) -> dict[str, int]:
    """Delete the tracked files under ``paths`` (relative to ``cwd``, by default the current directory, or
    absolute) from the working tree and record them; returns ``{file: bytes}`` deleted now. Files already
    parked are skipped, or deleted again if they are back unchanged.

    Raises:
        ParkError: a path outside the checkout, missing, not tracked, or with uncommitted changes (edited,
            staged, deleted without being parked, untracked files under it, assume-unchanged / skip-worktree,
            content other than the index's); a name with a line break; ``.dev`` not a folder; nothing is
            deleted then. A file that cannot be deleted: those deleted before it are checked out again.
    """
    cwd = cwd or Path.cwd()
    done, todo, rels = parked(root), {}, []
    for p in paths:
        rel = _rel(root, cwd, p)
        if rel in (".", "..") or rel.startswith("../"):
            where = "is" if rel == "." else "is outside"
            raise ParkError(f"{_q(p)}: {where} the checkout {_q(str(root))}; expected files or folders in it")
        entries = _z(root, "ls-files", "-s", "-v", "-z", "--", rel)
        if not entries and not os.path.lexists(root / rel):
            where = "" if os.path.isabs(p) else f" (relative to {_q(str(cwd))})"
            raise ParkError(f"{_q(p)}: does not exist{where}; expected tracked files or a folder of them")
        if not entries:
            raise ParkError(f"{_q(p)}: not tracked by git; expected tracked files or a folder of them")
        blobs = {}
        for e in entries:
            meta, f = e.split("\t", 1)
            tag, mode, blob, _ = meta.split(" ")
            if "\n" in f or "\r" in f:
                raise ParkError(f"{_q(p)}: holds {_q(f)}, a name with a line break; expected names without "
                                f"newline or carriage return (git mv it)")
            if tag.islower() or tag == "S":
                flag = "skip-worktree" if tag in "Ss" else "assume-unchanged"
                raise ParkError(f"{_q(p)}: {_q(f)} is marked {flag}, so git status hides its edits; expected "
                                f"plain tracked files (git update-index --no-{flag} -- FILE)")
            if mode == "160000":
                raise ParkError(f"{_q(p)}: {_q(f)} is a submodule; expected files or folders of files")
            blobs[f] = blob
        st = _z(root, "status", "--porcelain", "-z", "--no-renames", "--untracked-files=all", "--", rel)
        changes = [e for e in st if not (e[:2] == " D" and e[3:] in done)]
        changes += [f"{f} differs from the index" for f in _differs(root, blobs)] if not changes else []
        if changes:
            raise ParkError(f"{_q(p)}: has uncommitted changes ({_q(changes[0].strip())}"
                            f"{' ...' if len(changes) > 1 else ''}); commit or undo them first "
                            f"(restore gives back the committed file)")
        todo.update({f: os.lstat(root / f).st_size for f in blobs if os.path.lexists(root / f)})
        rels.append(rel)
    if todo:
        _delete(root, cwd, todo, {f: b for f, b in todo.items() if done.get(f) != b}, rels)
    return todo


def _delete(root: Path, cwd: Path, todo: dict[str, int], new: dict[str, int], rels: list[str]) -> None:
    """Record ``new`` and delete ``todo`` (emptied folders too, but not ``cwd`` or those above it); on an
    OSError put the files deleted so far and the record back, and raise ParkError."""
    rec, dev = root / RECORD, root / RECORD.parent
    if os.path.lexists(dev) and not dev.is_dir():
        raise ParkError(f"{RECORD.parent}: is not a folder; expected a folder for the record {RECORD} "
                        f"(move it away)")
    old, gone = rec.read_bytes() if rec.is_file() else None, []
    keep, what = {cwd, *cwd.parents}, "written"
    try:
        if new:
            dev.mkdir(parents=True, exist_ok=True)
            head = _git(root, "rev-parse", "--short", "HEAD", check=False).strip()
            with rec.open("ab") as fh:
                fh.write((f"# parked at {head} on {dt.datetime.now().isoformat(timespec='seconds')}: "
                          f"{' '.join(json.dumps(r) for r in rels)}\n"
                          + "".join(f"{b}\t{f}\n" for f, b in new.items())).encode("utf-8", "surrogateescape"))
        what = "deleted"
        for f in todo:
            (root / f).unlink()
            gone.append(f)
            d = (root / f).parent
            while d != root and d not in keep and not any(d.iterdir()):
                d.rmdir()
                d = d.parent
    except OSError as exc:
        note = f"the {len(gone)} files deleted before it are checked out again" if gone else "nothing deleted"
        try:
            if gone:
                _git(root, "checkout", "--pathspec-from-file=-", "--pathspec-file-nul", stdin="\0".join(gone))
        except ParkError as err:
            note = f"{len(gone)} files were deleted and checking them out again failed ({err})"
        if old is None:
            rec.unlink(missing_ok=True)
        else:
            rec.write_bytes(old)
        raise ParkError(f"{_q(str(exc.filename or RECORD))}: cannot be {what} ({exc.strerror or exc}); "
                        f"nothing parked, {note}") from None


def restore(root: Path) -> list[str]:
    """Check every parked file out again (``git checkout -- FILES``) and clear the record; returns them.

    Raises:
        ParkError: a parked file exists again with other content (it is left alone, nothing restored), or
            git cannot check it out (its deletion was staged or committed meanwhile).
    """
    files = list(parked(root))
    if not files:
        return []
    index = {e.split("\t", 1)[1]: e.split(" ")[1] for e in _z(root, "ls-files", "-s", "-z")}
    diff = _differs(root, {f: index[f] for f in files if f in index})
    if diff:
        raise ParkError(f"{_q(diff[0])}: parked, but a different file is there now; move it away, then restore "
                        f"(nothing was restored)")
    try:
        _git(root, "checkout", "--pathspec-from-file=-", "--pathspec-file-nul", stdin="\0".join(files))
    except ParkError as exc:
        raise ParkError(f"{RECORD}: checking out the parked files failed ({exc}); was their deletion staged "
                        f"or committed?") from None
    (root / RECORD).unlink()
    return files


def status(root: Path) -> str:
    """What is parked, by folder, and the MiB a device call does not send because of it (parked files that
    are back in the working tree travel: they are counted in a warning line, not in the total)."""
    files = parked(root)
    if not files:
        return "nothing parked"
    back = [f for f in files if os.path.lexists(root / f)]
    away = {f: b for f, b in files.items() if not os.path.lexists(root / f)}
    by_dir: dict[str, list[int]] = {}
    for f, b in away.items():
        c = by_dir.setdefault(str(Path(f).parent), [0, 0])
        c[0], c[1] = c[0] + 1, c[1] + b
    lines = [f"{len(away)} files parked, {sum(away.values()) / MIB:.2f} MiB a device call does not send "
             f"(restore: python -m benchmarks.h200.park restore)"]
    lines += [f"  {_q(d)}/: {n} files, {b / MIB:.2f} MiB" for d, (n, b) in sorted(by_dir.items())]
    if back:
        lines.append(f"warning: {len(back)} parked files exist again in the working tree (e.g. {_q(back[0])}): "
                     f"they travel; park their folder again to delete them")
    return "\n".join(lines)


def _deleted_hint(root: Path, cwd: Path) -> str | None:
    """A line counting the tracked files deleted in the working tree (no record of them) and the command,
    run in ``cwd``, that checks out those files and no other."""
    gone = [os.path.relpath(root / f, cwd) for f in _z(root, "ls-files", "-d", "-z")]
    if not gone:
        return None
    plain = len(gone) <= 3 and all(f.isprintable() and not set(f) & set("*?[]\\:") for f in gone)
    cmd = ("git checkout -- " + " ".join(shlex.quote(f) for f in gone) if plain
           else "git ls-files -z -d :/ | xargs -0 git --literal-pathspecs checkout --")
    return f"hint: {len(gone)} tracked files are deleted in the working tree (git ls-files -d); bring them back: {cmd}"


def bundled_models(root: Path) -> list[str]:
    """The bundled trained models: tracked ``plans/reference/<name>`` folders whose ``PROVENANCE.md`` is tracked
    (benchmarks/train/bundle.py writes one; the calibrated references have none), as repository-relative
    paths, sorted. Read by ``dasc eval`` on a CPU, by no device driver.

    Raises:
        ParkError: none is tracked (nothing to park under that word).
    """
    names = sorted({Path(p).parent.as_posix() for p in _z(root, "ls-files", "-z", "--", "plans/reference")
                    if len(Path(p).parts) == 4 and Path(p).name == "PROVENANCE.md"})
    if not names:
        raise ParkError("bundles: no tracked plans/reference/*/PROVENANCE.md; expected bundled trained models")
    return names


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("park", "restore", "status") or (argv[0] == "park") != (len(argv) > 1):
        print("usage: python -m benchmarks.h200.park park (PATH|bundles)... | restore | status", file=sys.stderr)
        return 2
    try:
        cwd = Path.cwd()
    except FileNotFoundError:
        print("error: the current directory no longer exists; cd into the checkout", file=sys.stderr)
        return 2
    try:
        root = repo_root(cwd)
        if argv[0] == "park":
            # the word 'bundles' stands for every bundled trained model, alone or among paths
            paths = [q for p in argv[1:] for q in ([str(root / b) for b in bundled_models(root)] if p == "bundles" else [p])]
            now = park(root, paths, cwd)
            total = status(root).splitlines()[0]
            same = len(now) == len(parked(root))
            print(total if same else       # one count when this call parked all there is
                  f"parked {len(now)} more files ({sum(now.values()) / MIB:.2f} MiB); in all {total}")
        elif argv[0] == "restore":
            back = restore(root)
            print(f"restored {len(back)} files" if back else "nothing parked")
            hint = None if back else _deleted_hint(root, cwd)
            if hint:
                print(hint)
        else:
            print(status(root))
    except ParkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {_q(str(exc))}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
