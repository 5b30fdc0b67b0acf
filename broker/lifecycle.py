"""The context-manager protocols shared by pylog's classes: `with` closes, or starts and stops."""

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


class Running(ABC):
    """Something started by `start()` and stopped by `stop()`; `with` does both."""

    @abstractmethod
    def start(self) -> None:
        """Start (connect, or launch the process)."""

    @abstractmethod
    def stop(self) -> object:
        """Stop (idempotent)."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class AsyncClosing(ABC):
    """Closing on asyncio: `async with` opens it (`open()`) and closes it on the way out,
    whatever happened inside."""

    @abstractmethod
    async def open(self) -> None:
        """Connect (or join) ahead of first use; closed again if that fails."""

    @abstractmethod
    async def close(self) -> None:
        """Release the sockets (idempotent)."""

    async def __aenter__(self) -> Self:
        try:
            await self.open()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()
