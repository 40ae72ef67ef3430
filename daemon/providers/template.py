"""The L1 request-template language, interpreted by the executor (pure: no I/O).

Theory of operation
-------------------
An L1 operation declares its request and its read-back as data; this module
compiles those data once (when the Catalog is loaded) and renders them per
command. Three small pieces:

* **Body templates**: a JSON shape (a TOML table) in which a string value
  that starts with ``$`` is a placeholder, replaced at render time:

  ==================  ==========================================================
  ``$fields``         the command's field map (``{name: string | null}``)
  ``$remote_id``      the pinned remote id, as a string
  ``$remote_id_int``  the pinned remote id as a JSON integer (it must be digits)
  ==================  ==========================================================

  ``$$`` at the start of a string stands for a literal ``$``. Any other
  ``$name`` is refused when the definition is loaded, never at dispatch.
* **Path templates**: ``{name}`` fields (:mod:`string` format syntax, names
  only), each value percent-encoded: ``{remote_id}`` and, for read-backs,
  ``{field_names}`` (the wanted field names, comma separated).
* **JSON pointers** (RFC 6901, the ``jsonpointer`` library) say where a
  response holds the fields, the record's id and its last-modified time.

Every compile error is a :class:`TemplateError` naming the sub-key at fault,
so the Catalog loader can name the full key in its one-line error.
"""

from __future__ import annotations

import re
import string
import urllib.parse
from collections.abc import Mapping
from typing import Any

import attrs
import jsonpointer

BODY_PLACEHOLDERS = frozenset({"$fields", "$remote_id", "$remote_id_int"})
PATH_NAMES = frozenset({"remote_id", "field_names"})

Fields = dict[str, str | None]


