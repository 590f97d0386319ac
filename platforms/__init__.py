# SPDX-License-Identifier: BSD-2-Clause
"""The boards ``build.py --board`` knows: every board module's ``BOARDS`` merged into one
registry, in the order of :data:`BOARD_MODULES`.

A board module that is not present (the ECP5 boards live on another branch until merged) is
skipped, so the registry works with whatever modules the checkout has; a module that is
present but fails to import raises as usual.
"""

import importlib
import importlib.util

from .board import Board, BoardOptions

__all__ = ["BOARD_MODULES", "Board", "BoardOptions", "boards", "get_board", "board_names"]

#: Board modules, in the order ``--list-boards`` prints them: the open-toolchain boards first.
BOARD_MODULES = ("platforms.ecp5_1g", "platforms.xilinx_100g")

_registry = None


def boards():
    """``{name: Board}`` of every board of every present board module (loaded once)."""
    global _registry
    if _registry is None:
        merged = {}
        for modname in BOARD_MODULES:
            if importlib.util.find_spec(modname) is None:
                continue
            module = importlib.import_module(modname)
            for board in module.BOARDS:
                if not isinstance(board, Board):
                    raise TypeError(f"{modname}.BOARDS holds {board!r}, not a Board")
                if board.name in merged:
                    raise ValueError(f"board name {board.name!r} is defined twice "
                                     f"({modname} and an earlier module)")
                merged[board.name] = board
        _registry = merged
    return dict(_registry)


def board_names():
    """The ``--board`` values, in registry order."""
    return list(boards())


def get_board(name):
    """The :class:`Board` called ``name``; ``ValueError`` naming the valid boards if none is."""
    registry = boards()
    try:
        return registry[name]
    except KeyError:
        raise ValueError(f"unknown board {name!r}; choose one of: "
                         + ", ".join(registry)) from None
