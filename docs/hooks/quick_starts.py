"""mkdocs hook: README.md's quick starts on the site's home page, at build time.

``docs/index.md`` holds a marker; this hook replaces it with README's sections from "Quick start 1"
up to "Examples", one level down, their links to ``docs/`` made relative to the site. README is
where the quick starts are run as written (``tests/test_readme.py``); the home page shows the
same text, never a copy that could drift from it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

MARKER = "<!-- readme-quick-starts -->"
README = Path(__file__).resolve().parents[2] / "README.md"


def quick_starts(readme: str) -> str:
    """README's quick-start sections, headings one level down, ``docs/`` links relative to the site."""
    start = readme.index("## Quick start 1")
    end = readme.index("\n## ", readme.index("## Quick start 5"))
    text = readme[start:end].strip()
    text = re.sub(r"^## ", "### ", text, flags=re.M)
    return re.sub(r"\]\(docs/", "](", text)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, quick_starts(README.read_text()))
