# SPDX-License-Identifier: BSD-2-Clause
"""Board platforms for ``build.py --board`` (none yet: boards come with their own issue)."""

__all__ = []
