# SPDX-License-Identifier: BSD-2-Clause
"""Model of the retransmit store (:class:`roce_hw.ctrl.retx_store.RetxStore`): pages reserved,
written, read and freed, one input at a time, in the order the store takes them (no Amaranth)."""

from collections import Counter, deque

__all__ = ["RetxStoreModel"]


class RetxStoreModel:
    """The retransmit store's rules.

    A pool of ``size_bytes // page_bytes`` pages, numbered from 0. The free pages are kept in
    one ordered list, initially ``0, 1, ..., n - 1``: a message of ``k`` pages takes the first
    ``k`` of it (``first`` is the first taken, ``last`` the ``k``-th), a message freed puts its
    pages back at the end in the order it had them.

    * :meth:`reserve` ``(qp, length)`` queues a request; requests are answered strictly in
      order: a request of ``ceil(length / page_bytes)`` pages more than the pool or than
      ``qp_cap_bytes // page_bytes`` is refused at once, a zero-length one is empty, another
      is granted as soon as the free list has its pages and the QP's pages plus its own stay
      within the cap; until then it and every request behind it wait. :meth:`grants` returns
      the answers given so far, each ``{first, last, refused, empty}`` (``first`` and ``last``
      0 when there are no pages).
    * :meth:`write` ``(payload)``: the payload packet of the oldest grant with pages whose
      payload has not been written, into its pages (bytes beyond them are dropped and counted
      in :attr:`dropped_bytes`); with no such grant the packet is dropped.
    * :meth:`read` ``(first, start, length)``: the bytes ``start`` to ``length - 1`` of the
      message whose first page is ``first`` (None when the store refuses the request: ``start``
      not a multiple of 256, not below ``length``, or ``length - start`` more than
      ``max_read_bytes``).
    * :meth:`free` ``(first, last)``: the pages of that message go back to the free list and
      its QP's count goes down; a waiting request may then be granted.
    """

    def __init__(self, size_bytes, page_bytes, qp_cap_bytes=None, *, max_read_bytes=None):
        if page_bytes <= 0 or size_bytes % page_bytes or size_bytes < page_bytes:
            raise ValueError("size_bytes must be a positive multiple of page_bytes")
        self.page_bytes = page_bytes
        self.n_pages = size_bytes // page_bytes
        self.cap_pages = self.n_pages if qp_cap_bytes is None else qp_cap_bytes // page_bytes
        self.max_read_bytes = size_bytes if max_read_bytes is None else max_read_bytes
        self.free_list = deque(range(self.n_pages))
        self.pages = {p: bytearray(page_bytes) for p in range(self.n_pages)}
        self.usage = Counter()
        self.chains = {}                # first page -> (qp, [pages])
        self.waiting = deque()          # requests not answered yet
        self.unwritten = deque()        # first pages of grants whose payload is to come
        self._grants = []
        self.dropped_bytes = 0

    def pages_for(self, length):
        """Pages a message of ``length`` bytes takes."""
        return -(-length // self.page_bytes)

    @property
    def free_pages(self):
        """Pages in the free list."""
        return len(self.free_list)

    def reserve(self, qp, length):
        """Queue a request; answer what can be answered."""
        self.waiting.append((qp, length))
        self._serve()

    def grants(self):
        """The answers so far, in request order."""
        return list(self._grants)

    def _serve(self):
        while self.waiting:
            qp, length = self.waiting[0]
            k = self.pages_for(length)
            if length == 0:
                grant = {"first": 0, "last": 0, "refused": 0, "empty": 1}
            elif k > min(self.n_pages, self.cap_pages):
                grant = {"first": 0, "last": 0, "refused": 1, "empty": 0}
            elif k <= len(self.free_list) and self.usage[qp] + k <= self.cap_pages:
                taken = [self.free_list.popleft() for _ in range(k)]
                self.usage[qp] += k
                self.chains[taken[0]] = (qp, taken)
                self.unwritten.append(taken[0])
                grant = {"first": taken[0], "last": taken[-1], "refused": 0, "empty": 0}
            else:
                return
            self.waiting.popleft()
            self._grants.append(grant)

    def write(self, payload):
        """The next payload packet (``bytes``, at least one byte)."""
        if not self.unwritten:
            self.dropped_bytes += len(payload)
            return
        _, chain = self.chains[self.unwritten.popleft()]
        p = self.page_bytes
        for k, page in enumerate(chain):
            part = payload[k * p:(k + 1) * p]
            self.pages[page][:len(part)] = part
        self.dropped_bytes += max(0, len(payload) - len(chain) * p)

    def read(self, first, start, length):
        """The bytes ``start .. length - 1`` of the message at ``first``, or None if refused."""
        if start % 256 or start >= length or length - start > self.max_read_bytes:
            return None
        _, chain = self.chains[first]
        whole = b"".join(bytes(self.pages[p]) for p in chain)
        return whole[start:length]

    def free(self, first, last):
        """Give back the pages of the message at ``first`` (``last`` its last page)."""
        qp, chain = self.chains.pop(first)
        if chain[-1] != last:
            raise ValueError(f"message at page {first} ends at page {chain[-1]}, not {last}")
        if first in self.unwritten:
            raise ValueError(f"message at page {first} freed before its payload was written")
        self.free_list.extend(chain)
        self.usage[qp] -= len(chain)
        self._serve()
