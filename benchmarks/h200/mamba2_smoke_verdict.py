"""Verdict of the H200 Mamba2 smoke (``benchmarks/h200/mamba2_smoke.sh``): each case PASS or FAIL from evidence.

``python -m benchmarks.h200.mamba2_smoke_verdict OUT "dense dasc_w16 dasc_w0 mismatch"`` reads what the script
left in OUT and prints one line per requested case, then the verdict; exit status 1 when a requested case
failed (0 only when every one passed). Evidence per case (stdlib only: it runs on the device's python3):

- every served case: ``start_LABEL.rc`` is 0 (its server answered /health) and ``client_LABEL.json`` holds
  the three requests of ``runtime_smoke_client.py``, each with 16 output tokens; r1 (the cold 700-token
  prefix) has 0 cached tokens and r2 (the same prefix again) a prefix hit (cached tokens > 0);
- ``dense``: nothing more (SGLang alone);
- ``dasc_w16``: its server log has at least one ``dasc: restoring N compressed`` line with N >= 1 (the hit was
  restored from the compressed pool), at least one ``dasc restore check`` line and every one of them 0 (the
  restored slot equals the PyTorch reference of the state that was stored: kept units exact, local zero;
  ``DASC_RESTORE_CHECK``, runtime/restore_check.py), and r1 (no hit) equals dense's r1 when dense ran in the
  same call (the dummy weights' outputs barely depend on the state, so r2 is reported, not judged);
- ``dasc_w0`` (keep-all plan): the restore and check lines as above, and every output equals dense's;
  dense must have run (the exactness is the case's whole claim);
- ``dasc_wr16``: the restore and check lines, r1 == dense r1 when dense ran, and a ``dasc refreshed: N`` line
  with N >= 1;
- ``mismatch``: the server did NOT start (``start_mismatch.rc`` non-zero) AND its log holds dasc's own start-up
  refusal for a decay mismatch (:data:`REFUSAL_RE`, the wording of ``dasc_runtime.verify.check_fingerprint``).
  A server that died of anything else (an SGLang assertion, an import error) fails the case.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Optional

#: (label, port) of every case, in the script's order
CASES = (("dense", 31001), ("dasc_w16", 31002), ("dasc_w0", 31003), ("mismatch", 31004), ("dasc_wr16", 31005))
#: dasc's start-up refusal of a plan whose decays are not the served ones (runtime/verify.py check_fingerprint,
#: raised as runtime/refusal.py DascRefusal: "dasc: refusing to start: ...")
REFUSAL_RE = re.compile(r"dasc: refusing to start: decay tensors of the served weights \(sha256 [0-9a-f]+\.\.\.\) "
                        r"differ from the ones the plan was compiled from")
#: runtime/pool.py (DASC_LOG_RESTORES=1): one line per restored batch
RESTORE_RE = re.compile(r"dasc: restoring (\d+) compressed \((?:dasc-nr|local units zero-filled)\) \+ (\d+) dense checkpoint")
#: runtime/restore_check.py (DASC_RESTORE_CHECK=N): the restored slot against the PyTorch reference of the stored state
CHECK_RE = re.compile(r"dasc restore check: compressed row \d+ -> slot \d+: temporal max\|diff\| (\S+) .*conv max\|diff\| (\S+)")
#: runtime/wr_scratch.py ScratchBudget.status(), part of SGLang's batch log line
REFRESH_RE = re.compile(r"dasc refreshed: (\d+) ")
N_NEW = 16                       # max_new_tokens of runtime_smoke_client.py (ignore_eos)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def start_rc(out: Path, label: str) -> Optional[str]:
    """What the script recorded for the case's server start: '0' (answered /health), an exit code, a skip note."""
    p = out / f"start_{label}.rc"
    return p.read_text().strip() if p.exists() else None


def client_rows(out: Path, label: str) -> Optional[list]:
    p = out / f"client_{label}.json"
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text())["rows"]
    except (ValueError, KeyError, TypeError):
        return None


def _served_problems(out: Path, label: str, rows: Optional[list]) -> list[str]:
    """Why a served case is not a working server with a prefix hit (empty when it is)."""
    rc = start_rc(out, label)
    if rc != "0":
        return [f"server did not start ({'no start record' if rc is None else 'start: ' + rc})"]
    if rows is None:
        return ["server started but the client wrote no answers (client_%s.json missing or unreadable)" % label]
    bad = []
    if len(rows) != 3:
        bad.append(f"{len(rows)} answered requests, not 3")
    for r in rows:
        if len(r.get("output_ids") or []) != N_NEW:
            bad.append(f"{r.get('req', '?').split()[0]}: {len(r.get('output_ids') or [])} output tokens, not {N_NEW}")
    if len(rows) >= 2:
        c1, c2 = rows[0].get("cached_tokens"), rows[1].get("cached_tokens")
        if c1 != 0:
            bad.append(f"r1 (cold prefix) reports {c1} cached tokens, not 0")
        if not (isinstance(c2, int) and c2 > 0):
            bad.append(f"r2 (same prefix) is no prefix hit (cached tokens {c2})")
    return bad


