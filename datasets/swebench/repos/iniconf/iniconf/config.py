"""The parsed configuration and its typed getters."""

from __future__ import annotations

from collections.abc import Iterator

DEFAULT_SECTION = "DEFAULT"

_TRUE = {"1", "yes", "true", "on"}
_FALSE = {"0", "no", "false", "off"}

_MISSING = object()


class ConfigError(ValueError):
    """Malformed configuration text, or a value of the wrong type."""


class MissingOption(KeyError):
    """The section or option does not exist and no fallback was given."""


class Config:
    def __init__(self) -> None:
        self._sections: dict[str, dict[str, str]] = {DEFAULT_SECTION: {}}

    def add_section(self, name: str) -> dict[str, str]:
        return self._sections.setdefault(name, {})

    def sections(self) -> list[str]:
        return [name for name in self._sections if name != DEFAULT_SECTION]

    def has_section(self, name: str) -> bool:
        return name in self._sections

    def options(self, section: str) -> list[str]:
        if section not in self._sections:
            raise MissingOption(section)
        merged = dict(self._sections[DEFAULT_SECTION])
        merged.update(self._sections[section])
        return list(merged)

    def items(self, section: str) -> Iterator[tuple[str, str]]:
        for option in self.options(section):
            yield option, self.get(section, option)

    def set(self, section: str, option: str, value: str) -> None:
        self.add_section(section)[option.strip().lower()] = value

    def get(self, section: str, option: str, fallback: object = _MISSING) -> str:
        key = option.strip().lower()
        values = self._sections.get(section)
        if values is not None and key in values:
            return values[key]
        if values is not None and key in self._sections[DEFAULT_SECTION]:
            return self._sections[DEFAULT_SECTION][key]
        if fallback is not _MISSING:
            return fallback  # type: ignore[return-value]
        raise MissingOption(f"{section}.{key}")

    def _convert(self, section, option, fallback, kind, convert):
        raw = self.get(section, option, fallback)
        if raw is fallback and fallback is not _MISSING:
            return fallback
        try:
            return convert(raw)
        except ValueError:
            raise ConfigError(f"{section}.{option}: {raw!r} is not a valid {kind}") from None

    def getint(self, section: str, option: str, fallback: object = _MISSING) -> int:
        return self._convert(section, option, fallback, "integer", lambda raw: int(raw, 0))

    def getfloat(self, section: str, option: str, fallback: object = _MISSING) -> float:
        return self._convert(section, option, fallback, "number", float)

    def getbool(self, section: str, option: str, fallback: object = _MISSING) -> bool:
        def convert(raw: str) -> bool:
            word = raw.strip().lower()
            if word in _TRUE:
                return True
            if word in _FALSE:
                return False
            raise ValueError(raw)

        return self._convert(section, option, fallback, "boolean", convert)

    def getlist(self, section: str, option: str, fallback: object = _MISSING) -> list[str]:
        def convert(raw: str) -> list[str]:
            return [item.strip() for item in raw.replace("\n", ",").split(",") if item.strip()]

        return self._convert(section, option, fallback, "list", convert)
