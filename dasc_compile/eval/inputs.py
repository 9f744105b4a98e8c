"""Checks of ``dasc eval``'s options that need no model (lengths, arms, the device, the model's context), and the
prompt set the options name (:func:`make_prompts`).

Each check raises one :class:`~dasc_compile.errors.DascInputError` line naming the flag and what was expected,
before any weights load (:mod:`dasc_compile.eval.run` calls them first).
"""

from __future__ import annotations

from pathlib import Path

from dasc_compile.errors import DascInputError
from dasc_compile.eval.prompts import from_jsonl, from_sharegpt
from dasc_compile.eval.retrieval import builtin_retrieval

#: Built-in retrieval prompts drawn when neither ``--prompts`` nor ``--sharegpt`` is given.
DEFAULT_RETRIEVAL = 10
#: ``--suffix-len``, ``--gen-tokens``, ``--seed`` where they act and are not given (the library takes None for
#: "not given": a value given where it acts on no prompt is refused, :func:`refuse_idle_lengths`).
DEFAULT_SUFFIX_LEN, DEFAULT_GEN_TOKENS, DEFAULT_SEED = 64, 16, 0


def check_common(prefix_len: int, suffix_len: int, gen_tokens: int) -> None:
    """Refuse lengths no prompt can meet: ``--prefix-len`` n_p >= 1, ``--suffix-len`` >= 2 scored tokens,
    ``--gen-tokens`` k >= 1 (tokens).

    Raises:
        DascInputError: naming the flag and its least value.
    """
    if prefix_len < 1:
        raise DascInputError(f"--prefix-len {prefix_len}: must be at least 1 token")
    if suffix_len < 2:
        raise DascInputError(f"--suffix-len {suffix_len}: must be at least 2 tokens")
    if gen_tokens < 1:
        raise DascInputError(f"--gen-tokens {gen_tokens}: must be at least 1")


def refuse_idle_lengths(prompts: list, suffix_len: int | None, gen_tokens: int | None) -> None:
    """Refuse ``--suffix-len`` / ``--gen-tokens`` given (not None) where they act on none of ``prompts``:
    ``--suffix-len`` cuts only prompts cut from a text (kind ``text``: ``--sharegpt``, ``{"text"}`` lines; a
    prompt given as prefix and suffix, and a retrieval prompt, is scored on its whole suffix), and ``--gen-tokens``
    (k) acts only on prompts without an answer (one with an answer is scored on the answer's tokens).

    Raises:
        DascInputError: naming the flag and the prompts it would act on.
    """
    if suffix_len is not None and not any(p.kind == "text" for p in prompts):
        raise DascInputError(f"--suffix-len {suffix_len} acts only on prompts cut from a text (ShareGPT conversations, "
                             f"'text' lines of a prompts file) and this run has none: a retrieval prompt or one given "
                             f"as 'prefix' and 'suffix' is scored on its whole suffix; drop --suffix-len")
    if gen_tokens is not None and all(p.answer is not None for p in prompts):
        raise DascInputError(f"--gen-tokens {gen_tokens} acts only on prompts without an answer (ShareGPT "
                             f"conversations, prompts-file lines without 'answer') and this run has none: each of its "
                             f"prompts is scored on its answer's tokens; drop --gen-tokens")


def parse_arms(arms: str) -> tuple[str, ...]:
    """The arms of ``--arms`` (comma-separated, :data:`dasc_compile.eval.arms.ARMS`), in the order given.

    Raises:
        DascInputError: no arm, an unknown one, an empty or repeated name, or ``untrained`` alone (it runs the other arms on the initial model).
    """
    from dasc_compile.eval.arms import ARMS

    words = [a.strip() for a in arms.split(",")]
    got = tuple(a for a in words if a)
    bad = [a for a in got if a not in ARMS]
    if not got:
        raise DascInputError(f"--arms {arms!r}: names no arm; choose from {','.join(ARMS)}")
    if bad:
        raise DascInputError(f"--arms {arms!r}: unknown arm(s) {bad}; choose from {','.join(ARMS)}")
    if len(got) < len(words):
        raise DascInputError(f"--arms {arms!r}: an empty name between commas; list arms as dense,nr,random")
    twice = sorted({a for a in got if got.count(a) > 1})
    if twice:
        raise DascInputError(f"--arms {arms!r}: {', '.join(twice)} named more than once; give each arm once")
    if set(got) == {"untrained"}:
        raise DascInputError(f"--arms {arms!r}: the untrained control runs the other arms on the initial model; "
                             f"give at least one of dense,nr,wr,random beside it")
    return got


