"""One registry type for everything looked up by name: model families, evaluation tasks, masking policies.

Entries are objects or "module:attribute" import paths, imported on first use (a family's sampler is not
imported until a model of that family is loaded). Unknown names are refused with the allowed ones and a
"did you mean".
"""
from __future__ import annotations

import importlib
from typing import Generic, Iterator, TypeVar, Union

from sinklib.validation import BadValue, check_choice

T = TypeVar("T")


class Registry(Generic[T]):
    """name → T. `kind` names the parameter in errors ("family", "task", "policy")."""

    def __init__(self, kind: str, entries: dict[str, Union[str, T]] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, Union[str, T]] = dict(entries or {})

    def register(self, name: str, target: Union[str, T], *, replace: bool = False) -> None:
        """Add `name` → an object or a lazy "module:attribute"; an existing name needs replace=True."""
        if not isinstance(name, str) or not name:
            raise BadValue(f"name={name!r} is not allowed: a {self.kind} name must be a non-empty str")
        if name in self._entries and not replace:
            raise BadValue(f"name={name!r} is not allowed: a {self.kind} of that name is registered already "
                           "(pass replace=True to replace it)")
        if isinstance(target, str) and target.count(":") != 1:
            raise BadValue(f"target={target!r} is not allowed: a lazy {self.kind} is 'module:attribute'")
        self._entries[name] = target

    def unregister(self, name: str) -> None:
        """Remove `name`; an unknown name is refused with the registered ones."""
        self._entries.pop(check_choice(name, self.kind, self.names()))

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._entries)

    def get(self, name: str) -> T:
        """The entry registered as `name`; a lazy "module:attribute" is imported on first use and kept."""
        check_choice(name, self.kind, self.names())
        target = self._entries[name]
        if isinstance(target, str):
            module, attribute = target.split(":")
            target = self._entries[name] = getattr(importlib.import_module(module), attribute)
        return target

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"
