"""The repository stands alone: no file points outside it, and every relative link in the
Markdown documents resolves to a file of the repository.

Specifications are cited by title and section (docs/design.md, "The specifications"), never by
a path. The one exception is a comment in an applied migration, which cannot change (its
checksum is recorded in every migrated database).
"""

from __future__ import annotations

import re
from pathlib import Path

from dist_support import tracked_files

REPO = Path(__file__).resolve().parents[2]
OUTSIDE = re.compile(r"\.\./shared|/work/(?:shared|main|wt)\b")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def tracked() -> list[str]:
    return [f for f in tracked_files(REPO) if f != "tests/system/test_docs_standalone.py"]


def test_nothing_points_outside_the_repository() -> None:
    found = []
    for name in tracked():
        path = REPO / name
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{name}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
                  if OUTSIDE.search(line)]
    assert not found, "paths outside the repository:\n" + "\n".join(found)


def test_markdown_links_resolve_inside_the_repository() -> None:
    broken = []
    for name in tracked():
        if not name.endswith(".md"):
            continue
        source = REPO / name
        text = CODE.sub("", source.read_text(encoding="utf-8"))  # `x[i](y)` is code, not a link
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            resolved = (source.parent / target.split("#", 1)[0]).resolve()
            if not resolved.is_relative_to(REPO) or not resolved.exists():
                broken.append(f"{name}: {target}")
    assert not broken, "links that do not resolve inside the repository:\n" + "\n".join(broken)
