"""The committed JSON schema must match the pydantic model; changing one without a version bump fails.

If this fails after an intended schema change: bump SCHEMA_VERSION in dasc_compile/schema/plan.py, then
run `python -m dasc_compile.schema --write` and commit both.
"""

import json

from dasc_compile.schema import SCHEMA_PATH, SCHEMA_VERSION, json_schema


def test_committed_schema_matches_model_and_version():
    committed = json.loads(SCHEMA_PATH.read_text())
    assert committed.get("x-dasc-schema-version") == SCHEMA_VERSION, (
        "plan.schema.json was written for another SCHEMA_VERSION: regenerate it")
    assert committed == json_schema(), (
        "the Plan model changed but plan.schema.json did not: bump SCHEMA_VERSION and run "
        "`python -m dasc_compile.schema --write`")


# sha256 of the published schema text for each SCHEMA_VERSION. Changing the Plan model changes the
# hash; the version must be bumped and a new line added (old lines stay: a version never changes).
KNOWN_SCHEMAS = {
    1: "2ba1be31f4eed1d91cf9763dfc89fd2cc93a240fa29654eca973c20023b34af4",
    2: "3b3879d900dd79b4b749068131d0317459770a89c668eccba215135bb971b499",   # KernelModule.source_sha256
    3: "a4b46a1d4e5f28ea24155337b89b93d8d7a3152e3a0377e46e8d438bcdac19e3",   # mamba2: family, unit kind, conv_groups, served decay
    4: "305763305ba8ef97d430dd65575bb39754efaee5e7017d1d530a8da4d88d34ea",   # LayerPlan horizon_local_max, horizon_global_min
    5: "e9446821e6228a04cd76ab30c817198d74457ae18f685561e9fcc307edb980f7",   # KernelModule.constants in key order
}


def test_schema_change_requires_version_bump():
    import hashlib

    from dasc_compile.schema import schema_text

    got = hashlib.sha256(schema_text().encode()).hexdigest()
    assert SCHEMA_VERSION in KNOWN_SCHEMAS, (
        f"SCHEMA_VERSION {SCHEMA_VERSION} has no recorded hash: add {SCHEMA_VERSION}: '{got}' to KNOWN_SCHEMAS")
    assert got == KNOWN_SCHEMAS[SCHEMA_VERSION], (
        f"the Plan schema changed but SCHEMA_VERSION is still {SCHEMA_VERSION}: bump it, regenerate "
        f"plan.schema.json and record the new hash ({got})")
