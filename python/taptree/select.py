"""Which taps a capture keeps: `stage=ffn_*;layer=20..30;pos=0`.

The same grammar as the Rust `capture` crate (capture/src/select.rs, and
docs/FORMAT.md "Selection grammar"): clauses separated by `;`, each
`field=value[,value...]`.

- `stage=` globs over stage names (`*` any run, `?` one character).
- `layer=`, `pos=`, `slot=` take `N`, `A..B` (half-open), `A..=B`, `A..` or
  `..B`. `layer=none` selects the global stages, `slot=none` the taps of an
  unbatched forward.

A field that is not named selects everything; a named field is a filter. The
empty string, `all` and `*` select everything. Anything malformed raises
SelectionError quoting the bad part.
"""

import re

_U32_MAX = 2**32 - 1
_FIELDS = ("stage", "layer", "pos", "slot")
_GLOB_CHARS = re.compile(r"^[A-Za-z0-9_\-.*?]*$")


class SelectionError(ValueError):
    """A malformed selection; the message quotes the bad part."""


def _num(s):
    s = s.strip()
    if not s.isdigit() or int(s) > _U32_MAX:
        raise ValueError("%s is not a non-negative integer" % _quote(s))
    return int(s)


def _quote(s):
    return '"%s"' % s.replace("\\", "\\\\").replace('"', '\\"')


def parse_range(v):
    """`5`, `2..4`, `2..=4`, `..3`, `7..` as a half-open (start, end)."""
    if "..=" in v:
        a, b = v.split("..=", 1)
        start = 0 if a == "" else _num(a)
        end = _num(b) + 1
        if end > _U32_MAX:
            raise ValueError("range end overflows")
    elif ".." in v:
        a, b = v.split("..", 1)
        start = 0 if a == "" else _num(a)
        end = _U32_MAX if b == "" else _num(b)
    else:
        start = _num(v)
        end = start + 1
        if end > _U32_MAX:
            raise ValueError("value overflows")
    if end <= start:
        raise ValueError("empty range (ranges are half-open: A..B keeps A up to B-1)")
    return (start, end)


def glob_match(pattern, text):
    """`*` matches any run (including none), `?` exactly one character."""
    p = t = 0
    star = None
    while t < len(text):
        if p < len(pattern) and (pattern[p] == "?" or pattern[p] == text[t]):
            p += 1
            t += 1
        elif p < len(pattern) and pattern[p] == "*":
            star = (p, t)
            p += 1
        elif star is not None:
            p = star[0] + 1
            t = star[1] + 1
            star = (star[0], star[1] + 1)
        else:
            return False
    return all(c == "*" for c in pattern[p:])


class Selection:
    """A parsed selection; `Selection.parse("")` keeps every tap."""

    def __init__(self, text=""):
        self.text = text.strip()
        self.stages = None  # list of globs
        self.layers = None  # (ranges, none)
        self.pos = None  # ranges
        self.slots = None  # (ranges, none)

    @classmethod
    def parse(cls, text):
        sel = cls(text or "")
        trimmed = sel.text
        if trimmed in ("", "all", "*"):
            return sel

        def err(part, reason):
            return SelectionError("selection %s: %s: %s" % (_quote(text), _quote(part), reason))

        for clause in trimmed.split(";"):
            clause = clause.strip()
            if not clause:
                continue
            if "=" not in clause:
                raise err(clause, "expected field=value (fields: stage, layer, pos, slot)")
            field, values = clause.split("=", 1)
            field = field.strip()
            values = [v.strip() for v in values.split(",")]
            if any(v == "" for v in values):
                raise err(clause, "empty value")
            if field not in _FIELDS:
                raise err(field, "unknown field (expected stage, layer, pos or slot)")
            attr = {"stage": "stages", "layer": "layers", "pos": "pos", "slot": "slots"}[field]
            if getattr(sel, attr) is not None:
                raise err(clause, "field %s given twice" % _quote(field))
            if field == "stage":
                for v in values:
                    if not _GLOB_CHARS.match(v):
                        bad = next(c for c in v if not (c.isascii() and (c.isalnum() or c in "_-.*?")))
                        raise err(v, "character %r is not allowed in a stage glob" % bad)
                sel.stages = values
            elif field == "pos":
                ranges = []
                for v in values:
                    try:
                        ranges.append(parse_range(v))
                    except ValueError as e:
                        raise err(v, str(e))
                sel.pos = ranges
            else:
                ranges, none = [], False
                for v in values:
                    if v == "none":
                        none = True
                        continue
                    try:
                        ranges.append(parse_range(v))
                    except ValueError as e:
                        raise err(v, str(e))
                setattr(sel, attr, (ranges, none))
        return sel

    def is_all(self):
        return self.stages is None and self.layers is None and self.pos is None and self.slots is None

    def __str__(self):
        return "all" if self.is_all() else self.text

    def matches_identity(self, stage, layer, slot):
        """Stage, layer and slot filters (everything but positions)."""
        if self.stages is not None and not any(glob_match(g, stage) for g in self.stages):
            return False
        for numbers, value in ((self.layers, layer), (self.slots, slot)):
            if numbers is not None:
                ranges, none = numbers
                if value is None:
                    if not none:
                        return False
                elif not any(a <= value < b for a, b in ranges):
                    return False
        return True

    def selected_runs(self, start, end):
        """The maximal runs of selected positions in start..end, in order."""
        if self.pos is None:
            return [(start, end)] if start < end else []
        runs, p = [], start
        inside = lambda q: any(a <= q < b for a, b in self.pos)  # noqa: E731
        while p < end:
            if inside(p):
                s = p
                while p < end and inside(p):
                    p += 1
                runs.append((s, p))
            else:
                p += 1
        return runs

    def wants(self, stage, layer, start, end, slot=None):
        """Whether a tap with this identity has at least one selected row."""
        return self.matches_identity(stage, layer, slot) and bool(self.selected_runs(start, end))
