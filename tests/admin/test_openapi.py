"""The OpenAPI document matches the API routes, both ways."""

from __future__ import annotations

import re
from typing import Any

from tests.admin.support import ConsoleHarness

METHODS = {"get", "post", "put", "patch", "delete"}


def _routes(console: ConsoleHarness) -> set[tuple[str, str]]:
    found = set()
    for rule in console.app.url_map.iter_rules():
        if not rule.rule.startswith("/admin/api/"):
            continue
        path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
        for method in rule.methods or ():
            if method.lower() in METHODS:
                found.add((path, method.lower()))
    return found


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        out = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        for value in node.values():
            out.extend(_refs(value))
        return out
    if isinstance(node, list):
        return [r for item in node for r in _refs(item)]
    return []


async def test_every_api_route_is_documented_and_vice_versa(console: ConsoleHarness) -> None:
    response = await console.client().get("/admin/api/openapi.json")
    assert response.status_code == 200
    doc = await response.get_json()
    assert doc["openapi"] == "3.1.0"
    documented = {(path, method) for path, item in doc["paths"].items()
                  for method in item if method in METHODS}
    routes = _routes(console)
    assert routes, "no API routes found"
    assert routes - documented == set(), "routes missing from the OpenAPI document"
    assert documented - routes == set(), "documented paths that are not routes"


async def test_document_is_well_formed(console: ConsoleHarness) -> None:
    doc = await (await console.client().get("/admin/api/openapi.json")).get_json()
    for ref in _refs(doc):
        assert ref.startswith("#/components/")
        node = doc
        for part in ref[2:].split("/"):
            node = node[part]  # KeyError: a dangling $ref
    for path, item in doc["paths"].items():
        for name in re.findall(r"{([^}]+)}", path):
            for method, op in item.items():
                params = op.get("parameters", []) + item.get("parameters", [])
                assert any(p["name"] == name and p["in"] == "path" for p in params), (
                    path, method)
        for method, op in item.items():
            if method in METHODS:
                assert op["summary"] and "200" in op["responses"]
                if method == "post":
                    assert {"csrfToken": []} .items() <= op["security"][0].items()
