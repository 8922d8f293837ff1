import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("DBT_SEND_ANONYMOUS_USAGE_STATS", "false")

from harness import Harness  # noqa: E402


@pytest.fixture
def hb(tmp_path):
    """A Heartbeat on a fresh temporary lakehouse (real engine, dbt and local jobs)."""
    with Harness(tmp_path) as harness:
        yield harness
