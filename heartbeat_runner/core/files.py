"""Files that appear whole: what a crash at any instant leaves is the old file or the new one.

Both write the text aside first (a name no other writer uses), then move it into place with one
system call: ``os.link``, which fails when the file exists (an exclusive claim), or ``os.replace``.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def _aside(path: Path, text: str | bytes) -> Path:
    aside = path.with_name(f".{path.name}.{uuid.uuid4().hex}.aside")
    if isinstance(text, bytes):
        aside.write_bytes(text)
    else:
        aside.write_text(text)
    return aside


def create_exclusively(path: Path, text: str) -> bool:
    """Create ``path`` holding ``text``, whole: True for the one caller that did, False when it exists."""
    aside = _aside(path, text)
    try:
        os.link(aside, path)
        return True
    except FileExistsError:
        return False
    finally:
        aside.unlink(missing_ok=True)


def replace_whole(path: Path, text: str | bytes) -> None:
    """Make ``path`` hold ``text`` (or bytes), whole (created or replaced)."""
    os.replace(_aside(path, text), path)
