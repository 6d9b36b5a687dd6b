"""The product speaks to its users: the README, the docs, the changelog, the configs' comments and the code's
comments and docstrings describe the library, never how it was made (no work periods, issue numbers, commit
hashes or internal tools)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
FORBIDDEN = {
    "a work period": re.compile(r"\bsessions?\b", re.IGNORECASE),
    "an issue by number": re.compile(r"\b(issue|ticket|task)s?\s*#?\d+|#\d{2,}\b|\bthe issue\b", re.IGNORECASE),
    "a commit hash": re.compile(r"(?<![#\w/.-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w/.-])"),
    "an internal tool": re.compile(r"farm[-_ ](bench|studio)|\bduplicates --change\b", re.IGNORECASE),
}


def text_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "mkdocs.yml"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    files += sorted((ROOT / "protorl" / "conf").rglob("*.yaml"))
    return [path for path in files if path.is_file()]


def python_files() -> list[Path]:
    folders = ("protorl", "tests", "benchmarks", "tools")
    return [path for folder in folders for path in sorted((ROOT / folder).rglob("*.py"))]


def prose_of_python(path: Path) -> str:
    """The comments and docstrings of a Python file, one per line."""
    source = path.read_text()
    parts = [token.string for token in tokenize.generate_tokens(io.StringIO(source).readline)
             if token.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(ast.get_docstring(node, clean=False) or "")
    return "\n".join(parts)


def findings(name: str, text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in FORBIDDEN.items():
            if name.endswith("test_product_text.py"):
                continue  # its own patterns
            if match := pattern.search(line):
                found.append(f"{name}:{number}: {what} ({match.group(0)!r}): {line.strip()[:100]}")
    return found


def test_the_checks_find_what_they_look_for():
    # each example joined from parts, so that this file's own text holds none of them
    examples = ["measured in " + "ses" + "sion 3", "see " + "is" + "sue 12", "landed in " + "e69c" + "b44",
                "farm" + "-bench says", "colour #1f77b4 and 1,000,000"]
    text = "\n".join(examples)
    assert [line.split(": ")[1].split(" (")[0] for line in findings("x", text)] == [
        "a work period", "an issue by number", "a commit hash", "an internal tool"]


@pytest.mark.parametrize("path", text_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_and_configs_speak_to_users(path):
    assert not findings(str(path.relative_to(ROOT)), path.read_text())


def test_comments_and_docstrings_speak_to_users():
    found = [hit for path in python_files() for hit in findings(str(path.relative_to(ROOT)), prose_of_python(path))]
    assert not found, "\n".join(found)