def _restores(log: str) -> tuple[int, int, str]:
    """(compressed restores, restore lines, the first line) of a server log."""
    lines = [l for l in log.splitlines() if RESTORE_RE.search(l)]
    n = sum(int(RESTORE_RE.search(l).group(1)) for l in lines)
    return n, len(lines), (lines[0].strip() if lines else "")


def judge(out: Path, label: str, port: int, dense: Optional[list]) -> tuple[bool, list[str], list[str]]:
    """(passed, problems, evidence) of one case."""
    log = _read(out / f"server_{port}.log")
    evidence: list[str] = []
    if label == "mismatch":
        rc = start_rc(out, label)
        refusal = [l.strip() for l in log.splitlines() if REFUSAL_RE.search(l)]
        bad = []
        if rc == "0":
            bad.append("MISMATCH NOT REFUSED: the server started")
        elif rc is None:
            bad.append("no start record (the server was not run, or was still starting)")
        if not refusal and rc != "0":
            tail = [l for l in log.splitlines() if l.strip()][-3:]
            bad.append("its log has no dasc decay refusal (%s); last lines: %s" % (
                "no log" if not log else "the server died of something else or is still starting",
                " | ".join(t.strip()[-200:] for t in tail)))
        elif refusal:
            evidence.append("refusal: " + refusal[0][refusal[0].find("dasc: refusing"):][:300])
        return not bad, bad, evidence
    rows = client_rows(out, label)
    bad = _served_problems(out, label, rows)
    if rows:
        evidence.append("cached tokens " + " ".join(f"{r.get('req', '?').split()[0]}={r.get('cached_tokens')}"
                                                     f"/{r.get('prompt_tokens')}" for r in rows))
    if label == "dense" or rows is None:          # nothing more to judge (a server that did not answer failed above)
        return not bad, bad, evidence
    n_c, n_lines, first = _restores(log)
    if n_c < 1:
        bad.append(f"no compressed restore in its log ({n_lines} 'dasc: restoring' line(s), {n_c} compressed)")
    else:
        evidence.append(f"{n_c} compressed restore(s) in {n_lines} line(s): " + first[first.find("dasc:"):][:140])
    checks = [(float(m.group(1)), float(m.group(2))) for m in map(CHECK_RE.search, log.splitlines()) if m]
    if not checks:
        bad.append("no 'dasc restore check' line in its log (DASC_RESTORE_CHECK not set, or no checked restore)")
    elif any(c != (0.0, 0.0) for c in checks):
        bad.append(f"restored slots differ from the PyTorch reference of the stored states: {checks}")
    else:
        evidence.append(f"{len(checks)} restore(s) checked against the PyTorch reference: max|diff| 0")
    same = [a.get("output_ids") == b.get("output_ids") for a, b in zip(dense or [], rows or [])]
    if label == "dasc_w0":
        if not dense:
            bad.append("no dense answers in this call to compare with (dense not requested or not started)")
        elif len(same) != 3 or not all(same):
            bad.append(f"keep-all restore is not exact: outputs equal dense's per request: {same}")
        else:
            evidence.append("every output == dense's (exact restore)")
    elif rows and dense:
        if not same or not same[0]:
            bad.append("r1 (no hit) output differs from dense r1")
        else:
            evidence.append("r1 (no hit) == dense r1; r2 (restored) == dense r2: %s" % (len(same) > 1 and same[1]))
    elif rows:
        evidence.append("no dense answers in this call: r1 not compared")
    if label == "dasc_wr16":
        refreshed = [int(m.group(1)) for m in map(REFRESH_RE.search, log.splitlines()) if m]
        if not refreshed or max(refreshed) < 1:
            bad.append(f"no dasc-wr refresh in its log ('dasc refreshed' counts: {refreshed[-3:] or 'none'})")
        else:
            evidence.append(f"dasc refreshed: {max(refreshed)}")
    return not bad, bad, evidence


def verdict(out: Path, runs: list[str]) -> tuple[int, list[str]]:
    """(exit status, report lines) for the requested cases."""
    unknown = [r for r in runs if r not in dict(CASES)]
    lines = [f"unknown case(s) in DASC_SMOKE_RUNS: {unknown}"] if unknown else []
    # the reference outputs: only from a dense server of this call that started (no stale client file)
    dense = client_rows(out, "dense") if "dense" in runs and start_rc(out, "dense") == "0" else None
    judged, failed = 0, []
    for label, port in CASES:
        if label not in runs:
            continue
        ok, bad, ev = judge(out, label, port, dense)
        judged += 1
        lines.append(f"{label:<10} {'PASS' if ok else 'FAILED'}: " + "; ".join(bad + ev))
        if not ok:
            failed.append(label)
    lines.append(f"mamba2 smoke: {judged - len(failed)}/{judged} case(s) passed" +
                 (f"; FAILED: {' '.join(failed)}" if failed else "") +
                 (f"; unknown case(s): {' '.join(unknown)}" if unknown else ""))
    return (1 if failed or unknown or not judged else 0), lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__.splitlines()[0] + "\nusage: mamba2_smoke_verdict.py OUT RUNS", file=sys.stderr)
        return 2
    rc, lines = verdict(Path(argv[0]), argv[1].split())
    print("\n".join(lines))
    return rc


if __name__ == "__main__":
    sys.exit(main())
