"""docs/api.md, the HTTP API reference, names everything the server offers: every path and method
of the real OpenAPI document (from create_app), every error code of app/errors.py with its HTTP
status and retriability, every server setting with its default and every flag of `txbroker serve`,
every metric a scrape shows; docs/kafka.md's settings table every Kafka listener setting; docs/cli.md
every client command of `txbroker` with its flags. A new endpoint, code, setting, command, flag or
metric fails this test until the reference documents it, and a changed default until the reference
says it. The other way round, every endpoint a document names is served, and every relative link of
the documents leads to a file and heading that exist."""

from __future__ import annotations

import argparse
import functools
import re
from pathlib import Path

import pytest
from starlette.routing import Match

from app.cli import build_parser
from app.errors import ERROR_SPECS, ErrorCode
from app.kafka.api_table import SUPPORTED_VERSIONS
from app.server import create_app
from app.settings import Settings
from app.storage.log.topic_configs import SPECS as TOPIC_CONFIG_SPECS
from tests.conftest import REPO_ROOT

API_REFERENCE = REPO_ROOT / "docs" / "api.md"
# A path ends where a character that cannot be part of it begins (a backtick, `?`, a space).
PATH_END = r"(?![A-Za-z0-9_/{}.-])"


def reference() -> str:
    return API_REFERENCE.read_text()


def section_of(document: Path, title: str) -> str:
    """The text of one `## title` section of a document."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", document.read_text(), re.M | re.S)
    assert match, f"{document.relative_to(REPO_ROOT)} has no section '## {title}'"
    return match.group(1)


def section(title: str) -> str:
    """The text of one `## title` section of the reference."""
    return section_of(API_REFERENCE, title)


@functools.cache
def unstarted_app():
    # Never started: building the app and its OpenAPI document does not touch the database.
    return create_app(Settings(), "postgresql://unused@127.0.0.1/unused")


def openapi_operations() -> list[tuple[str, str]]:
    return [(method.upper(), path) for path, item in unstarted_app().openapi()["paths"].items() for method in item]


@pytest.mark.parametrize(("method", "path"), openapi_operations())
def test_every_endpoint_is_in_the_reference(method, path):
    assert re.search(rf"`{method} {re.escape(path)}{PATH_END}", reference()), (
        f"`{method} {path}` is served (it is in the OpenAPI document) but docs/api.md does not document it"
    )


def query_parameters() -> list[tuple[str, str, dict]]:
    """The operations that take query parameters: (method, path, {name: default or None})."""
    return [
        (method.upper(), path, parameters)
        for path, item in unstarted_app().openapi()["paths"].items()
        for method, operation in item.items()
        if (
            parameters := {
                p["name"]: p["schema"].get("default") for p in operation.get("parameters", []) if p["in"] == "query"
            }
        )
    ]


@pytest.mark.parametrize(("method", "path", "parameters"), query_parameters())
def test_every_query_parameter_is_in_the_reference_with_its_default(method, path, parameters):
    written = re.search(rf"`{method} {re.escape(path)}\?([^`]*)`", reference())
    assert written, f"docs/api.md names `{method} {path}` without its query parameters {sorted(parameters)}"
    documented = dict(pair.partition("=")[::2] for pair in written.group(1).split("&"))
    assert documented.keys() == parameters.keys(), (
        f"`{method} {path}` takes {sorted(parameters)}, docs/api.md says {sorted(documented)}"
    )
    for name, default in parameters.items():
        if default is not None:
            assert documented[name] == str(default), (
                f"`{method} {path}`: {name} defaults to {default}, docs/api.md says {documented[name]!r}"
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


def documented_default(name: str) -> str:
    """The default cell of a setting's row in the settings table (a row may name several settings)."""
    table = section("Running the server: flags and settings")
    row = re.search(rf"^\| [^|]*`{name}`[^|]*\| ([^|]*) \|", table, re.M)
    assert row, f"the setting {name} has no row in the settings table of docs/api.md"
    return row.group(1).replace("`", "").strip()


@pytest.mark.parametrize("name", [name for name, field in Settings.model_fields.items() if field.default is not None])
def test_every_setting_default_is_the_reference_s(name):
    default = Settings.model_fields[name].default
    expected = str(default).lower() if isinstance(default, bool) else str(default)
    assert documented_default(name).split(" ")[0] == expected, (
        f"the setting {name} defaults to {expected} (app/settings.py), but docs/api.md's settings table says "
        f"{documented_default(name)!r}"
    )


