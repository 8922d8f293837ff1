"""Write tests/module_seconds.json from a JUnit XML report of the embedded leg (``.ci-reports/embedded.xml``).

The file gives each test module its worker-seconds; tests/conftest.py starts the heaviest modules first, so the
leg's workers (one module each at a time, ``--dist loadfile``) do not end waiting on one long module that started
last. Refresh it when the figures in tests/README.md are refreshed:
``.venv/bin/python .ci/module_seconds.py .ci-reports/embedded.xml``."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def module_seconds(report: Path) -> dict[str, int]:
    """Module file name (``test_x.py``) -> its tests' seconds in ``report``, rounded, heaviest first."""
    seconds: Counter[str] = Counter()
    for case in ET.parse(report).iter("testcase"):
        module = case.get("classname", "").split(".")[1:2]
        if module:
            seconds[f"{module[0]}.py"] += float(case.get("time") or 0)
    return {name: round(total) for name, total in seconds.most_common()}


if __name__ == "__main__":
    target = Path(__file__).resolve().parent.parent / "tests" / "module_seconds.json"
    target.write_text(json.dumps(module_seconds(Path(sys.argv[1])), indent=0) + "\n")
    print(f"{target}: {len(json.loads(target.read_text()))} modules")
