"""The L1 request-template language: placeholders, path fields, JSON pointers."""

from __future__ import annotations

from typing import Any

import jsonpointer
import pytest

from daemon.providers.template import (
    BodyTemplate,
    PathTemplate,
    Pointer,
    RenderError,
    TemplateError,
    field_map,
    identity_text,
)


@pytest.mark.parametrize(
    ("shape", "remote_id", "expected"),
    [
        ({"properties": "$fields"}, "101", {"properties": {"jobtitle": "CTO"}}),
        ({"data": {"type": "prospect", "id": "$remote_id_int", "attributes": "$fields"}},
         "42", {"data": {"type": "prospect", "id": 42, "attributes": {"jobtitle": "CTO"}}}),
        ({"id": "$remote_id", "set": ["$fields", 1, True]}, "a b",
         {"id": "a b", "set": [{"jobtitle": "CTO"}, 1, True]}),
        # "$$" escapes a literal dollar.
        ({"note": "$$fields", "price": "$$5"}, "1", {"note": "$fields", "price": "$5"}),
    ],
)
def test_body_template_renders(shape: dict[str, Any], remote_id: str, expected: Any) -> None:
    body = BodyTemplate.compile(shape)
    assert body.render(fields={"jobtitle": "CTO"}, remote_id=remote_id) == expected


@pytest.mark.parametrize(
    ("shape", "where"),
    [
        ({"properties": "$field"}, "properties"),
        ({"data": {"id": "$remote"}}, "data.id"),
        ({"data": {"list": ["ok", "$nope"]}}, "data.list[1]"),
        ({"x": 1.5}, "x"),
        ("$fields", ""),
        (["$fields"], ""),
    ],
)
def test_body_template_refuses_unknown_placeholders_and_non_json(shape: Any,
                                                                 where: str) -> None:
    with pytest.raises(TemplateError) as caught:
        BodyTemplate.compile(shape)
    assert caught.value.where == where


@pytest.mark.parametrize("remote_id", ["abc", "", "4 2", "٤٢", "-1"])
def test_integer_remote_id_placeholder_refuses_non_digits(remote_id: str) -> None:
    body = BodyTemplate.compile({"id": "$remote_id_int"})
    with pytest.raises(RenderError):
        body.render(fields={}, remote_id=remote_id)


@pytest.mark.parametrize(
    ("text", "remote_id", "names", "expected"),
    [
        ("/objects/{remote_id}", "10/1", None, "/objects/10%2F1"),
        ("/objects/{remote_id}?properties={field_names}", "7", ["a", "b c"],
         "/objects/7?properties=a,b%20c"),
        ("/static", "7", None, "/static"),
    ],
)
def test_path_template_encodes_values(text: str, remote_id: str, names: list[str] | None,
                                      expected: str) -> None:
    assert PathTemplate.compile(text).render(remote_id=remote_id, field_names=names) == expected


@pytest.mark.parametrize(
    "text",
    ["objects/{remote_id}", "/objects/{id}", "/objects/{remote_id!r}", "/objects/{remote_id:>9}",
     "/objects/{remote_id", "/objects/{}", 7],
)
def test_path_template_refuses(text: Any) -> None:
    with pytest.raises(TemplateError):
        PathTemplate.compile(text)


@pytest.mark.parametrize(
    ("text", "doc", "found"),
    [
        ("/properties", {"properties": {"a": "1"}}, {"a": "1"}),
        ("/data/attributes/title", {"data": {"attributes": {"title": "CTO"}}}, "CTO"),
        ("/data/id", {"data": {"id": 7}}, 7),
        ("/a~1b/c~0d", {"a/b": {"c~d": 1}}, 1),
        ("/list/1", {"list": ["x", "y"]}, "y"),
        ("", {"whole": 1}, {"whole": 1}),
        # Nothing there: None, never an exception.
        ("/missing", {"a": 1}, None),
        ("/a/b", {"a": "string"}, None),
        ("/list/9", {"list": []}, None),
        ("/a", None, None),
        ("/a", [1], None),
    ],
)
def test_pointer_finds(text: str, doc: Any, found: Any) -> None:
    assert Pointer.compile(text).find(doc) == found


_ORACLE_DOCS: list[Any] = [
    None, 7, "text", [], ["x", "y", "z"], {}, {"": 1, "a": {"b": [10, {"c": None}]}},
    {"data": {"id": "42", "attributes": {"title": "CTO", "updatedAt": "2026-01-01"}}},
    {"a/b": {"c~d": [True]}, "0": "zero", "01": "one", "list": [[1, 2], "ab"]},
]
_ORACLE_POINTERS = [
    "", "/", "/a", "/a/b", "/a/b/0", "/a/b/1/c", "/a/b/01", "/a/b/-", "/a/b/2", "/a/b/-1",
    "/0", "/01", "/1", "/-", "/data/id", "/data/attributes/title", "/data/id/0",
    "/a~1b/c~0d/0", "/list/0/1", "/list/1/0", "/list/1/5", "/list/x", "/text/0",
]


@pytest.mark.parametrize("text", _ORACLE_POINTERS)
def test_pointer_find_agrees_with_jsonpointer(text: str) -> None:
    """find walks the tokens parsed at load; it must say what ``jsonpointer`` resolves
    (whose end-of-array marker ``-`` is nothing there), for every document."""
    pointer = Pointer.compile(text)
    for doc in _ORACLE_DOCS:
        try:
            expected = jsonpointer.resolve_pointer(doc, text, None)
        except (jsonpointer.JsonPointerException, TypeError):
            expected = None
        if isinstance(expected, jsonpointer.EndOfList):
            expected = None
        assert pointer.find(doc) == expected, (text, doc)


@pytest.mark.parametrize("text", ["properties", "data/id", "/a~2b", "/a~", 5, None])
def test_pointer_refuses_malformed(text: Any) -> None:
    with pytest.raises(TemplateError):
        Pointer.compile(text)


def test_pointer_label_names_the_place() -> None:
    assert Pointer.compile("/data/attributes").label == ".data.attributes"


@pytest.mark.parametrize(
    ("value", "text"),
    [("101", "101"), (101, "101"), (0, "0"), (True, None), (None, None), (1.0, None),
     ({"id": 1}, None)],
)
def test_identity_text(value: Any, text: str | None) -> None:
    assert identity_text(value) == text


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "request.properties must be a non-empty object"),
        ({}, "request.properties must be a non-empty object"),
        ([], "request.properties must be a non-empty object"),
        ({"email": "x"}, "fields not allowed by the operation: email"),
        ({"jobtitle": 5}, "field values must be strings or null"),
    ],
)
def test_field_map_refuses(value: Any, message: str) -> None:
    with pytest.raises(RenderError, match=message):
        field_map(value, "request.properties", frozenset({"jobtitle"}))


def test_field_map_accepts_null_to_clear() -> None:
    assert field_map({"jobtitle": None}, "x", frozenset({"jobtitle"})) == {"jobtitle": None}
