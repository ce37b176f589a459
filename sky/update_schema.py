"""Regenerate sky/task.schema.json from an installed SkyPilot (it is heavy, so kvbench's tests use this
vendored copy and skip SkyPilot's own check when it is absent):

    python -m venv /tmp/sky && /tmp/sky/bin/pip install skypilot
    /tmp/sky/bin/python sky/update_schema.py

The schema is SkyPilot's task schema (sky.utils.schemas.get_task_schema) with its free-form `resources`
replaced by the resources schema (get_resources_schema), as SkyPilot validates the two in turn. Its custom
keyword `case_insensitive_enum` is kept; tests/integration/test_nightly_ci.py implements it.
"""

import json
from importlib.metadata import version
from pathlib import Path

from sky.utils import schemas

task = schemas.get_task_schema()
task["properties"]["resources"] = schemas.get_resources_schema()
task["$comment"] = (
    f"SkyPilot {version('skypilot')}: sky.utils.schemas.get_task_schema() with "
    "resources = get_resources_schema(); regenerate with sky/update_schema.py"
)
out = Path(__file__).with_name("task.schema.json")
out.write_text(json.dumps(task, indent=1, sort_keys=True) + "\n")
print(f"wrote {out} ({out.stat().st_size:,} bytes) from SkyPilot {version('skypilot')}")