def check_device(device: str) -> None:
    """Refuse a ``--device`` torch cannot name or run on: a malformed name, ``meta`` (tensors without data:
    no metric can be read), or CUDA / another accelerator (mps, xpu, ...) this machine or torch build does not have.

    Raises:
        DascInputError: naming ``--device`` and what was expected.
    """
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise DascInputError(f"--device {device!r}: not a torch device ({str(exc).splitlines()[0]}); give e.g. cpu, "
                             f"cuda or cuda:0") from None
    if dev.type == "meta":
        raise DascInputError(f"--device {device}: the meta device holds no data, so nothing can be measured; give "
                             f"cpu or cuda")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DascInputError(f"--device {device}: this machine has no CUDA device torch can use; give --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DascInputError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s) "
                                 f"(0-{torch.cuda.device_count() - 1})")
    elif dev.type != "cpu":                 # mps, xpu, ...: usable only where this torch build and machine have one
        try:
            torch.empty(1, device=dev)
        except Exception as exc:            # RuntimeError (not compiled in), AssertionError (xpu), ...
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0].split(". ")[0][:160]
            raise DascInputError(f"--device {device}: torch cannot use this device here ({first}); give cpu or "
                                 f"cuda") from None


_CONTEXT_KEYS = ("max_position_embeddings", "model_max_length", "max_sequence_length", "seq_length", "n_positions")
_NESTED = ("text_config", "language_config", "llm_config", "text_model")


def context_limit(cfg: dict) -> tuple[int, str] | None:
    """The model's context length and the config field it came from (``text_config.max_position_embeddings``),
    looked up in the language-model part first (nested configs), then at the top; None when absent."""
    for nest in _NESTED:
        sub = cfg.get(nest)
        if isinstance(sub, dict):
            for key in _CONTEXT_KEYS:
                if isinstance(sub.get(key), int) and not isinstance(sub.get(key), bool):
                    return sub[key], f"{nest}.{key}"
    for key in _CONTEXT_KEYS:
        if isinstance(cfg.get(key), int) and not isinstance(cfg.get(key), bool):
            return cfg[key], key
    return None


def check_context(model: Path, tokens: int, what: str) -> None:
    """Refuse a prompt longer than the model's context (:func:`context_limit`) before any weights load:
    such a run would take minutes and measure a model outside the positions it was built for."""
    from dasc_compile.eval.models import _read_config

    found = context_limit(_read_config(model))
    if found is not None and tokens > found[0]:
        raise DascInputError(f"{what} = {tokens} tokens is longer than the model's context: {found[1]} "
                             f"{found[0]} ({model / 'config.json'}); give a shorter --prefix-len")


def make_prompts(tok, prompts_file, sharegpt, sharegpt_offset, retrieval, prefix_len, suffix_len=None, seed=None):
    """The prompts (text and retrieval interleaved) and a line naming their sources. ``suffix_len`` / ``seed``:
    None when not given (:data:`DEFAULT_SUFFIX_LEN`, :data:`DEFAULT_SEED`). The caller
    warns of prefixes cut to ``prefix_len`` (:func:`dasc_compile.eval.prompts.prefix_cut_note`) once its own checks have passed.

    Raises:
        DascInputError: both ``--prompts`` and ``--sharegpt``; a negative count; ``seed`` given while no
            built-in retrieval prompt is drawn (it seeds only those); no prompts; what the sources refuse.
    """
    if prompts_file is not None and sharegpt is not None:
        raise DascInputError("--prompts and --sharegpt are alternatives; give one of them")
    # the built-in retrieval prompts are the default source only: with --prompts/--sharegpt they join
    # the user's prompts only when --retrieval N is given explicitly
    n_ret = retrieval if retrieval is not None else (
        0 if prompts_file is not None or sharegpt is not None else DEFAULT_RETRIEVAL)
    if n_ret < 0:
        raise DascInputError(f"--retrieval {n_ret}: must be 0 or more")
    if seed is not None and not n_ret:
        raise DascInputError(f"--seed {seed} acts only with built-in retrieval prompts (it draws their needles, keys "
                             f"and depths): give --retrieval N, or drop --seed (--sharegpt-offset draws other "
                             f"ShareGPT conversations)")
    suffix_len = DEFAULT_SUFFIX_LEN if suffix_len is None else suffix_len
    out, source = [], []
    if prompts_file is not None:
        out += from_jsonl(tok, prompts_file, prefix_len, suffix_len)
        source.append(f"jsonl:{prompts_file}")
    if sharegpt is not None:
        if sharegpt < 1:
            raise DascInputError(f"--sharegpt {sharegpt}: give a positive number of conversations")
        out += from_sharegpt(tok, sharegpt, prefix_len, suffix_len, sharegpt_offset)
        source.append(f"sharegpt:{sharegpt}@{sharegpt_offset}")
    if n_ret:
        seed = DEFAULT_SEED if seed is None else seed
        out += builtin_retrieval(tok, prefix_len, n_ret, seed)
        source.append(f"builtin-retrieval:{n_ret}:seed={seed}")
    if not out:
        raise DascInputError("no prompts: give --prompts FILE, --sharegpt N or --retrieval N > 0")
    text = [p for p in out if p.answer is None]
    ret = [p for p in out if p.answer is not None]
    mixed = []          # interleave text and retrieval prompts, so a time-capped run keeps both kinds
    for i in range(max(len(text), len(ret))):
        mixed += text[i:i + 1] + ret[i:i + 1]
    return mixed, "+".join(source)
