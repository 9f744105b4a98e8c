"""``python -m dasc_compile.schema [--write]``: print the plan's JSON schema, or write plan.schema.json."""

import sys

from dasc_compile.schema.canonical import SCHEMA_PATH, schema_text

if "--write" in sys.argv:
    SCHEMA_PATH.write_text(schema_text())
    print(f"wrote {SCHEMA_PATH}")
else:
    sys.stdout.write(schema_text())
