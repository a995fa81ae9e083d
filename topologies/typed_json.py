"""JSON input files read into msgspec Structs, with errors that name the file and the field.

The topology and workload formats (topologies/json_topology.py, workloads/json_workload.py)
declare their fields as Structs; `read_json` parses a file (a syntax error names its line),
`convert` types a parsed document, and a wrong value is reported as, e.g.::

    topo.json: links[3].capacity_gbps: must be a number, got str
    w.json: coflows[0].flows[2].bytes: must be a number > 0, got -5
    w.json: coflows[1].id: required field missing

Numbers (`PositiveNumber`, `NonNegativeNumber`) are finite: JSON's Infinity and NaN are
refused, as are booleans where a number belongs.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec

T = TypeVar("T")

_FLOAT_MAX = sys.float_info.max
PositiveNumber = Annotated[float, msgspec.Meta(gt=0, le=_FLOAT_MAX)]
NonNegativeNumber = Annotated[float, msgspec.Meta(ge=0, le=_FLOAT_MAX)]
Name = Annotated[str, msgspec.Meta(min_length=1)]  # a DC, coflow or flow name

# msgspec's type names as the messages say them
_TYPES = {"float": "a number", "int": "an integer", "str": "a string", "bool": "true or false",
          "null": "null", "array": "a list", "object": "an object"}  # fmt: skip
_EXPECTED = re.compile(r"Expected `(?P<types>[^`]+)`(?P<limit>[^,]*)(?:, got `(?P<got>[^`]+)`)?")
_MISSING = re.compile(r"Object missing required field `(?P<field>[^`]+)`")
_STEP = re.compile(r"\.(\w+)|\[(\d+)\]")


def read_json(path: Path, error: type[Exception]) -> object:
    """The JSON document in `path`.

    Raises:
        error: "<path>: cannot read: ..." (missing, unreadable, not UTF-8) or
            "<path>: line N: invalid JSON: ...".
    """
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{path}: cannot read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise error(f"{path}: line {exc.lineno}: invalid JSON: {exc.msg}") from exc


def convert(doc: object, kind: type[T], error: type[Exception], where: str, top: bool) -> T:
    """`doc` (parsed JSON) as `kind` (a msgspec Struct or an annotated type).

    Args:
        where: what `doc` is: a file name (`top`: fields follow as "<file>: links[3].a")
            or a field of one ("<file>: coflows[2]": fields follow as "...coflows[2].id").

    Raises:
        error: "<where>: <field>: <what is wrong>", e.g. "t.json: links[3].capacity_gbps:
            must be a number, got str".
    """
    try:
        return msgspec.convert(doc, kind)
    except msgspec.ValidationError as exc:
        field, problem = field_error(str(exc), doc)
        if field:
            join = ": " if top else "" if field.startswith("[") else "."
            where = f"{where}{join}{field}"
        raise error(f"{where}: {problem}") from exc


def field_error(message: str, doc: object) -> tuple[str, str]:
    """(field path, problem) of a msgspec ValidationError's message about `doc`, e.g.
    ("links[3].capacity_gbps", "must be a number, got str") for "Expected `float`, got
    `str` - at `$.links[3].capacity_gbps`"; the field path is "" for `doc` itself."""
    text, _, at = message.partition(" - at `$")
    field = at.rstrip("`").lstrip(".")
    if missing := _MISSING.fullmatch(text):
        return _join(field, missing["field"]), "required field missing"
    expected = _EXPECTED.fullmatch(text)
    if expected is None:
        return field, text[:1].lower() + text[1:]
    names = expected["types"].split(" | ")
    if "float" in names and "int" in names:
        names.remove("int")  # "a number" says both
    types = " or ".join(_TYPES.get(t, t) for t in names)
    limit = re.sub(r"(\d)\.0\b", r"\1", expected["limit"])
    if limit == f" <= {_FLOAT_MAX!r}":
        types, limit = "a finite number", ""
    elif limit == " of length >= 1":
        types, limit = types.replace("a ", "a non-empty ", 1), ""
    got = expected["got"] or _shown(_value_at(doc, field))
    return field, f"must be {types}{limit}, got {got}"


def _join(field: str, name: str) -> str:
    return f"{field}.{name}" if field else name


def _value_at(doc: Any, field: str) -> object:
    """The value at `field` ("links[3].capacity_gbps") of `doc` (a decoded JSON document)."""
    for name, index in _STEP.findall("." + field if field[:1] not in ("", "[") else field):
        doc = doc[int(index)] if index else doc[name]
    return doc


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
