# SPDX-License-Identifier: BSD-2-Clause
"""The host side of the UDP connection manager (pure Python: no Amaranth import).

Run ``python -m roce_hw.host --help`` (or the ``roce-host`` console script). Modules:

* :mod:`roce_hw.host.datagram` -- the 64-byte CM datagram (PROTOCOL.md §7): pack, unpack, decode;
* :mod:`roce_hw.host.client` -- :class:`~roce_hw.host.client.CmClient`, requests over a UDP socket
  with timeouts and retries;
* :mod:`roce_hw.host.verbs` -- the ``verbs`` mode: the host's own RC QP and memory region with
  pyverbs (imported lazily), connection set-up through the CM, the engine's generator traffic
  checked byte for byte;
* :mod:`sim.fake_engine` -- :class:`~sim.fake_engine.FakeEngine`, a UDP server that answers
  with the CM model (:mod:`roce_hw.model.cm`), to try the tool without hardware;
* :mod:`roce_hw.host.__main__` -- the command line.

Only :mod:`~roce_hw.host.datagram` is imported with the package; the others on first use.
"""

import importlib

from . import datagram

__all__ = ["datagram", "client", "verbs", "fake"]


def __getattr__(name):
    if name in ("client", "verbs", "fake"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {name!r} has no attribute {name!r}")
