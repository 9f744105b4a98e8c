"""Bundle a trained reference checkpoint for git: what a user of the model needs, in files of at most 16 MiB.

    python -m benchmarks.train.bundle SRC --out plans/reference/NAME [--max-shard-mib 16] [--replace]

SRC is a checkpoint directory as benchmarks/train/train.py saves it (format: benchmarks/train/models.py):
``config.json``, ``model*.safetensors`` (with ``model.safetensors.index.json`` when sharded), ``tokenizer.json``,
``tokenizer_config.json``, ``provenance.json`` and ``train_state/`` (``state.json``, ``log.jsonl``, the
optimiser state, the initial decays, ``exact.pt`` with ``--exact-state``). OUT gets:

- ``config.json``, the tokenizer files: copied unchanged;
- the weights, tensor for tensor as SRC stores them (the trainer saves its fp32 master weights rounded to
  bf16, ``A_log`` / ``dt_bias`` fp32; nothing is converted): ``model.safetensors`` when it fits in one file
  of at most ``--max-shard-mib`` MiB, else ``model-0000k-of-0000n.safetensors`` shards and
  ``model.safetensors.index.json`` (Hugging Face layout: ``metadata.total_size`` in bytes of tensor data,
  ``metadata.total_parameters``, ``weight_map``), which transformers, ``dasc compile`` and ``dasc eval`` read;
- ``train_log.json``: state.json (sessions, recipes, optimiser groups, tokens) + ``provenance`` (provenance.json
  less its copy of the sessions) + ``log`` (every record of train_state/log.jsonl, in order);
- ``PROVENANCE.md``, generated from those (module :func:`provenance_md`).

Left out: the optimiser moments, the initial decays and ``exact.pt`` (resume state, not the model).
Bad input is refused with one line naming the path and what was expected (:class:`BundleError`; the CLI
prints ``error: ...`` and exits 2); OUT is assembled in a hidden sibling folder and renamed into place,
so a refusal or failure leaves nothing half-written.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from itertools import groupby
from pathlib import Path

MIB = 2 ** 20
MAX_FILE_BYTES = 16 * MIB             # the largest file a bundle holds (issue 20)
INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
TRAINER = "a checkpoint directory written by benchmarks/train/train.py"


class BundleError(ValueError):
    """Bad input or a limit that cannot be met: one line naming the path and what was expected."""


def _json(path: Path, what: str):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise BundleError(f"{path}: missing; expected {what} ({TRAINER})") from None
    except (OSError, ValueError) as exc:
        raise BundleError(f"{path}: not readable JSON ({type(exc).__name__}: {exc}); expected {what}") from None


def _read_tensors(src: Path) -> tuple[dict, dict]:
    """``({name: tensor as stored}, merged safetensors metadata)`` of SRC's weights (index or model*.safetensors).

    Raises:
        BundleError: no weights, a shard the index names is missing, a damaged file, a tensor in two files.
    """
    from safetensors import SafetensorError, safe_open

    if (src / INDEX).is_file():
        wm = _json(src / INDEX, "a Hugging Face index with a weight_map").get("weight_map")
        if not isinstance(wm, dict) or not wm:
            raise BundleError(f"{src / INDEX}: expected a non-empty 'weight_map' of tensor name -> shard file")
        files = sorted({src / f for f in wm.values()})
    else:
        files = sorted(src.glob("model*.safetensors"))
    if not files:
        raise BundleError(f"{src}: no model*.safetensors weights; expected {TRAINER}")
    tensors, meta = {}, {}
    for f in files:
        try:
            with safe_open(str(f), "pt") as fh:
                meta.update(fh.metadata() or {})
                for k in fh.keys():
                    if k in tensors:
                        raise BundleError(f"{f}: tensor '{k}' is also in another weight file; expected each once")
                    tensors[k] = fh.get_tensor(k)
        except (OSError, SafetensorError) as exc:
            raise BundleError(f"{f}: not a readable safetensors file ({exc}); expected {TRAINER}") from None
    return dict(sorted(tensors.items())), meta | {"format": "pt"}


def read_checkpoint(src: Path) -> dict:
    """Read and check everything a bundle holds from SRC (a trainer checkpoint directory); nothing is written.

    Returns:
        dict with ``config``, ``state`` (state.json), ``prov`` (provenance.json), ``log`` (log.jsonl records),
        ``tensors``, ``meta`` (safetensors metadata), ``tokenizer`` (paths), ``src``, ``exact`` (exact.pt present).
    Raises:
        BundleError: SRC is not such a directory, a file is missing or unreadable, or the weights do not hold
            the parameter count state.json records.
    """
    from benchmarks.train.models import FAMILIES

    src = Path(src)
    if not src.is_dir():
        raise BundleError(f"{src}: not a directory; expected {TRAINER}")
    cfg = _json(src / "config.json", "the model's config")
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise BundleError(f"{src / 'config.json'}: expected a transformers config (a JSON object with model_type)")
    st = _json(src / "train_state" / "state.json", "the training state")
    sessions = st.get("sessions") if isinstance(st, dict) else None
    if (not isinstance(sessions, list) or not sessions or not all(isinstance(s, dict) for s in sessions)
            or st.get("family") not in FAMILIES
            or not all(isinstance(st.get(k), int) for k in ("step", "tokens", "seed"))):
        raise BundleError(f"{src / 'train_state' / 'state.json'}: expected family (one of {', '.join(FAMILIES)}), "
                          f"step, tokens, seed and a non-empty list of sessions")
    prov = _json(src / "provenance.json", "the training provenance")
    log, log_path, i = [], src / "train_state" / "log.jsonl", 0
    try:
        for i, line in enumerate(log_path.read_text().splitlines(), 1):
            if line.strip():
                log.append(json.loads(line))
    except FileNotFoundError:
        raise BundleError(f"{log_path}: missing; expected the training log ({TRAINER})") from None
    except ValueError as exc:
        raise BundleError(f"{log_path} line {i}: not JSON ({exc}); expected one JSON record a line") from None
    tok = [src / n for n in TOKENIZER_FILES if (src / n).is_file()]
    if not {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in tok}:
        raise BundleError(f"{src}: expected tokenizer.json and tokenizer_config.json beside the weights")
    tensors, meta = _read_tensors(src)
    have, want = sum(t.numel() for t in tensors.values()), sessions[-1].get("params")
    if have != want:
        raise BundleError(f"{src}: the weights hold {have:,} parameters, state.json's last session records {want}; "
                          f"expected the checkpoint that state.json describes")
    return {"src": src, "config": cfg, "state": st, "prov": prov if isinstance(prov, dict) else {}, "log": log,
            "tensors": tensors, "meta": meta, "tokenizer": tok, "exact": (src / "train_state" / "exact.pt").is_file()}


def _entry_bytes(name: str, t) -> int:
    """Upper bound of one tensor's bytes in a safetensors file: data + its header entry (+ separator)."""
    entry = {name: {"dtype": "F8_E4M3XX", "shape": list(t.shape), "data_offsets": [2 ** 48, 2 ** 48]}}
    return t.numel() * t.element_size() + len(json.dumps(entry, separators=(",", ":"))) + 1