KAFKA_REFERENCE = REPO_ROOT / "docs" / "kafka.md"
# The client command's own variables (txbroker/cli/command.py), not the server's settings.
CLIENT_VARIABLES = {"TXBROKER_URL", "TXBROKER_TOKEN"}


def test_every_environment_variable_a_document_names_exists():
    settings = {f"TXBROKER_{name.upper()}" for name in Settings.model_fields}
    named = {
        (str(document.relative_to(REPO_ROOT)), variable)
        for document in documents()
        for variable in re.findall(r"TXBROKER_[A-Z0-9_]+", document.read_text())
    }
    unknown = sorted((document, v) for document, v in named if v not in settings | CLIENT_VARIABLES)
    assert not unknown, f"documents name variables that no setting (app/settings.py) reads: {unknown}"


@pytest.mark.parametrize("name", [name for name in Settings.model_fields if name.startswith("kafka_")])
def test_every_kafka_listener_setting_is_in_kafka_md_s_settings_table(name):
    starting = re.search(r"^## Starting it\n(.*?)(?=^## )", KAFKA_REFERENCE.read_text(), re.M | re.S)
    assert starting, "docs/kafka.md has no section '## Starting it'"
    assert f"TXBROKER_{name.upper()}`" in starting.group(1), (
        f"the Kafka listener's setting {name} (TXBROKER_{name.upper()}) is missing from the settings table of "
        f"docs/kafka.md's 'Starting it'"
    )


def kafka_api_rows() -> dict[int, tuple[str, str]]:
    """docs/kafka.md's 'APIs and versions' table: API key -> (name, versions as written)."""
    rows = re.findall(r"^\| (\w+) \((\d+)\) \| ([\d-]+) \|", KAFKA_REFERENCE.read_text(), re.M)
    return {int(key): (name, versions) for name, key, versions in rows}


def test_kafka_md_s_api_table_names_every_api_served_with_its_versions():
    served = {
        key: str(versions.start) if len(versions) == 1 else f"{versions.start}-{versions[-1]}"
        for key, versions in SUPPORTED_VERSIONS.items()
    }
    documented = {key: versions for key, (_, versions) in kafka_api_rows().items()}
    assert documented == served, (
        f"app/kafka/api_table.py serves {served}, docs/kafka.md's 'APIs and versions' table says {documented}"
    )


