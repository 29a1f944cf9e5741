"""Closable: the base of an object that holds something it must give back,
closed by ``with`` on the way out."""

from __future__ import annotations

import abc
from typing import Self


class Closable(abc.ABC):
    """Base of an object that holds something it must give back (a file
    descriptor, a mapping, a host-wide lock and the knobs under it):
    ``with obj:`` closes it on the way out, whatever happened inside.
    ``close()`` must be safe to call again, since a signal handler or
    atexit may call it too.  What is built closed and opened later
    (``KsmController``) opens in its own ``__enter__``."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
