"""Rebuild a trained reference model's initialisation (the "untrained model" / init-horizon controls of dasc eval).

    python -m benchmarks.train.init_model TRAINED_DIR --out INIT_DIR

Reads ``provenance.json`` and ``train_state/state.json`` of ``TRAINED_DIR``, rebuilds the initial model
on the CPU from its seed (benchmarks/train/models.py ``build_model``), checks it against what training
recorded (the initial ``A_log``/``dt_bias`` in ``train_state/init_decays.safetensors``, exactly; the
sha256 of all initial weights, when torch and transformers are the versions that made it), and writes
it as a checkpoint directory of the same format and tokenizer. Its weights are bf16 like the trained
model's (A_log/dt_bias fp32), so both controls see the same rounding.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def rebuild(trained: Path, out: Path) -> dict:
    """Write the initial model of ``trained`` to ``out``; returns what was checked.

    Raises:
        SystemExit: the rebuilt decays differ from the recorded initial ones.
    """
    from safetensors.torch import load_file

    from benchmarks.train.models import build_model, is_decay, save_checkpoint
    from benchmarks.train.recipe import decay_init_of
    from benchmarks.train.tokenizer import EOS, load_tokenizer
    from benchmarks.train.train import _sha, _versions

    state = json.loads((trained / "train_state" / "state.json").read_text())
    tok = load_tokenizer(trained)
    model = build_model(state["family"], state["size"], tok.get_vocab_size(), tok.token_to_id(EOS), state["seed"],
                        decay_init_of(state))
    init = load_file(str(trained / "train_state" / "init_decays.safetensors"))
    for n, p in model.named_parameters():
        if is_decay(n) and not torch.equal(p.detach(), init[f"live:{n}"]):
            raise SystemExit(f"{n}: the rebuilt initial decays differ from the recorded ones (versions: "
                             f"recorded {state['init_versions']}, here {_versions()})")
    same_versions = {k: v for k, v in state["init_versions"].items() if k != "python"} == \
        {k: v for k, v in _versions().items() if k != "python"}
    sha_ok = _sha(model.state_dict()) == state["init_sha256"]
    if same_versions and not sha_ok:
        raise SystemExit("the rebuilt initial weights differ from the recorded sha256 under the same versions")
    prov = {"model": f"initialisation of {trained}", "seed": state["seed"], "decay_init": decay_init_of(state),
            "decays_match_record": True,
            "weights_sha256_match_record": sha_ok, "versions_here": _versions(), "versions_recorded": state["init_versions"]}
    save_checkpoint(model, out, trained, prov)
    return prov


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trained", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    print(json.dumps(rebuild(a.trained, a.out), indent=1))


if __name__ == "__main__":
    main()