def test_kafka_md_s_topic_config_table_names_every_topic_config():
    configs = KAFKA_REFERENCE.read_text().split("### Topic configs", 1)[1].split("\n### ", 1)[0]
    first_cells = re.findall(r"^\| (`[^|]*) \|", configs, re.M)
    documented = set(re.findall(r"`([a-z0-9.]+)`", " ".join(first_cells)))
    taken = {spec.name for spec in TOPIC_CONFIG_SPECS}
    assert documented == taken, (
        f"app/storage/log/topic_configs.py takes {sorted(taken - documented)} that docs/kafka.md's topic config "
        f"table lacks; the table names {sorted(documented - taken)} that it does not take"
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


# ---- metrics: the table of docs/api.md's "Metrics" and a real scrape name the same families


def test_every_metric_is_in_the_metrics_table_and_every_row_is_scraped(server):
    assert server.client.post("/v1/topics", json={"name": "measured"}).status_code == 201  # the gauges' rows
    scrape = server.client.get("/metrics").text
    scraped = dict(re.findall(r"^# TYPE (\S+) (\S+)$", scrape, re.M))
    documented = dict(re.findall(r"^\| `(txbroker_\w+)` \| (\w+) \|", section("Metrics"), re.M))
    assert scraped == documented, (
        f"served but not in docs/api.md's metrics table: {sorted(scraped.keys() - documented.keys())}; "
        f"in the table but not served: {sorted(documented.keys() - scraped.keys())}; "
        f"types differing: {sorted(n for n in scraped.keys() & documented.keys() if scraped[n] != documented[n])}"
    )


# ---- links: every relative link of the documents names a file that exists, and an anchor of it

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def documents() -> list[Path]:
    """Every Markdown document a user reads: the READMEs and docs/."""
    return [
        REPO_ROOT / "README.md",
        *sorted((REPO_ROOT / "docs").glob("*.md")),
        *(REPO_ROOT / folder / "README.md" for folder in ("spark_client", "sdk", "bench")),
    ]


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


# ---- endpoints the other way: every `METHOD /path` a document names is a route the server has

ENDPOINT = re.compile(r"`(GET|POST|PUT|PATCH|DELETE) (/[^`?\s]*)")


def documented_endpoints() -> list[tuple[str, str, str]]:
    return sorted(
        {
            (str(document.relative_to(REPO_ROOT)), method, path)
            for document in documents()
            for method, path in ENDPOINT.findall(document.read_text())
        }
    )


@pytest.mark.parametrize(("document", "method", "path"), documented_endpoints())
def test_every_endpoint_a_document_names_is_served(document, method, path):
    # A placeholder ({topic}, {group_id}, ...) stands for any one value.
    concrete = re.sub(r"\{[^}/]*\}", "x", path)
    scope = {"type": "http", "method": method, "path": concrete, "root_path": "", "headers": [], "query_string": b""}
    assert any(route.matches(scope)[0] == Match.FULL for route in unstarted_app().routes), (
        f"{document} documents `{method} {path}`, but the server has no such route"
    )


# ---- the client commands: docs/cli.md's synopses name every command of `txbroker` and its flags

CLI_REFERENCE = REPO_ROOT / "docs" / "cli.md"
# The server's commands, whose flags the settings section of docs/api.md holds (above).
SERVER_COMMANDS = {"serve", "db"}


def client_commands() -> list[tuple[str, list[str]]]:
    """Every client command of `txbroker` ("topics create", "produce", ...) with its own flags (not
    the options every command takes, which docs/cli.md's first table gives)."""
    from txbroker.cli import build_parser as build_client_parser

    common = {"--url", "--token", "--json", "--retry-timeout-ms", "-h", "--help"}
    found: list[tuple[str, list[str]]] = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        commands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not commands:
            flags = [flag for action in parser._actions for flag in action.option_strings if flag not in common]
            found.append((path, flags))
        for action in commands:
            for name, command in action.choices.items():
                if path or name not in SERVER_COMMANDS:
                    walk(command, f"{path} {name}".strip())

    walk(build_client_parser(), "")
    return found


def test_the_cli_reference_names_the_options_every_command_takes():
    options = section_of(CLI_REFERENCE, "Options of every command")
    for flag in ("--url", "--token", "--json", "--retry-timeout-ms"):
        assert f"`{flag}" in options, f"docs/cli.md's 'Options of every command' lacks `txbroker {flag}`"


@pytest.mark.parametrize(("command", "flags"), client_commands(), ids=[command for command, _ in client_commands()])
def test_every_client_command_and_flag_is_in_the_cli_reference(command, flags):
    synopses = "\n".join(FENCE.findall(CLI_REFERENCE.read_text()))
    # A synopsis goes on over the indented lines after its first.
    synopsis = re.search(rf"^txbroker {re.escape(command)}(?: .*)?$(?:\n {{2,}}.*$)*", synopses, re.M)
    assert synopsis, f"`txbroker {command}` has no synopsis line in docs/cli.md"
    missing = [flag for flag in flags if not re.search(rf"{re.escape(flag)}(?![a-z-])", synopsis.group(0))]
    assert not missing, f"`txbroker {command}` takes {missing}, which its synopsis in docs/cli.md lacks"


# ---- the SDK: docs/sdk.md names every option of every client, every method and every error class

SDK_REFERENCE = REPO_ROOT / "docs" / "sdk.md"


def sdk_families() -> dict[str, list[type]]:
    """Each section of docs/sdk.md that documents a client, with the classes it documents: the
    synchronous one and its asyncio flavour share one section."""
    import txbroker

    return {
        "Producer": [txbroker.Producer, txbroker.AsyncProducer],
        "Consumer": [txbroker.Consumer, txbroker.AsyncConsumer],
        "Admin": [txbroker.Admin, txbroker.AsyncAdmin],
        "TwoPhaseClient": [txbroker.TwoPhaseClient, txbroker.AsyncTwoPhaseClient],
    }


def constructor_options() -> list[tuple[str, str, str]]:
    """(section, class, option) for every public parameter of every client's constructor; a
    synchronous client's `**config` is its asyncio flavour's, whose parameters are listed."""
    import inspect

    return [
        (section, cls.__name__, name)
        for section, classes in sdk_families().items()
        for cls in classes
        for name, parameter in inspect.signature(cls.__init__).parameters.items()
        if name != "self" and not name.startswith("_") and parameter.kind is not inspect.Parameter.VAR_KEYWORD
    ]


def public_methods() -> list[tuple[str, str, str]]:
    """(section, class, name) for every public method and property of every client (inherited ones
    too: a TwoPhaseClient has Admin's)."""
    return sorted(
        {
            (section, cls.__name__, name)
            for section, classes in sdk_families().items()
            for cls in classes
            for name in dir(cls)
            if not name.startswith("_") and (callable(getattr(cls, name)) or isinstance(getattr(cls, name), property))
        }
    )


def sdk_section(title: str) -> str:
    """The `## title` section of docs/sdk.md, and its asyncio section, where the asyncio-only
    methods and the steps the synchronous clients run are documented too."""
    return section_of(SDK_REFERENCE, title) + section_of(SDK_REFERENCE, "The asyncio clients")


@pytest.mark.parametrize(("section_title", "cls", "option"), constructor_options())
def test_every_sdk_option_is_in_its_client_s_options_table(section_title, cls, option):
    inherited = {"TwoPhaseClient": "Admin"}.get(section_title, section_title)
    rows = re.findall(r"^\| (`[^|]*) \|", section_of(SDK_REFERENCE, inherited), re.M)
    assert any(f"`{option}`" in row for row in rows), (
        f"{cls}({option}=...) is an option that docs/sdk.md's '## {inherited}' section has no table row for"
    )


@pytest.mark.parametrize(("section_title", "cls", "name"), public_methods())
def test_every_sdk_method_is_in_the_sdk_reference(section_title, cls, name):
    inherited = {"TwoPhaseClient": "Admin"}.get(section_title, section_title)
    text = sdk_section(section_title) + (section_of(SDK_REFERENCE, inherited) if inherited != section_title else "")
    assert re.search(rf"`(?:await )?{re.escape(name)}(?:\(|`)", text), (
        f"{cls}.{name} is public but docs/sdk.md's '## {section_title}' section does not document it"
    )


def sdk_error_classes() -> list[str]:
    import inspect

    from txbroker import errors

    return [
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value) and issubclass(value, errors.TxbrokerError) and value.__module__ == errors.__name__
    ]


