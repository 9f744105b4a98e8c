"""Read and check the checkpoint (SRC) that benchmarks/train/bundle.py bundles; nothing here writes.

:func:`read_checkpoint` gives everything a bundle holds, or raises :class:`BundleError` (one line naming the
path and what was expected) for a SRC that is not what benchmarks/train/train.py saves: a missing or
unreadable file, an index that is not a weight map of names in SRC, a state.json or provenance.json that is
not a JSON object as the trainer writes it, a config whose ``model_type`` is not the recorded family's, or
weights that do not hold the parameter count state.json records.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
TRAINER = "a checkpoint directory written by benchmarks/train/train.py"


class BundleError(ValueError):
    """Bad input or a limit that cannot be met: one line naming the path and what was expected."""


def read_json(path: Path, what: str, made_by: str = TRAINER, error: type[ValueError] = BundleError):
    """The JSON in ``path``. Raises ``error``: one line naming the file, ``what`` was expected there and, for a
    missing file, the folder it belongs in (``made_by``)."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise error(f"{path}: missing; expected {what} ({made_by})") from None
    except (OSError, ValueError) as exc:
        raise error(f"{path}: not readable JSON ({type(exc).__name__}: {exc}); expected {what}") from None


def _weight_files(src: Path) -> list[Path]:
    """SRC's weight files: those its index names (each a file inside SRC), else its ``model*.safetensors``."""
    if not (src / INDEX).is_file():
        return sorted(src.glob("model*.safetensors"))
    index = read_json(src / INDEX, "a Hugging Face index with a weight_map")
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if (not isinstance(wm, dict) or not wm
            or not all(isinstance(k, str) and isinstance(v, str) and v for k, v in wm.items())):
        raise BundleError(f"{src / INDEX}: expected a JSON object whose 'weight_map' maps each tensor name to a "
                          f"shard file name (non-empty, all strings)")
    root, files = src.resolve(), set()
    for v in wm.values():
        try:
            f = (src / v).resolve()
        except (OSError, ValueError):          # a NUL in the name, a symlink loop
            f = root
        if f == root or not f.is_relative_to(root):
            raise BundleError(f"{src / INDEX}: weight_map names '{v}', outside {src}; expected shard files in SRC")
        files.add(src / v)
    return sorted(files)


def read_tensors(src: Path) -> tuple[dict, dict]:
    """``({name: tensor as stored}, merged safetensors metadata)`` of SRC's weights (index or model*.safetensors).

    Raises:
        BundleError: no weights, a bad index, a shard the index names is missing, a damaged file, a tensor in two
            files.
    """
    from safetensors import SafetensorError, safe_open

    files = _weight_files(src)
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


def _saved_utc(st: dict, path: Path) -> float | None:
    """Unix seconds of state.json's ``saved_utc`` (ISO 8601, what the trainer records when it saves), or None
    for a checkpoint saved before the trainer recorded it."""
    if "saved_utc" not in st:
        return None
    try:
        t = dt.datetime.fromisoformat(st["saved_utc"])
        if t.utcoffset() is None:
            raise ValueError("no time zone")
        return t.timestamp()
    except (TypeError, ValueError):
        raise BundleError(f"{path}: saved_utc {st['saved_utc']!r}; expected an ISO 8601 time with its UTC offset, as "
                          f"the trainer writes it") from None


def _init_decays(src: Path) -> dict[str, list[float]] | None:
    """The initial ``A_log`` / ``dt_bias`` training recorded (``train_state/init_decays.safetensors``, keys
    ``live:<parameter name>``), as {key: flat list of floats} (fp32 values, exact in JSON), or None when absent.

    Raises:
        BundleError: the file exists but is not readable safetensors.
    """
    path = src / "train_state" / "init_decays.safetensors"
    if not path.is_file():
        return None
    from safetensors.torch import load_file
    try:
        return {k: t.float().flatten().tolist() for k, t in sorted(load_file(str(path)).items())}
    except Exception as exc:  # safetensors raises its own error types
        raise BundleError(f"{path}: not readable safetensors ({type(exc).__name__}: {exc}); expected the initial "
                          f"decays as the trainer saved them") from None


