"""The context-manager protocol shared by the client's classes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class Closing(ABC):
    """Something with sockets to release by `close()`; `with` closes it on the way out."""

    @abstractmethod
    def close(self) -> None:
        """Release the sockets (idempotent)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
