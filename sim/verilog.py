# SPDX-License-Identifier: BSD-2-Clause
"""Compatibility names for tests and tools written before the move: Verilog emission and lint
now live in :mod:`roce_hw.generate` (``emit`` is :func:`roce_hw.generate.verilog_text`,
``lint`` runs plain ``verilator --lint-only -Wall``)."""

from roce_hw.generate import LINT_OFF, LintError, ToolMissing, emit, lint

__all__ = ["LINT_OFF", "LintError", "ToolMissing", "emit", "lint"]
