"""Fakes of the engine interface written the simple way, every method taking the model id first
(``render_chat(model, messages)``): ``RolesByName`` gives such a fake the ``role``/``find`` of
``engines.client.EngineClient``, whose handles call the fake with the id bound."""

from __future__ import annotations

import functools
from typing import Any


class NamedRole:
    """``client.role(name)`` of a string-keyed fake: each call is the fake's method with ``name`` first."""

    def __init__(self, client: Any, name: str) -> None:
        self._client = client
        self.name = name

    def __getattr__(self, attr: str) -> Any:
        return functools.partial(getattr(self._client, attr), self.name)


class RolesByName:
    def role(self, name: str) -> NamedRole:
        return NamedRole(self, name)

    def find(self, name: str) -> NamedRole:
        return NamedRole(self, name)