def plan_shards(tensors: dict, meta: dict, max_bytes: int) -> list[list[str]]:
    """Tensor names per file, in order, each file at most ``max_bytes`` bytes (header bound included).

    Raises:
        BundleError: one tensor alone does not fit in ``max_bytes``.
    """
    base = 8 + 8 + 2 + len(json.dumps({"__metadata__": meta}, separators=(",", ":")))   # length, padding, braces
    shards, cur, size = [], [], base
    for name, t in tensors.items():
        need = _entry_bytes(name, t)
        if base + need > max_bytes:
            raise BundleError(f"tensor '{name}' needs {base + need:,} bytes in a file, over the {max_bytes:,} bytes a "
                              f"file may hold (--max-shard-mib {max_bytes / MIB:.4g}); expected tensors that fit")
        if cur and size + need > max_bytes:
            shards.append(cur)
            cur, size = [], base
        cur.append(name)
        size += need
    return shards + [cur]


def _rle(kinds: list) -> str:
    return ", ".join(f"{k} x{n}" if n > 1 else str(k) for k, n in ((k, len(list(g))) for k, g in groupby(kinds)))


def _utc(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _git_head() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                       text=True)
    return r.stdout.strip() or "unknown"


def provenance_md(ck: dict, files: dict[str, int], sha: dict[str, str]) -> str:
    """PROVENANCE.md of a bundle: ``ck`` from :func:`read_checkpoint` (+ ``state_mtime``, ``now``: Unix
    seconds); ``files``: name -> bytes; ``sha``: weight file name -> sha256."""
    st, prov, cfg, tensors = ck["state"], ck["prov"], ck["config"], ck["tensors"]
    ses, fam, params = st["sessions"], st["family"], st["sessions"][-1]["params"]
    tr, data, init = prov.get("training", {}), prov.get("data", {}), prov.get("init", {})
    layers = cfg.get("hybrid_override_pattern") or _rle(cfg.get("layer_types") or [])
    by_dtype: dict[str, list[int]] = {}
    for t in tensors.values():
        c = by_dtype.setdefault(str(t.dtype).removeprefix("torch."), [0, 0])
        c[0], c[1] = c[0] + 1, c[1] + t.numel()
    dtypes = "; ".join(f"{d}: {n} tensors, {p:,} parameters" for d, (n, p) in sorted(by_dtype.items()))
    decay_dtypes = sorted({str(t.dtype).removeprefix("torch.") for k, t in tensors.items()
                           if k.rsplit(".", 1)[-1] in ("A_log", "dt_bias")})
    commits = list(dict.fromkeys(s.get("commit", "unknown") for s in ses))
    L = [f"# Trained reference: {fam} hybrid, {params:,} parameters (trained here by dasc, not a released model)", "",
         f"- Family / architecture: {fam}; {prov.get('model', cfg['model_type'])}; model_type `{cfg['model_type']}`, "
         f"{', '.join(cfg.get('architectures') or [])}; hidden {cfg.get('hidden_size')}, "
         f"vocab {cfg.get('vocab_size')}; "
         f"layers: {layers}.",
         f"- Parameters: {params:,}. Trained: {st['tokens']:,} tokens in {st['step']:,} steps over {len(ses)} "
         f"session(s) (planned {st.get('total_steps', '?')} steps).",
         f"- Data: {data.get('text', '?')}. Recall rows (latest session): {data.get('recall', '?')}. "
         f"Held out: {data.get('held_out', '?')}.",
         f"- Tokenizer: {prov.get('tokenizer', '?')} ({prov.get('vocab_size', cfg.get('vocab_size'))} ids; "
         f"tokenizer.json here).",
         f"- Seeds: model and batches seed {st['seed']}; decays initialised "
         f"`{init.get('decay_init', st.get('decay_init'))}`; the initial model rebuilds with "
         f"`{init.get('rebuild', '?')}` (fp32 sha256 {st.get('init_sha256', '?')[:16]}..., "
         f"on {json.dumps(st.get('init_versions'))}).",
         f"- Optimiser: {tr.get('optimizer', '?')}. Schedule: {tr.get('schedule', '?')}. Precision: "
         f"{tr.get('precision', '?')}. Between sessions: {tr.get('between_sessions', '?')}.",
         f"- Commit(s): {', '.join(commits)} (per session below). Last session saved {_utc(ck['state_mtime'])} "
         f"(state.json's time); bundled {_utc(ck['now'])} by benchmarks/train/bundle.py at {_git_head()}.",
         f"- Weights: stored as the trainer saved them, tensor for tensor (nothing converted): {dtypes}; "
         f"A_log / dt_bias {', '.join(decay_dtypes) or 'absent'}. Training keeps fp32 master weights and saves "
         f"them rounded to bf16 (A_log / dt_bias fp32); the fp32 masters are not bundled" + (
             " (SRC's train_state/exact.pt holds them, with the Adam moments)." if ck["exact"] else
             " (and were not saved: a resume continues from these weights)."),
         "- Load: `AutoModelForCausalLM.from_pretrained(DIR)`, `dasc compile DIR --wmax W`, `dasc eval DIR --plan P`. "
         "train_log.json: state.json, provenance.json and every logged interval.", "", "## Sessions", ""]
    for s in ses:
        rec = ", ".join(f"{k}={v}" for k, v in (s.get("recipe") or {}).items())
        groups = "; ".join(f"{g}{' (A_log / dt_bias)' if g == 'decay' else ''}: lr x{d.get('lr_mult')}, weight decay "
                           f"{d.get('weight_decay')}, {d.get('params')} tensors"
                           for g, d in (s.get("optimizer_groups") or {}).items())
        shards = ", ".join(f"{x.get('file')} ({x.get('tokens', 0):,} tokens, sha256 {str(x.get('sha256'))[:12]})"
                           for x in s.get("shards") or [])
        mv = ((s.get("decays") or {}).get("movement") or {})
        moved = "; ".join(f"{k} mean |change| {v.get('mean_abs_change', 0):.4g} (max {v.get('max_abs_change', 0):.4g})"
                          for k, v in mv.items())
        L += [f"### Session {s.get('session')} (commit {s.get('commit', 'unknown')})", "",
              f"- Steps {s.get('start_step')} to {s.get('end_step')} ({s.get('tokens', 0):,} tokens), stopped by "
              f"{s.get('stopped_by')}; {s.get('device')} ({s.get('device_name')}), torch {s.get('torch')}, "
              f"transformers {s.get('transformers')}, python {s.get('python')}; micro-batch {s.get('micro_batch')}.",
              f"- Kernels: {s.get('kernels')}.", f"- Recipe: {rec}.", f"- Optimiser groups: {groups}.",
              f"- Data shards: {shards or 'not recorded'}.", f"- Decays moved: {moved or 'not recorded'}.", ""]
    L += ["## Files", ""] + [f"- {n}: {b:,} bytes" + (f", sha256 {sha[n]}" if n in sha else "")
                             for n, b in sorted(files.items())]
    return "\n".join(L) + "\n"