def read_checkpoint(src: Path) -> dict:
    """Read and check everything a bundle holds from SRC (a trainer checkpoint directory); nothing is written.

    Returns:
        dict with ``config``, ``state`` (state.json), ``prov`` (provenance.json), ``log`` (log.jsonl records),
        ``tensors``, ``meta`` (safetensors metadata), ``tokenizer`` (paths), ``src``, ``exact`` (exact.pt present),
        ``saved`` (Unix seconds the last session saved: state.json's ``saved_utc``, else its file time),
        ``saved_from`` (which of the two) and ``init_decays`` (:func:`_init_decays`).
    Raises:
        BundleError: SRC is not such a directory (module docstring says what is checked).
    """
    from benchmarks.train.models import FAMILIES, MODEL_TYPES

    src = Path(src)
    if not src.is_dir():
        raise BundleError(f"{src}: not a directory; expected {TRAINER}")
    cfg = read_json(src / "config.json", "the model's config")
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model_type"), str):
        raise BundleError(f"{src / 'config.json'}: expected a transformers config (a JSON object with model_type)")
    sp = src / "train_state" / "state.json"
    st = read_json(sp, "the training state")
    sessions = st.get("sessions") if isinstance(st, dict) else None
    if (not isinstance(sessions, list) or not sessions or not all(isinstance(s, dict) for s in sessions)
            or st.get("family") not in FAMILIES
            or not all(isinstance(st.get(k), int) for k in ("step", "tokens", "seed"))):
        raise BundleError(f"{sp}: expected family (one of {', '.join(FAMILIES)}), "
                          f"step, tokens, seed and a non-empty list of sessions")
    if cfg["model_type"] != MODEL_TYPES[st["family"]]:
        raise BundleError(f"{src / 'config.json'}: model_type {cfg['model_type']!r}, but {sp} records family "
                          f"{st['family']} (model_type {MODEL_TYPES[st['family']]!r}); expected one checkpoint's files")
    saved = _saved_utc(st, sp)
    prov = read_json(src / "provenance.json", "the training provenance")
    if not isinstance(prov, dict):
        raise BundleError(f"{src / 'provenance.json'}: a JSON {type(prov).__name__}; expected a JSON object "
                          f"({TRAINER})")
    log, log_path, i = [], src / "train_state" / "log.jsonl", 0
    try:
        for i, line in enumerate(log_path.read_text().splitlines(), 1):
            if line.strip():
                log.append(json.loads(line))
    except FileNotFoundError:
        raise BundleError(f"{log_path}: missing; expected the training log ({TRAINER})") from None
    except ValueError as exc:
        raise BundleError(f"{log_path} line {i}: not JSON ({exc}); expected one JSON record a line") from None
    except OSError as exc:
        raise BundleError(f"{log_path}: not readable ({exc}); expected the training log") from None
    tok = [src / n for n in TOKENIZER_FILES if (src / n).is_file()]
    if not {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in tok}:
        raise BundleError(f"{src}: expected tokenizer.json and tokenizer_config.json beside the weights")
    tensors, meta = read_tensors(src)
    have, want = sum(t.numel() for t in tensors.values()), sessions[-1].get("params")
    if have != want:
        raise BundleError(f"{src}: the weights hold {have:,} parameters, state.json's last session records {want}; "
                          f"expected the checkpoint that state.json describes")
    return {"src": src, "config": cfg, "state": st, "prov": prov, "log": log, "tensors": tensors, "meta": meta,
            "init_decays": _init_decays(src),
            "tokenizer": tok, "exact": (src / "train_state" / "exact.pt").is_file(),
            "saved": sp.stat().st_mtime if saved is None else saved,
            "saved_from": "mtime" if saved is None else "saved_utc"}
