"""Split lines into fields for a known dialect."""

from __future__ import annotations

from .sniffer import Dialect


def split_line(line: str, delimiter: str, quotechar: str = '"') -> list[str]:
    """Split one line; quoted fields may contain the delimiter and doubled quotes."""
    fields: list[str] = []
    field: list[str] = []
    quoted = False
    index = 0
    while index < len(line):
        char = line[index]
        if quoted:
            if char == quotechar and line[index + 1:index + 2] == quotechar:
                field.append(quotechar)
                index += 1
            elif char == quotechar:
                quoted = False
            else:
                field.append(char)
        elif char == quotechar and not "".join(field).strip():
            quoted = True
            field = []
        elif char == delimiter:
            fields.append("".join(field))
            field = []
        else:
            field.append(char)
        index += 1
    fields.append("".join(field))
    return fields


def read_rows(text: str, dialect: Dialect) -> list[list[str]]:
    """All non-blank lines of ``text`` split into fields."""
    return [
        split_line(line, dialect.delimiter, dialect.quotechar)
        for line in text.splitlines()
        if line.strip()
    ]
