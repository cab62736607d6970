"""Validation with every problem collected: a ``Checker`` records each problem with the file
(or ``--set``) and YAML path it is at, and its typed getters return None on a problem so
validation goes on and reports them all at once."""

from __future__ import annotations

from testbed import units


class Checker:
    """Collects problems with their location; typed getters return None on a problem."""

    def __init__(self, origins):
        self.origins = origins
        self.problems: list[str] = []

    def problem(self, path: tuple, message: str):
        self.problems.append(f"{self.origins.locate(path)}: {message}")

    def mapping(self, doc, path: tuple, allowed: tuple) -> dict:
        if doc is None:
            return {}
        if not isinstance(doc, dict):
            self.problem(path, f"expected a mapping, got {show(doc)}")
            return {}
        for key in doc:
            if key not in allowed:
                self.problem(path + (key,), f"unknown field (expected one of: {', '.join(allowed)})")
        return doc

    def integer(self, doc: dict, key: str, path: tuple, default=None, minimum=0, maximum=None):
        value = doc.get(key, default)
        here = path + (key,)
        if value is None:
            self.problem(here, "required (an integer)")
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(here, f"expected an integer, got {show(value)}")
            return None
        if value < minimum or (maximum is not None and value > maximum):
            bound = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
            self.problem(here, f"expected an integer {bound}, got {value}")
            return None
        return value

    def unit(self, doc: dict, key: str, path: tuple, parser, default=None, required=True):
        value = doc.get(key, default)
        here = path + (key,)
        if value is None:
            if required:
                self.problem(here, "required")
            return None
        try:
            return parser(value)
        except units.UnitError as exc:
            self.problem(here, str(exc))
            return None

    def choice(self, doc: dict, key: str, path: tuple, choices: tuple, default):
        value = doc.get(key, default)
        if value not in choices:
            self.problem(path + (key,), f"expected one of {', '.join(choices)}, got {show(value)}")
            return None
        return value


def show(value) -> str:
    """A value in a message: containers by their type (never a whole, possibly huge,
    structure), anything else by its repr, cut at 80 characters."""
    if isinstance(value, (dict, list)):
        return type(value).__name__
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
