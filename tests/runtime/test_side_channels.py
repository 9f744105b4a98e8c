"""Every value dasc attaches to an object outside its own API goes through ``dasc_runtime.side_channels``.

The channels are checked on SGLang 0.5.17's own objects (``ServerArgs`` pickled as it is for a
spawned scheduler, ``InsertParams``, the component's ``ComponentData``), and the runtime's sources
are scanned so that a new attribute or metadata key set anywhere else fails here.
"""

from __future__ import annotations

import ast
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.support.runtime_fixtures import SGLANG_SKIP_REASON

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"
needs_sglang = pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")


def _foreign_writes(path: Path) -> list[str]:
    """``setattr`` / ``__setattr__`` calls, ``.metadata`` uses and ``_dasc_*`` names in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Name) and f.id in ("setattr", "getattr") and len(node.args) >= 2
                    and isinstance(node.args[1], ast.Constant) and str(node.args[1].value).startswith("_dasc")):
                out.append(f"{path.name}:{node.lineno}: {f.id}(..., {node.args[1].value!r})")
            if isinstance(f, ast.Name) and f.id == "setattr":
                out.append(f"{path.name}:{node.lineno}: setattr")
            if isinstance(f, ast.Attribute) and f.attr == "__setattr__":
                out.append(f"{path.name}:{node.lineno}: __setattr__")
        elif isinstance(node, ast.Attribute) and node.attr in ("metadata", "tier_policy", "component") \
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "INSTALLED")):
            out.append(f"{path.name}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(("_dasc_", "dasc_tier",
                                                                                                       "dasc_staged")):
            out.append(f"{path.name}:{node.lineno}: {node.value!r}")
    return out


def test_side_channels_are_set_in_one_module_only():
    files = sorted(p for p in RUNTIME.glob("*.py") if p.name != "side_channels.py")
    assert len(files) > 10
    bad = [hit for f in files for hit in _foreign_writes(f)]
    assert not bad, "runtime code attaches values outside dasc_runtime.side_channels:\n" + "\n".join(bad)
    # the scan sees real writes: side_channels.py itself is full of them
    assert len(_foreign_writes(RUNTIME / "side_channels.py")) >= 8


def test_side_channels_import_nothing_heavy():
    tree = ast.parse((RUNTIME / "side_channels.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported == {"__future__", "typing"}


@needs_sglang
def test_settings_travel_on_server_args_through_pickle():
    from sglang.srt.server_args import ServerArgs

    from dasc_runtime.side_channels import attach_settings, settings_of

    sa = ServerArgs(model_path="dummy", page_size=1)
    assert settings_of(sa) is None and settings_of(None) is None
    attach_settings(sa, {"plan": "/p", "pool_slots": 3, "pool_bytes": None})
    assert settings_of(sa) == {"plan": "/p", "pool_slots": 3}                 # None entries dropped
    assert settings_of(pickle.loads(pickle.dumps(sa))) == {"plan": "/p", "pool_slots": 3}


@needs_sglang
def test_insert_tier_rides_on_sglang_insert_params():
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams

    from dasc_runtime.side_channels import insert_tier, set_insert_tier

    params = InsertParams()
    assert insert_tier(params, "dense") == "dense" and insert_tier(None, "dense") == "dense"
    set_insert_tier(params, "compressed")
    assert insert_tier(params, "dense") == "compressed" and params.mamba_value is None


@needs_sglang
def test_node_metadata_keys_on_sglang_component_data():
    from sglang.srt.mem_cache.unified_cache.components import ComponentData

    from dasc_runtime.side_channels import is_staged, mark_staged, node_tier, pop_node_tier, set_node_tier

    cd = ComponentData()
    assert node_tier(cd) is None and node_tier(cd, "dense") == "dense" and not is_staged(cd, 0)
    set_node_tier(cd, "compressed")
    mark_staged(cd, 7)
    assert node_tier(cd) == "compressed" and is_staged(cd, 7) and not is_staged(cd, 8)
    assert pop_node_tier(cd) == "compressed" and pop_node_tier(cd) is None and node_tier(cd) is None


def test_pool_channels_and_the_copy_on_write_hint():
    from dasc_runtime.side_channels import (attach_component, attach_tier_hint, attach_tier_policy, component_of,
                                            tier_hint, tier_policy_of)

    pool = SimpleNamespace()
    assert tier_policy_of(pool) is None and component_of(pool) is None
    attach_tier_policy(pool, "policy")
    attach_component(pool, "component")
    assert (tier_policy_of(pool), component_of(pool)) == ("policy", "component")
    src = torch.tensor([3, 10])
    assert tier_hint(src) is None
    attach_tier_hint(src, [False, True])
    assert tier_hint(src) == [False, True]
    assert tier_hint(src.clone()) is None                        # a new tensor carries no hint
