"""Do transformers releases build the same MQAR probe model from a seed, and compute the same numbers from the same
weights? (session 33, benchmarks/notes/2026-12-04-recurrent-only-control.md)

    PYTHONPATH=. OMP_NUM_THREADS=1 <python A> same_weights.py save /tmp/w      # e.g. .venv-newest (5.24)
    PYTHONPATH=/tmp/tf517:. OMP_NUM_THREADS=1 .venv/bin/python same_weights.py load /tmp/w   # 5.17 overlaid (CI)
    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python same_weights.py load /tmp/w               # 5.12.1

``save`` builds the pilot model (recurrent-only and hybrid, seed 0) and writes its weights, its logits and its
gradient on one MQAR batch; ``load`` builds the same model under another release, says whether its own
initialisation equals the saved one, then loads the saved weights and compares logits and gradient.
"""
import sys

import torch
import transformers

from benchmarks.train.models import build_model
from benchmarks.train.mqar_probe import mqar_batch

mode, path = sys.argv[1], sys.argv[2]
print("transformers", transformers.__version__, "torch", torch.__version__)
for attention in (False, True):
    m = build_model("gdn", "pilot", 256, eos_id=2, seed=0, attention=attention)
    f = f"{path}.{attention}.pt"
    if mode == "save":
        torch.save(m.state_dict(), f)
    else:
        saved = torch.load(f)
        differ = [k for k, v in m.state_dict().items() if not torch.equal(saved[k], v)]
        print(f"attention={attention}: own init differs from the saved one in {len(differ)} of {len(saved)} tensors",
              differ[:4])
        m.load_state_dict(saved)
    ids, tgt = mqar_batch(torch.Generator().manual_seed(5), 8, 8, 48, 64, 64, 256)
    m.train()
    out = m(input_ids=ids, use_cache=False).logits
    torch.nn.functional.cross_entropy(out.flatten(0, 1), tgt.flatten(), ignore_index=-100).backward()
    grad = torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])
    if mode == "save":
        torch.save((out.detach(), grad), f + ".out")
    else:
        o2, g2 = torch.load(f + ".out")
        print(f"attention={attention}: logits max |diff| {(out.detach() - o2).abs().max().item():.3g}, "
              f"gradient |diff| / |saved| {((grad - g2).norm() / g2.norm()).item():.3g}")