class TemplateError(ValueError):
    """A template that cannot be compiled; ``where`` is the sub-key (may be empty)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(message)
        self.where = where
        self.message = message


class RenderError(ValueError):
    """A value that does not fit a compiled template (the request is never sent)."""


@attrs.frozen
class _Placeholder:
    name: str


def _compile_value(value: Any, where: str,
                   allowed: frozenset[str] = BODY_PLACEHOLDERS) -> Any:
    if isinstance(value, str):
        if value.startswith("$$"):
            return value[1:]
        if value.startswith("$"):
            if value not in allowed:
                raise TemplateError(where, f"unknown placeholder {value!r} (known: "
                                    f"{', '.join(sorted(allowed))})")
            return _Placeholder(value)
        return value
    if isinstance(value, bool | int) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _compile_value(v, f"{where}.{k}" if where else str(k), allowed)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_compile_value(v, f"{where}[{i}]", allowed) for i, v in enumerate(value)]
    raise TemplateError(where, "a body template holds JSON values only, not"
                        f" {type(value).__name__}")


@attrs.frozen
class BodyTemplate:
    """A compiled body shape; :meth:`render` fills its placeholders."""

    shape: Any

    @classmethod
    def compile(cls, value: Any,
                placeholders: frozenset[str] = BODY_PLACEHOLDERS) -> BodyTemplate:
        """Compile a body shape; ``placeholders`` are the ``$names`` it may use (an
        operation's by default; a subscription's create request has its own set)."""
        if not isinstance(value, Mapping):
            raise TemplateError("", "expected a table (the JSON object to send)")
        return cls(_compile_value(value, "", placeholders))

    def render_values(self, values: Mapping[str, Any]) -> Any:
        """Fill each placeholder with ``values[name]`` (names with their ``$``)."""
        def fill(value: Any) -> Any:
            if isinstance(value, _Placeholder):
                if value.name not in values:
                    raise RenderError(f"no value for {value.name}")
                return values[value.name]
            if isinstance(value, dict):
                return {k: fill(v) for k, v in value.items()}
            if isinstance(value, list):
                return [fill(v) for v in value]
            return value

        return fill(self.shape)

    def render(self, *, fields: Fields, remote_id: str) -> Any:
        def fill(value: Any) -> Any:
            if isinstance(value, _Placeholder):
                if value.name == "$fields":
                    return dict(fields)
                if value.name == "$remote_id":
                    return remote_id
                if not remote_id.isascii() or not remote_id.isdigit():
                    raise RenderError("the remote id is not an integer, as the"
                                      " operation's body requires")
                return int(remote_id)
            if isinstance(value, dict):
                return {k: fill(v) for k, v in value.items()}
            if isinstance(value, list):
                return [fill(v) for v in value]
            return value

        return fill(self.shape)


@attrs.frozen
class PathTemplate:
    """A relative path with ``{name}`` fields, each value percent-encoded."""

    text: str
    names: frozenset[str]

    @classmethod
    def compile(cls, text: Any, allowed: frozenset[str] = PATH_NAMES) -> PathTemplate:
        if not isinstance(text, str) or not text.startswith("/"):
            raise TemplateError("", "expected a path starting with /")
        names: set[str] = set()
        try:
            parsed = list(string.Formatter().parse(text))
        except ValueError as exc:
            raise TemplateError("", f"not a valid path template: {exc}") from None
        for _literal, name, spec, conversion in parsed:
            if name is None:
                continue
            if name not in allowed or spec or conversion:
                raise TemplateError("", f"unknown path field {{{name}}} (known: "
                                    + ", ".join(f"{{{n}}}" for n in sorted(allowed)) + ")")
            names.add(name)
        return cls(text, frozenset(names))

    def render(self, *, remote_id: str, field_names: list[str] | None = None) -> str:
        return self.text.format(
            remote_id=urllib.parse.quote(remote_id, safe=""),
            field_names=urllib.parse.quote(",".join(field_names or []), safe=","),
        )


@attrs.frozen
class Pointer:
    """An RFC 6901 JSON pointer into a decoded JSON document."""

    text: str
    _pointer: jsonpointer.JsonPointer = attrs.field(eq=False, repr=False)
    # The unescaped reference tokens, parsed once (``find`` runs per response).
    _tokens: tuple[str, ...] = attrs.field(eq=False, repr=False, default=())

    @classmethod
    def compile(cls, text: Any) -> Pointer:
        if not isinstance(text, str):
            raise TemplateError("", "expected a JSON pointer string such as \"/data/id\"")
        try:
            pointer = jsonpointer.JsonPointer(text)
        except jsonpointer.JsonPointerException as exc:
            raise TemplateError("", f"malformed JSON pointer {text!r}: {exc}") from None
        return cls(text, pointer, tuple(str(part) for part in pointer.parts))

    def find(self, doc: Any) -> Any:
        """The value at the pointer, or None when the document has nothing there.

        RFC 6901 evaluation over the tokens parsed at load, as ``jsonpointer``
        resolves them: an object member by name; an array element by an index
        without leading zeros; anything else (``-``, a missing member or index, a
        string or another scalar) is nothing there."""
        for token in self._tokens:
            if isinstance(doc, Mapping):
                if token not in doc:
                    return None
                doc = doc[token]
            elif isinstance(doc, list):
                if not _INDEX.match(token) or int(token) >= len(doc):
                    return None
                doc = doc[int(token)]
            else:
                return None
        return doc

    @property
    def parts(self) -> tuple[str, ...]:
        """The reference tokens, unescaped: ``/a/b`` is ("a", "b")."""
        return self._tokens

    @property
    def label(self) -> str:
        """``/a/b`` as ``.a.b``, for messages that name where a value was expected."""
        return "".join(f".{part}" for part in self._tokens)


# An array index in a JSON pointer (RFC 6901 section 4): no sign, no leading zero.
_INDEX = re.compile(r"\A(0|[1-9][0-9]*)\Z")


def identity_text(value: Any) -> str | None:
    """A record id as a response names it (string or integer), as text; else None."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def field_map(value: Any, where: str, allowed: frozenset[str]) -> Fields:
    """A command's field map, validated against the operation's allowed fields."""
    if not isinstance(value, Mapping) or not value:
        raise RenderError(f"{where} must be a non-empty object")
    extra = set(value) - allowed
    if extra:
        raise RenderError(f"fields not allowed by the operation: {', '.join(sorted(extra))}")
    if not all(v is None or isinstance(v, str) for v in value.values()):
        raise RenderError("field values must be strings or null")
    return dict(value)
