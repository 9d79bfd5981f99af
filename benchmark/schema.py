"""Typed schemas for files from outside: pydantic models in strict mode (``int`` excludes ``bool``, no string is read as
a number); :func:`validate` turns pydantic's first error into one ``IntegrityError`` line. Relations between fields stay
plain code after the typed parse, in the file's own terms."""

from __future__ import annotations

from typing import Annotated, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from genshift.errors import IntegrityError, one_line

Count = Annotated[int, Field(ge=0, lt=1 << 53)]  # row counts, sizes: exact in every JSON reader
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Text = Annotated[str, Field(pattern=r"\S")]  # a string that is not blank


class Schema(BaseModel):
    """Base of every schema: strict types, immutable, unknown keys ignored (the raw dict is kept)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")


S = TypeVar("S", bound=Schema)


def describe(error: dict) -> str:
    """One pydantic error as ``field 'a.b["c/d"][0]': <what>, got <value>`` (``field 'a' is missing``)."""
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" if p.isidentifier() else f'["{one_line(p, 80)}"]'
                   for p in error["loc"]).lstrip(".")
    if error["type"] == "missing":
        return f"field {path!r} is missing"
    what = "should be an object" if error["type"] in ("model_type", "dict_type") else \
        error["msg"][:1].lower() + error["msg"][1:]
    return f"{f'field {path!r}: ' if path else 'the document '}{what}, got {one_line(repr(error['input']), 60)}"


def validate(schema: type[S], data, *, where: str, fix: str) -> S:
    """``data`` (parsed JSON/YAML) as a ``schema`` instance, or one ``IntegrityError``: ``{where}: ...; {fix}``."""
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        raise IntegrityError(f"{where}: {describe(e.errors(include_url=False)[0])}; {fix}") from None
