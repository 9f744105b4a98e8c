"""Park tracked files a device call does not need (bundled trained models), so that they do not travel.

    python -m benchmarks.h200.park park PATH...   # remove these tracked files / folders from the working tree
    python -m benchmarks.h200.park status         # what is parked and how many MiB a call saves
    python -m benchmarks.h200.park restore        # bring every parked file back (git checkout -- ...)

A device call sends the checkout's tracked and untracked-not-ignored files that exist (at most 64 MiB with
what it carries); a tracked file deleted from the working tree does not travel. ``park`` deletes the tracked
files under each PATH (each must be tracked and have no uncommitted change: no edit, no staged change, no
untracked file under it, so that ``git checkout -- PATH`` gives back exactly what was there) and appends
them, with their sizes in bytes, to ``.dev/parked.txt``; ``restore`` checks them out of the index again and
clears the record. While files are parked, do not ``git add -A`` / ``git commit -a``: that would commit
their deletion. Which calls park what: benchmarks/h200/README.md ("Parking bundled models").

Refusals: one line ``error: ...`` naming the path, exit 2, nothing changed.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

RECORD = Path(".dev") / "parked.txt"
MIB = 2 ** 20


class ParkError(ValueError):
    """A path that cannot be parked or restored: one line naming it; nothing was changed."""


def _git(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``git ARGS`` in ``root``, paths taken literally (no globs).

    Raises:
        ParkError: with ``check``, git failed (its last stderr line).
    """
    r = subprocess.run(["git", "--literal-pathspecs", *args], cwd=root, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise ParkError(f"git {' '.join(args[:3])}...: {(r.stderr.strip().splitlines() or ['failed'])[-1]}")
    return r


def repo_root(cwd: Path | None = None) -> Path:
    """The top of the git checkout holding ``cwd``.

    Raises:
        ParkError: ``cwd`` is not in a git checkout.
    """
    r = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=cwd or Path.cwd(), capture_output=True, text=True)
    if r.returncode != 0:
        raise ParkError(f"{cwd or Path.cwd()}: not inside a git checkout")
    return Path(r.stdout.strip())


def parked(root: Path) -> dict[str, int]:
    """``{repo-relative file: bytes}`` recorded in ``.dev/parked.txt`` (empty when nothing is parked)."""
    rec = root / RECORD
    if not rec.is_file():
        return {}
    out = {}
    for line in rec.read_text().splitlines():
        if line and not line.startswith("#"):
            size, name = line.split("\t", 1)
            out[name] = int(size)
    return out


def park(root: Path, paths: list[str]) -> dict[str, int]:
    """Delete the tracked files under ``paths`` (relative to the current directory or absolute) from the
    working tree and record them; returns ``{file: bytes}`` parked now. Already parked files are skipped.

    Raises:
        ParkError: a path outside the checkout, not tracked, or with uncommitted changes (edited, staged,
            deleted without being parked, or untracked files under it); nothing is deleted then.
    """
    done, todo = parked(root), {}
    for p in paths:
        rel = os.path.relpath(Path(p).absolute(), root)
        if rel.startswith("..") or rel == ".":
            where = "is" if rel == "." else "outside"
            raise ParkError(f"{p}: {where} the checkout {root}; expected files or folders in it")
        files = [f for f in _git(root, "ls-files", "-z", "--", rel).stdout.split("\0") if f]
        if not files:
            raise ParkError(f"{p}: not tracked by git; expected tracked files or a folder of them")
        st = _git(root, "status", "--porcelain", "--untracked-files=all", "--", rel).stdout.splitlines()
        changes = [ln for ln in st if not (ln[:2] == " D" and ln[3:] in done)]
        if changes:
            raise ParkError(f"{p}: has uncommitted changes ({changes[0].strip()}{' ...' if len(changes) > 1 else ''}); "
                            f"commit or undo them first (restore gives back the committed file)")
        todo.update({f: (root / f).stat().st_size for f in files if f not in done})
    if todo:
        rec = root / RECORD
        rec.parent.mkdir(parents=True, exist_ok=True)
        head = _git(root, "rev-parse", "--short", "HEAD", check=False).stdout.strip()
        with rec.open("a") as fh:
            fh.write(f"# parked at {head} on {dt.datetime.now().isoformat(timespec='seconds')}: "
                     f"{' '.join(paths)}\n" + "".join(f"{b}\t{f}\n" for f, b in todo.items()))
        for f in todo:
            (root / f).unlink()
            d = (root / f).parent
            while d != root and not any(d.iterdir()):
                d.rmdir()
                d = d.parent
    return todo


def restore(root: Path) -> list[str]:
    """Check every parked file out again (``git checkout -- FILES``) and clear the record; returns them.

    Raises:
        ParkError: a parked file exists again with other content (it is left alone, nothing restored), or
            git cannot check it out (its deletion was staged or committed meanwhile).
    """
    files = list(parked(root))
    if not files:
        return []
    there = [f for f in files if (root / f).exists()]
    if there:
        diff = _git(root, "diff", "--name-only", "--", *there).stdout.splitlines()
        if diff:
            raise ParkError(f"{diff[0]}: parked, but a different file is there now; move it away, then restore "
                            f"(nothing was restored)")
    r = _git(root, "checkout", "--", *files, check=False)
    if r.returncode != 0:
        raise ParkError(f"git checkout of the parked files failed ({(r.stderr.strip().splitlines() or ['?'])[-1]}); "
                        f"was their deletion staged or committed? see {RECORD}")
    (root / RECORD).unlink()
    return files


def status(root: Path) -> str:
    """What is parked, by folder, and the MiB a device call does not send because of it."""
    files = parked(root)
    if not files:
        return "nothing parked"
    by_dir: dict[str, list[int]] = {}
    for f, b in files.items():
        c = by_dir.setdefault(str(Path(f).parent), [0, 0])
        c[0], c[1] = c[0] + 1, c[1] + b
    back = [f for f in files if (root / f).exists()]
    lines = [f"{len(files)} files parked, {sum(files.values()) / MIB:.2f} MiB a device call does not send "
             f"(restore: python -m benchmarks.h200.park restore)"]
    lines += [f"  {d}/: {n} files, {b / MIB:.2f} MiB" for d, (n, b) in sorted(by_dir.items())]
    if back:
        lines.append(f"warning: {len(back)} parked files exist again in the working tree (e.g. {back[0]}): they travel")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("park", "restore", "status") or (argv[0] == "park") != (len(argv) > 1):
        print("usage: python -m benchmarks.h200.park park PATH... | restore | status", file=sys.stderr)
        return 2
    try:
        root = repo_root()
        if argv[0] == "park":
            now = park(root, argv[1:])
            print(f"parked {len(now)} files ({sum(now.values()) / MIB:.2f} MiB); {status(root).splitlines()[0]}")
        elif argv[0] == "restore":
            back = restore(root)
            print(f"restored {len(back)} files" if back else "nothing parked")
        else:
            print(status(root))
    except ParkError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
