"""docs/rest.md, docs/cli.md and docs/configuration.md are generated from the code (`make docs`): a new endpoint,
command or setting without regenerated docs fails here, naming the command that fixes it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from pydantic_settings import BaseSettings, SettingsConfigDict

from tools import gendocs
from tools.gendocs import cli, config, rest


def test_generated_docs_are_up_to_date() -> None:
    out_of_date = gendocs.stale()
    assert not out_of_date, f"{', '.join(out_of_date)} out of date with the code: run `{gendocs.COMMAND}`"


def test_stale_names_a_changed_file(tmp_path: Path) -> None:
    for path, text in gendocs.render_all().items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    assert gendocs.stale(tmp_path) == []
    (tmp_path / "docs/cli.md").write_text("edited by hand\n")
    (tmp_path / "docs/rest.md").unlink()
    assert gendocs.stale(tmp_path) == ["docs/rest.md", "docs/cli.md"]


def test_rest_lists_every_operation_of_the_app() -> None:
    from server.app import create_app

    text = rest.render()
    for path, item in create_app().openapi()["paths"].items():
        for method in item:
            assert f"### {method.upper()} {path}\n" in text


def test_rest_renders_parameters_bodies_and_schemas() -> None:
    spec = {
        "info": {"title": "t", "version": "1", "description": "d"},
        "paths": {"/api/v1/things/{thing_id}": {"post": {
            "summary": "Make a thing",
            "parameters": [
                {"name": "thing_id", "in": "path", "required": True, "schema": {"type": "string"}},
                {"name": "n", "in": "query", "description": "how many",
                 "schema": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}], "default": 3}},
            ],
            "security": [{"bearer": []}], "operationId": "things-make_thing",
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Thing"}}}},
            "responses": {"404": {"description": "no such thing"}},
        }}},
        "components": {"schemas": {"Thing": {"description": "A thing.", "required": ["size_bytes"], "properties": {
            "size_bytes": {"type": "integer", "description": "its size"},
            "kind": {"enum": ["a", "b"], "type": "string"}}}}},
    }
    text = rest.render_spec(spec)
    assert "[`/api/v1/things/{thing_id}`](#post-apiv1thingsthing_id)" in text
    assert "Auth: `Authorization: Bearer <token>`." in text
    assert "| `n` | query | int \\| null |  | how many; ≥ 1, default `3` |" in text
    assert "| `thing_id` | path | str | yes |  |" in text
    assert "operationId: `things-make_thing`." in text
    assert "Body (required): `application/json`: [Thing](#thing)." in text
    assert "| `404` | no such thing |  |" in text
    assert "| `size_bytes` | int | yes | its size |" in text
    assert '| `kind` | `"a"` \\| `"b"` |  |  |' in text


def test_cli_covers_nested_actions_with_defaults() -> None:
    text = cli.render()
    for heading in ("## fleetprof up", "## fleetprof db upgrade", "## fleetprof token create", "## fleetprof report"):
        assert heading + "\n" in text
    assert "| `--scope {agent,team,scheduler,operator}` | required |" in text
    assert "| `--format {table,json,html}` | `table` |" in text


def test_cli_usage_does_not_depend_on_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    narrow = cli.render()
    monkeypatch.setenv("COLUMNS", "400")
    assert cli.render() == narrow


class _Example(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLEETPROF_", extra="ignore")

    # Where the thing lives;
    # unset = nowhere.
    thing_dir: str | None = None
    limit_bytes: int = 64 * 1024 * 1024  # largest thing
    bare: float = 1.5


def test_config_meaning_comes_from_the_comments_beside_each_field() -> None:
    comments = config.field_comments(_Example)
    assert comments == {"thing_dir": "Where the thing lives; unset = nowhere.", "limit_bytes": "largest thing",
                        "bare": ""}
    limit = _Example.model_fields["limit_bytes"]
    assert config.env_name(_Example, "limit_bytes", limit) == "FLEETPROF_LIMIT_BYTES"
    assert config.default_text("limit_bytes", limit) == "`67108864` (64 MiB)"
    assert config.default_text("thing_dir", _Example.model_fields["thing_dir"]) == "unset"


def test_config_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    before = config.render()
    monkeypatch.setenv("FLEETPROF_INTERVAL_S", "7")
    monkeypatch.setenv("FLEETPROF_DASHBOARD_PORT", "9999")
    assert config.render() == before
    assert "| `FLEETPROF_INTERVAL_S` | `float` | `1.0` |" in before


def test_every_setting_is_documented() -> None:
    assert config.undocumented() == []


def test_argparse_private_api_still_there() -> None:
    """The CLI walker reads argparse's sub-parser actions; fail loudly if a Python release renames them."""
    parser = argparse.ArgumentParser()
    parser.add_subparsers().add_parser("x", help="h")
    assert [(n, h) for n, h, _ in cli._subcommands(parser)] == [("x", "h")]


def test_cells_keep_their_row_and_their_text() -> None:
    from tools.gendocs.markdown import cell

    assert cell("a | b\nc") == "a \\| b c"
    assert cell("default <user>-<n>, or `<token>`") == "default &lt;user&gt;-&lt;n&gt;, or `<token>`"
