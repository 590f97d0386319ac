# SPDX-License-Identifier: BSD-2-Clause
"""Golden model of the on-chip traffic generator (:class:`roce_hw.ctrl.generator.TrafficGenerator`):
the work requests and payloads a start command produces (no Amaranth).

What the generator sends is the connection manager's "generator traffic" (the txmeta command):
message ``n`` (``0 .. count - 1``) is a work request with ``wr_id`` = ``n``, ``length`` = ``L``,
``imm`` = ``n``, ``remote_addr`` = ``remote_va + n * L`` (mod 2**64), the command's ``r_key``,
opcode and QP, neither signaled nor solicited; its payload (``L`` > 0) is byte ``k`` = ``(k + n)
& 0xFF``. The hardware puts ``imm`` = ``n`` in every request (the TX engine reads it only for the
``*_WITH_IMM`` opcodes).
"""

from dataclasses import asdict, dataclass

from .. import proto

__all__ = ["GenCommand", "generator_wr", "generator_payload", "generator_messages",
           "ADDR_MASK"]

#: ``remote_addr`` wraps modulo 2**64.
ADDR_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class GenCommand:
    """A command of the generator's ``cmd`` port (:func:`roce_hw.verbs.gen_cmd_layout`).

    ``start`` = 1 starts a run of ``count`` messages of ``length`` bytes on QP index ``qp``,
    ``period`` cycles apart at the earliest; ``start`` = 0 stops the run (the other fields are
    then ignored)."""
    start: int = 1
    qp: int = 0
    opcode: int = 0
    length: int = 0
    count: int = 1
    period: int = 0
    remote_va: int = 0
    r_key: int = 0

    def fields(self):
        """The command as the ``cmd`` port's payload (a dict)."""
        return asdict(self)


def generator_wr(cmd, n):
    """The work request of message ``n`` of ``cmd``, as a dict of
    :func:`roce_hw.verbs.wr_layout` fields."""
    if not 0 <= n < 1 << 32:
        raise ValueError(f"message index {n} does not fit 32 bits")
    return {"wr_id": n, "opcode": cmd.opcode, "qp": cmd.qp,
            "remote_addr": (cmd.remote_va + n * cmd.length) & ADDR_MASK, "r_key": cmd.r_key,
            "length": cmd.length, "imm": n, "signaled": 0, "solicited": 0}


generator_payload = proto.generator_payload


def generator_messages(cmd, count=None):
    """``[(wr, payload)]`` of the first ``count`` (default ``cmd.count``) messages of ``cmd``
    (``payload`` is ``b""`` for ``length`` 0: no payload packet)."""
    count = cmd.count if count is None else count
    return [(generator_wr(cmd, n), generator_payload(n, cmd.length)) for n in range(count)]
