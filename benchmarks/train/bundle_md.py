"""PROVENANCE.md of a bundle (benchmarks/train/bundle.py): how the model was trained, from what the trainer
recorded (state.json, provenance.json; read by benchmarks/train/bundle_src.py), and the bundle's files.

What each line rests on: "Data" is what the trainer recorded about its ``--data`` folder (benchmarks/train/
recipe.py ``data_description``: the folder's meta.json, else only its name); "Decays moved since init" is each
session's end state against the initialisation (cumulative, not that session's own change); "Last session
saved" is state.json's ``saved_utc`` (the trainer's clock when it saved), or for a checkpoint saved before the
trainer recorded it, state.json's file time, which a copy may have changed (the line says which).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from itertools import groupby
from pathlib import Path


def _rle(kinds: list) -> str:
    return ", ".join(f"{k} x{n}" if n > 1 else str(k) for k, n in ((k, len(list(g))) for k, g in groupby(kinds)))


def _utc(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _n(x) -> str:
    """An integer with thousands separators; anything else as it is."""
    return f"{x:,}" if isinstance(x, int) else str(x)


def _git_head() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                       text=True)
    return r.stdout.strip() or "unknown"


def _session(s: dict) -> list[str]:
    rec = ", ".join(f"{k}={v}" for k, v in (s.get("recipe") or {}).items())
    groups = "; ".join(f"{g}{' (A_log / dt_bias)' if g == 'decay' else ''}: lr x{d.get('lr_mult')}, weight decay "
                       f"{d.get('weight_decay')}, {d.get('params')} tensors"
                       for g, d in (s.get("optimizer_groups") or {}).items())
    shards = ", ".join(f"{x.get('file')} ({_n(x.get('tokens', 0))} tokens, sha256 {str(x.get('sha256'))[:12]})"
                       for x in s.get("shards") or [])
    mv = ((s.get("decays") or {}).get("movement") or {})
    moved = "; ".join(f"{k} mean |change| {v.get('mean_abs_change', 0):.4g} (max {v.get('max_abs_change', 0):.4g})"
                      for k, v in mv.items())
    saved = f"; saved {s['saved_utc']}" if "saved_utc" in s else ""
    restore = s.get("optimizer_restore") or {}
    opt = ([f"- Optimiser state: fresh AdamW ({restore['fresh']}; from_bundle.py)."] if "fresh" in restore else [])
    return [f"### Session {s.get('session')} (commit {s.get('commit', 'unknown')})", "",
            f"- Steps {s.get('start_step')} to {s.get('end_step')} ({_n(s.get('tokens', 0))} tokens), stopped by "
            f"{s.get('stopped_by')}; {s.get('device')} ({s.get('device_name')}), torch {s.get('torch')}, "
            f"transformers {s.get('transformers')}, python {s.get('python')}; micro-batch {s.get('micro_batch')}"
            f"{saved}.",
            f"- Kernels: {s.get('kernels')}.", f"- Recipe: {rec}.", f"- Optimiser groups: {groups}.", *opt,
            f"- Data shards: {shards or 'not recorded'}.",
            f"- Decays moved since init (cumulative, at this session's end): {moved or 'not recorded'}.", ""]


def text_seen_line(sessions: list[dict]) -> str | None:
    """How often the text was repeated: text-row tokens trained on (each session's tokens x its text-row share
    ``1 - recall_frac``) against the distinct tokens of the shards the sessions carried (by sha256); None when a
    session recorded no shards or no recall share. A lower bound on repetition: recall rows draw their haystacks
    from the same shards."""
    corpus: dict[str, int] = {}
    seen = 0.0
    for s in sessions:
        frac = (s.get("recipe") or {}).get("recall_frac")
        if frac is None or not s.get("shards"):
            return None
        corpus.update({str(x.get("sha256")): int(x.get("tokens", 0)) for x in s["shards"]})
        seen += int(s.get("tokens", 0)) * (1.0 - float(frac))
    total = sum(corpus.values())
    if not total:
        return None
    return (f"- Text repeated: {seen / 1e6:.1f}M tokens of text rows (each session's tokens x its text-row share) "
            f"from {total / 1e6:.1f}M distinct tokens in the shards carried: each text token seen about "
            f"{seen / total:.1f} times (more: recall rows take their haystacks from the same shards).")


def provenance_md(ck: dict, files: dict[str, int], sha: dict[str, str]) -> str:
    """PROVENANCE.md of a bundle: ``ck`` from benchmarks/train/bundle_src.py ``read_checkpoint`` (+ ``now``:
    Unix seconds); ``files``: name -> bytes; ``sha``: weight file name -> sha256.

    Raises:
        TypeError, ValueError, AttributeError: a record in ``ck`` not shaped as the trainer writes it
            (bundle.py turns them into one line naming state.json).
    """
    st, prov, cfg, tensors = ck["state"], ck["prov"], ck["config"], ck["tensors"]
    ses, fam, params = st["sessions"], st["family"], st["sessions"][-1]["params"]
    tr, data, init = prov.get("training") or {}, prov.get("data") or {}, prov.get("init") or {}
    layers = cfg.get("hybrid_override_pattern") or _rle(cfg.get("layer_types") or [])
    by_dtype: dict[str, list[int]] = {}
    for t in tensors.values():
        c = by_dtype.setdefault(str(t.dtype).removeprefix("torch."), [0, 0])
        c[0], c[1] = c[0] + 1, c[1] + t.numel()
    dtypes = "; ".join(f"{d}: {n} tensors, {p:,} parameters" for d, (n, p) in sorted(by_dtype.items()))
    decay_dtypes = sorted({str(t.dtype).removeprefix("torch.") for k, t in tensors.items()
                           if k.rsplit(".", 1)[-1] in ("A_log", "dt_bias")})
    commits = list(dict.fromkeys(str(s.get("commit", "unknown")) for s in ses))
    saved = ("state.json's saved_utc" if ck["saved_from"] == "saved_utc" else
             "state.json's file time: this checkpoint predates saved_utc, and a copy may have changed the time")
    L = [f"# Trained reference: {fam} hybrid, {params:,} parameters (trained here by dasc, not a released model)", "",
         f"- Family / architecture: {fam}; {prov.get('model', cfg['model_type'])}; model_type `{cfg['model_type']}`, "
         f"{', '.join(map(str, cfg.get('architectures') or []))}; hidden {cfg.get('hidden_size')}, "
         f"vocab {cfg.get('vocab_size')}; "
         f"layers: {layers}.",
         f"- Parameters: {params:,}. Trained: {st['tokens']:,} tokens in {st['step']:,} steps over {len(ses)} "
         f"session(s) (planned {st.get('total_steps', '?')} steps).",
         f"- Data: {data.get('text', '?')}. Recall rows (latest session): {data.get('recall', '?')}. "
         f"Held out: {data.get('held_out', '?')}.",
         *([line] if (line := text_seen_line(ses)) else []),
         f"- Tokenizer: {prov.get('tokenizer', '?')} ({prov.get('vocab_size', cfg.get('vocab_size'))} ids; "
         f"tokenizer.json here).",
         f"- Seeds: model and batches seed {st['seed']}; decays initialised "
         f"`{init.get('decay_init', st.get('decay_init'))}`; the initial model rebuilds with "
         f"`{init.get('rebuild', '?')}` (fp32 sha256 {str(st.get('init_sha256', '?'))[:16]}..., "
         f"on {json.dumps(st.get('init_versions'))}).",
         f"- Optimiser: {tr.get('optimizer', '?')}. Schedule: {tr.get('schedule', '?')}. Precision: "
         f"{tr.get('precision', '?')}. Between sessions: {tr.get('between_sessions', '?')}"
         + (", except where a session below started a fresh AdamW." if any(
             "fresh" in (x.get("optimizer_restore") or {}) for x in ses) else "."),
         f"- Commit(s): {', '.join(commits)} (per session below). Last session saved {_utc(ck['saved'])} "
         f"({saved}); bundled {_utc(ck['now'])} by benchmarks/train/bundle.py at {_git_head()}.",
         f"- Weights: stored as the trainer saved them, tensor for tensor (nothing converted): {dtypes}; "
         f"A_log / dt_bias {', '.join(decay_dtypes) or 'absent'}. Training keeps fp32 master weights and saves "
         f"them rounded to bf16 (A_log / dt_bias fp32); the fp32 masters are not bundled" + (
             " (SRC's train_state/exact.pt holds them, with the Adam moments)." if ck["exact"] else
             " (and were not saved: a resume continues from these weights)."),
         "- Load: `AutoModelForCausalLM.from_pretrained(DIR)`, `dasc compile DIR --wmax W`, `dasc eval DIR --plan P`. "
         "train_log.json: state.json, provenance.json and every logged interval.", "", "## Sessions", ""]
    for s in ses:
        L += _session(s)
    L += ["## Files", ""] + [f"- {n}: {b:,} bytes" + (f", sha256 {sha[n]}" if n in sha else "")
                             for n, b in sorted(files.items())]
    return "\n".join(L) + "\n"
