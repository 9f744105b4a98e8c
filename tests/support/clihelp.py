"""Helpers for the CLI bad-input corpus (issue 13 Part A): tiny checkpoints, the real CLI, snapshots.

``dasc(...)`` runs the real entry point (:func:`dasc_compile.cli.run`: typer app plus the last-resort
handler of :mod:`dasc_compile.cli_exit`) in this process, capturing stdout and stderr; ``dasc_proc(...)``
runs ``python cli.py`` in a subprocess for what needs a real process (pipes, signals, exit status).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / "cli.py"

# 4 layers, interval 2 -> GDN layers 0 and 2; H_k = 1, H_v = 2, d_k = d_v = 4, K = 4
GDN_CONFIG = {"model_type": "qwen3_next", "architectures": ["Qwen3NextForCausalLM"], "num_hidden_layers": 4,
              "full_attention_interval": 2, "linear_num_key_heads": 1, "linear_num_value_heads": 2,
              "linear_key_head_dim": 4, "linear_value_head_dim": 4, "linear_conv_kernel_dim": 4}
# 2 layers: layer 0 KDA (1-indexed kda_layers [1]), layer 1 full attention; H = 2, d = 2
KDA_CONFIG = {"model_type": "kimi_linear", "architectures": ["KimiLinearForCausalLM"], "num_hidden_layers": 2,
              "linear_attn_config": {"kda_layers": [1], "full_attn_layers": [2], "num_heads": 2, "head_dim": 2,
                                     "short_conv_kernel_size": 4}}


def gdn_tensors() -> dict[str, torch.Tensor]:
    # layer 0: H = [9.97, 99.66] tokens at a_s = -0.3; layer 2: H = [99.66, 99.66]
    return {
        "model.layers.0.linear_attn.A_log": torch.tensor([0.0, -2.302585]),
        "model.layers.0.linear_attn.dt_bias": torch.tensor([0.3, 0.3]),
        "model.layers.2.linear_attn.A_log": torch.tensor([-2.302585, -2.302585]),
        "model.layers.2.linear_attn.dt_bias": torch.tensor([0.3, 0.3]),
    }


def kda_tensors() -> dict[str, torch.Tensor]:
    return {
        "model.layers.0.self_attn.A_log": torch.zeros(1, 1, 2, 1),
        "model.layers.0.self_attn.dt_bias": torch.tensor([0.3, 5.0, -3.0, 0.3]),
    }


def write_ckpt(d: Path, config: dict, tensors: dict) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(d / "model.safetensors"), metadata={"dasc_provenance": "hand-made test values"})
    return d


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return [ln for ln in self.err.splitlines() if ln.strip()]


def dasc(*args, cwd: Path | None = None) -> Result:
    """Run the real CLI entry (``dasc_compile.cli.run``) in-process; returns code, stdout, stderr."""
    from dasc_compile.cli import run

    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = run([str(a) for a in args])
    finally:
        os.chdir(old)
    return Result(code, out.getvalue(), err.getvalue())


def dasc_proc(*args, cwd: Path | None = None, timeout: float = 120, env: dict | None = None,
              **popen) -> subprocess.CompletedProcess:
    """``python cli.py ARGS`` in a subprocess (text mode, stdout/stderr captured unless given)."""
    popen.setdefault("capture_output", "stdout" not in popen and "stderr" not in popen)
    return subprocess.run([sys.executable, str(CLI), *map(str, args)], cwd=cwd, timeout=timeout, text=True,
                          env={**os.environ, **(env or {})}, **popen)


def assert_one_error(r: Result, *needles: str, code: int = 2) -> str:
    """Exit ``code``, exactly one ``error: ...`` line on stderr holding every needle, no traceback."""
    assert r.code == code, (r.code, r.out, r.err)
    assert "Traceback" not in r.err and "Traceback" not in r.out, r.err
    lines = r.err_lines
    assert len(lines) == 1 and lines[0].startswith("error: "), r.err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert len(lines[0]) < 700, f"error line is {len(lines[0])} characters"
    return lines[0]


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under ``root`` (hidden ones too) with its type, size and content hash."""
    snap = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                snap[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                snap[rel] = ("dir",)
            elif p.is_file():
                snap[rel] = ("file", p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
            else:
                snap[rel] = ("other",)
    return snap


@contextlib.contextmanager
def deadline(seconds: int):
    """Fail (instead of hanging) when the block takes longer than ``seconds``: SIGALRM in the main thread."""
    def boom(_signum, _frame):
        raise TimeoutError(f"blocked for more than {seconds} s")

    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
