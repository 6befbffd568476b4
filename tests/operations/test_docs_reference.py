"""docs/api.md, the HTTP API reference, names everything the server offers: every path and method
of the real OpenAPI document (from create_app), every error code of app/errors.py with its HTTP
status and retriability, every server setting and every flag of `txbroker serve`. A new endpoint,
code, setting or flag fails this test until the reference documents it."""

from __future__ import annotations

import argparse
import re

import pytest

from app.cli import build_parser
from app.errors import ERROR_SPECS, ErrorCode
from app.server import create_app
from app.settings import Settings
from tests.conftest import REPO_ROOT

API_REFERENCE = REPO_ROOT / "docs" / "api.md"
# A path ends where a character that cannot be part of it begins (a backtick, `?`, a space).
PATH_END = r"(?![A-Za-z0-9_/{}.-])"


def reference() -> str:
    return API_REFERENCE.read_text()


def section(title: str) -> str:
    """The text of one `## title` section of the reference."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", reference(), re.M | re.S)
    assert match, f"docs/api.md has no section '## {title}'"
    return match.group(1)


def openapi_operations() -> list[tuple[str, str]]:
    # Never started: building the app and its OpenAPI document does not touch the database.
    app = create_app(Settings(), "postgresql://unused@127.0.0.1/unused")
    return [(method.upper(), path) for path, item in app.openapi()["paths"].items() for method in item]


@pytest.mark.parametrize(("method", "path"), openapi_operations())
def test_every_endpoint_is_in_the_reference(method, path):
    assert re.search(rf"`{method} {re.escape(path)}{PATH_END}", reference()), (
        f"`{method} {path}` is served (it is in the OpenAPI document) but docs/api.md does not document it"
    )


@pytest.mark.parametrize("code", list(ErrorCode))
def test_every_error_code_is_in_the_table_with_its_status_and_retriability(code):
    spec = ERROR_SPECS[code]
    rows = [line for line in section("Error codes").splitlines() if line.startswith(f"| `{code}` |")]
    assert len(rows) == 1, f"{code} (app/errors.py) needs one row in the error table of docs/api.md"
    cells = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert cells[1] == str(spec.http_status), (
        f"{code}: the reference says HTTP {cells[1]}, the server {spec.http_status}"
    )
    retriable = cells[2].split()[0]
    assert retriable == ("yes" if spec.retriable else "no"), f"{code}: the reference says retriable {cells[2]!r}"


@pytest.mark.parametrize("name", list(Settings.model_fields))
def test_every_setting_is_in_the_settings_table(name):
    table = section("Running the server: flags and settings")
    assert re.search(rf"^\| [^|]*`{name}`", table, re.M), (
        f"the setting {name} (app/settings.py, TXBROKER_{name.upper()}) is missing from the settings table "
        f"of docs/api.md"
    )


def serve_flags() -> list[str]:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    serve = commands.choices["serve"]
    return [
        flag
        for action in serve._actions
        if action.help != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction)
        for flag in action.option_strings
    ]


@pytest.mark.parametrize("flag", serve_flags())
def test_every_serve_flag_is_in_the_reference(flag):
    assert re.search(rf"\[{re.escape(flag)}[\] ]", section("Running the server: flags and settings")), (
        f"`txbroker serve {flag}` is missing from the synopsis of docs/api.md"
    )


# ---- links: every relative link of README.md and docs/ names a file that exists, and an anchor of it

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def documents() -> list:
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def anchors(document) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces as
    hyphens, a repeated heading numbered (-1, -2, ...)."""
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", document.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        unique, repeat = slug, 0
        while unique in found:
            repeat += 1
            unique = f"{slug}-{repeat}"
        found.add(unique)
    return found


def relative_links() -> list[tuple[str, str]]:
    return [
        (str(document.relative_to(REPO_ROOT)), target)
        for document in documents()
        for target in LINK.findall(FENCE.sub("", document.read_text()))
        if not re.match(r"[a-z]+:", target)
    ]


@pytest.mark.parametrize(("document", "target"), relative_links())
def test_every_relative_link_resolves(document, target):
    path, _, anchor = target.partition("#")
    linked = (REPO_ROOT / document).parent / path if path else REPO_ROOT / document
    assert linked.exists(), f"{document} links to {target}, but {linked.relative_to(REPO_ROOT)} does not exist"
    if anchor:
        assert linked.suffix == ".md", f"{document} links to an anchor of {target}, which is not Markdown"
        assert anchor in anchors(linked), (
            f"{document} links to {target}, but {path or document} has no heading with the anchor #{anchor}"
        )
