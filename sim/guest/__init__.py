# SPDX-License-Identifier: BSD-2-Clause
"""The soft-RoCE guest: a Debian kernel with ``rdma_rxe`` and a pyverbs agent, booted in QEMU.

``python -m sim.guest build`` builds (or finds in the cache) the image; :mod:`sim.vm` boots it.
``builder.py`` runs on the host; ``init.sh`` and ``agent.py`` run inside the guest, and files
put in ``extra/`` are installed beside the agent in ``/opt/rxe/``. The repository's pure-Python
code the guest runs (the host tool, :data:`GUEST_PYTHON`) comes in a layer appended at boot
(:func:`write_python_layer`, under :data:`PYLIB`), so it is always the working tree's.
"""

from .builder import (DEFAULT_BUILD_DIR, GUEST_PYTHON, PYLIB, GuestBuildError, GuestImage,
                      build_image, find_qemu, image_key, python_closure, write_python_layer)

__all__ = ["DEFAULT_BUILD_DIR", "GUEST_PYTHON", "PYLIB", "GuestBuildError", "GuestImage",
           "build_image", "find_qemu", "image_key", "python_closure", "write_python_layer"]