def bundle(src: Path, out: Path, max_bytes: int = MAX_FILE_BYTES, replace: bool = False) -> dict[str, int]:
    """Write the bundle of checkpoint ``src`` at ``out`` (module docstring); returns {file name: bytes}.

    Args:
        max_bytes: the most bytes any file of the bundle may hold (default 16 MiB).
        replace: replace an existing ``out`` (atomically) instead of refusing.
    Raises:
        BundleError: bad ``src`` (:func:`read_checkpoint`), ``out`` exists (without ``replace``) or is/holds
            ``src``, or a tensor / file over ``max_bytes``; nothing is written then.
    """
    from safetensors.torch import save_file

    src, out = Path(src), Path(out)
    if out.exists() and not replace:
        raise BundleError(f"--out {out}: already exists; expected a new folder (or give --replace)")
    if out.resolve() == src.resolve() or src.resolve().is_relative_to(out.resolve()):
        raise BundleError(f"--out {out}: is or holds SRC {src}; expected a folder outside the checkpoint")
    ck = read_checkpoint(src) | {"state_mtime": (src / "train_state" / "state.json").stat().st_mtime,
                                 "now": dt.datetime.now(dt.timezone.utc).timestamp()}
    plan = plan_shards(ck["tensors"], ck["meta"], max_bytes)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        names = (["model.safetensors"] if len(plan) == 1 else
                 [f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors" for i in range(len(plan))])
        for name, keys in zip(names, plan):
            save_file({k: ck["tensors"][k].contiguous() for k in keys}, str(tmp / name), metadata=ck["meta"])
        if len(plan) > 1:
            ts = ck["tensors"]
            index = {"metadata": {"total_parameters": sum(t.numel() for t in ts.values()),
                                  "total_size": sum(t.numel() * t.element_size() for t in ts.values())},
                     "weight_map": {k: n for n, keys in zip(names, plan) for k in sorted(keys)}}
            (tmp / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        shutil.copy2(src / "config.json", tmp / "config.json")
        for p in ck["tokenizer"]:
            shutil.copy2(p, tmp / p.name)
        prov = {k: v for k, v in ck["prov"].items() if k != "sessions"}
        (tmp / "train_log.json").write_text(json.dumps(ck["state"] | {"provenance": prov, "log": ck["log"]},
                                                       indent=1) + "\n")
        sha = {n: hashlib.sha256((tmp / n).read_bytes()).hexdigest() for n in names}
        files = {p.name: p.stat().st_size for p in tmp.iterdir()}
        (tmp / "PROVENANCE.md").write_text(provenance_md(ck, files, sha))
        files["PROVENANCE.md"] = (tmp / "PROVENANCE.md").stat().st_size
        big = [f"{n} ({b:,} bytes)" for n, b in files.items() if b > max_bytes]
        if big:
            raise BundleError(f"{src}: the bundle's {', '.join(big)} would be over the {max_bytes:,} bytes a file may "
                              f"hold (--max-shard-mib {max_bytes / MIB:.4g}); nothing was written")
        for p in [tmp, *tmp.iterdir()]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
        return files
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="checkpoint directory written by benchmarks/train/train.py")
    ap.add_argument("--out", type=Path, required=True, help="the bundle folder to write, e.g. plans/reference/NAME")
    ap.add_argument("--max-shard-mib", type=float, default=MAX_FILE_BYTES / MIB, help="largest file, MiB (16)")
    ap.add_argument("--replace", action="store_true", help="replace an existing --out")
    a = ap.parse_args(argv)
    try:
        if not a.max_shard_mib > 0:
            raise BundleError(f"--max-shard-mib {a.max_shard_mib}: expected a positive size in MiB")
        files = bundle(a.src, a.out, int(a.max_shard_mib * MIB), a.replace)
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"bundled {a.src} -> {a.out}: {len(files)} files, {sum(files.values()) / MIB:.2f} MiB "
          f"(largest {max(files.values()) / MIB:.2f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
