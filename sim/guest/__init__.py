# SPDX-License-Identifier: BSD-2-Clause
"""The soft-RoCE guest: a Debian kernel with ``rdma_rxe`` and a pyverbs agent, booted in QEMU.

``python -m sim.guest build`` builds (or finds in the cache) the image; :mod:`sim.vm` boots it.
``builder.py`` runs on the host; ``init.sh`` and ``agent.py`` run inside the guest, and files
put in ``extra/`` are installed beside the agent in ``/opt/rxe/``.
"""

from .builder import (DEFAULT_BUILD_DIR, GuestBuildError, GuestImage, build_image, find_qemu,
                      image_key)

__all__ = ["DEFAULT_BUILD_DIR", "GuestBuildError", "GuestImage", "build_image", "find_qemu",
           "image_key"]
