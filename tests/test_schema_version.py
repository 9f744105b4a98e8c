"""The committed JSON schema must match the pydantic model; changing one without a version bump fails.

If this fails after an intended schema change: bump SCHEMA_VERSION in dasc_compile/schema.py, then
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