@pytest.mark.parametrize("name", sdk_error_classes())
def test_every_sdk_error_class_is_in_the_sdk_reference_with_its_code_and_retriability(name):
    from txbroker import errors

    cls = getattr(errors, name)
    rows = [line for line in section_of(SDK_REFERENCE, "Errors").splitlines() if line.startswith(f"| `{name}` |")]
    assert len(rows) == 1, f"txbroker.errors.{name} needs one row in a table of docs/sdk.md's '## Errors'"
    if cls is errors.TxbrokerError:
        return  # the base: its code and retriability are those of what it carries
    cells = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert cells[1] == f"`{cls.code}`", f"{name}: docs/sdk.md says code {cells[1]}, the class {cls.code}"
    assert cells[2] == ("yes" if cls.default_retriable else "no"), (
        f"{name}: docs/sdk.md says retriable {cells[2]!r}, the class {cls.default_retriable}"
    )


def test_the_sdk_reference_gives_every_client_option_s_default():
    import inspect

    from txbroker import AsyncAdmin, AsyncConsumer, AsyncProducer

    for title, cls in (("Producer", AsyncProducer), ("Consumer", AsyncConsumer), ("Admin", AsyncAdmin)):
        table = section_of(SDK_REFERENCE, title)
        for name, parameter in inspect.signature(cls.__init__).parameters.items():
            if parameter.default is inspect.Parameter.empty or name.startswith("_") or parameter.default is None:
                continue
            row = re.search(rf"^\| `{name}` \| ([^|]*) \|", table, re.M)
            if row is None:
                continue  # a shared option (token, headers, ...): the Conventions table
            written = row.group(1).strip().strip("`").strip('"')
            expected = str(parameter.default)
            assert written == expected, f"{cls.__name__}({name}=...) defaults to {expected}, docs/sdk.md says {written}"
