# SPDX-License-Identifier: BSD-2-Clause
"""The retransmit store: the payload of every work request not yet acknowledged, in one pool of
fixed-size pages shared by all QPs, for go-back-N replays."""

from amaranth import *
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from .. import proto
from ..config import check_config
from ..layouts import qp_index_width
from ..lib.arith import FastCounter, event_counter
from ..lib.stream import PacketSignature

__all__ = ["RetxStore", "default_page_bytes", "MIN_PAGE_BYTES", "MAX_PAGE_BYTES",
           "store_reserve_layout", "store_grant_layout", "store_free_layout",
           "store_read_layout"]

#: Smallest page: the smallest PMTU, so that every page holds at least two beats at every
#: width (the next page's number is read during a page, never needed in its first cycle) and a
#: resume's first byte (a multiple of the PMTU) is never in a page's last beat.
MIN_PAGE_BYTES = min(proto.PMTU_BYTES.values())
#: Largest page: the largest PMTU.
MAX_PAGE_BYTES = proto.MAX_PMTU_BYTES
#: Bits of a message length (RoCEv2 messages are at most 2**31 bytes).
LENGTH_BITS = 32


def default_page_bytes(size_bytes):
    """The page size :class:`RetxStore` takes when none is given: ``size_bytes / 256`` rounded
    down to a power of two, within 256 to 4096 bytes -- 256 pages up to 1 MiB (as many
    one-page messages as the completer keeps WRs by default), 4096-byte pages from 1 MiB on
    (shorter walks, smaller page tables)."""
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes < 1:
        raise ValueError(f"size_bytes must be a positive integer, not {size_bytes!r}")
    page = 1 << max(0, (size_bytes // 256).bit_length() - 1)
    return min(MAX_PAGE_BYTES, max(MIN_PAGE_BYTES, page))


def _page_bits(n_pages):
    return max(1, (n_pages - 1).bit_length())


def store_reserve_layout(n_qp):
    """``reserve`` payload: ``{qp, length}`` -- a message of ``length`` bytes (0 to 2**32 - 1)
    of QP ``qp`` asks for its pages."""
    return data.StructLayout({"qp": qp_index_width(n_qp), "length": LENGTH_BITS})


def store_grant_layout(n_pages):
    """``grant`` payload: ``{first, last, refused, empty}`` -- the message's pages run from page
    ``first`` to page ``last`` (linked in the store); ``refused``: it can never fit (larger than
    the store or the QP's cap), no pages; ``empty``: zero length, no pages."""
    pw = _page_bits(n_pages)
    return data.StructLayout({"first": pw, "last": pw, "refused": 1, "empty": 1})


def store_free_layout(n_pages):
    """``free`` payload: ``{first, last}`` as granted."""
    pw = _page_bits(n_pages)
    return data.StructLayout({"first": pw, "last": pw})


def store_read_layout(n_pages):
    """``read`` payload: ``{first, start, length}`` -- the bytes ``start`` to ``length - 1`` of the
    message whose first page is ``first``."""
    return data.StructLayout({"first": _page_bits(n_pages), "start": LENGTH_BITS,
                              "length": LENGTH_BITS})


class RetxStore(wiring.Component):
    """Retransmit store: keeps the payload of every work request (WR) sent and not yet
    acknowledged, so that a go-back-N replay can send it again.

    One pool of ``size_bytes`` in pages of ``page_bytes``, in ``lib.memory`` (block RAM or
    UltraRAM, one data word of the datapath width per row), shared by all QPs: no static split,
    a single QP can hold every page, and optionally at most ``qp_cap_bytes`` per QP. The pages of
    a message form a chain (each page's next page in a RAM); the free pages form one chain too,
    the free list: a message takes the first pages of the free list, which are already linked
    in order, and a message freed is appended at its end as it is. Per page the store keeps its
    next page and, for the first page of a message, ``{qp, pages}``; per QP the pages it holds
    (a RAM row per QP, only with a cap): nothing grows with the QP count but that RAM.

    Life of a message:

    1. ``reserve`` ``{qp, length}`` before the WR is admitted: the pages for the whole message,
       ``ceil(length / page_bytes)`` of them, are taken at once, so the TX path never waits for
       pages in the middle of a message (it could deadlock: the ACKs that free pages may need
       a replay, which needs the TX path). ``grant`` answers in request order:

       * ``{first, last}``: the message's pages;
       * ``refused``: the message can never fit (more pages than the store, or than the QP's
         cap): answered at once (the engine completes the WR LOC_LEN_ERR);
       * ``empty``: a zero-length message takes no page (it has no payload packet, is never
         read and is never freed).

       A request that fits neither the free pages nor its QP's cap now **waits** until frees
       make room, and the requests behind it (of any QP) wait behind it: requests are served
       strictly in order. (Nothing deadlocks: waiting requests hold no pages, and the pages
       they wait for belong to messages already granted, which the TX path sends without
       needing another grant.)
    2. ``wdata``: the message's payload packet (the TX path's payload tap, the whole message as
       one packet), in grant order, written into its pages one beat per cycle. ``wdata.ready``
       is constant 1: the store never slows the TX path. The packet may start in the cycle
       after its grant's transfer. Beats that have no page to go to are dropped and counted
       (``wdata_dropped``): a packet with no granted, unwritten reservation left, a packet
       longer than its pages, beats before a ``first``; nothing outside the message's pages is
       ever written. A packet shorter than its reservation leaves the rest unwritten.
    3. ``read`` ``{first, start, length}`` (a go-back-N replay of the message from byte
       ``start``, a multiple of the PMTU -- 256 bytes -- below ``length``): ``rdata`` gives
       the bytes ``start`` to ``length - 1`` as one packet (:mod:`roce_hw.lib.stream`
       conventions, byte 0 in lane 0), with backpressure. A read must begin after the message's
       payload packet was written. A request with ``start`` not a multiple of 256, ``start``
       not below ``length``, or ``length`` above ``size_bytes`` gives no packet and is counted
       (``reads_refused``).
    4. ``free`` ``{first, last}`` (the WR completed or was flushed): its pages go back to the
       free list in O(1) (a chain append) and its QP's count goes down. A message must not be
       freed before its payload packet has ended on ``wdata`` (the packet would be written
       into pages given to another message), nor while it is being read (its pages may be
       reused at once; the read then gives their new contents).

    Every grant with pages must be followed by exactly one payload packet on ``wdata``, also
    for a WR the TX path then refuses: tapping the TX path's payload input ``i`` does that
    (a refused WR's payload packet is drained from it), and its free must wait for the end of
    that packet.

    Latency and throughput (cycles of the store's clock, measured by
    ``tests/test_retx_store.py::test_latencies``):

    * ``reserve``: a message of ``k`` pages is granted ``k + 4`` cycles after the request's
      transfer when it fits (``grant.valid`` rises then; the next request is taken the cycle
      after the grant's transfer); refused or empty: 4 cycles. Taking ``k`` pages walks the
      free list one page per cycle; a page holds at least two beats, so this keeps ahead of
      the payload of a message of one page or more at every width.
    * ``free``: 3 cycles per free, whatever its length; a free waiting goes before a request
      waiting or new.
    * ``wdata``: one beat per cycle, always.
    * ``read``: the first beat is on ``rdata`` ``max(5, s + 3)`` cycles after the request's
      transfer, ``s = start // page_bytes`` (the walk along the chain to the start page, one
      page per cycle, runs beside the length arithmetic), then one beat per cycle while
      ``rdata.ready`` is high. The next request is taken in the cycle after the last beat
      was read from the RAM (back-to-back reads: about ``max(5, s + 3)`` idle cycles between
      packets). ``rdata.valid`` and its payload come from registers (the data from the RAM's
      output register); ``ready`` reaches the RAM's read enable directly.

    Sizing: the pool must hold everything in flight, the bandwidth-delay product: 100 Gb/s x
    10 us round trip = 125 KB, so 128 KiB (``size_bytes = 131072``); 10 Gb/s x 10 us = 12.5 KB.
    A message takes whole pages, so small messages use more than their length: with the
    default page (:func:`default_page_bytes`: 512 bytes at 128 KiB) 256 one-page messages fit.
    RAM: ``size_bytes * 8`` bits of data in words of ``data_width`` (128 KiB at 512 bits: 2048
    rows of 512 bits; Yosys maps them to 58 RAMB18, about 32 RAMB36 worth), plus per page its
    next page (three read copies) and its message's ``{qp, pages}`` (LUT RAM at 256 pages),
    plus per QP its count when capped (block RAM at 4096 QPs). At 512 bits and 128 KiB with
    16 QPs: 538 LUT, 530 FF (``python -m bench.synth retx_store --no-ecp5``); longest path 5
    cells (``tests/test_timing.py::test_retx_store_longest_path``).

    Parameters
    ----------
    config : EngineConfig
        ``data_width``, ``n_qp``.
    size_bytes : int
        Bytes of the pool: a multiple of ``page_bytes``, at least one page, at most 2**31.
    page_bytes : int or None
        A power of two from 256 to 4096 (None: :func:`default_page_bytes`).
    qp_cap_bytes : int or None
        The most bytes (whole pages: a multiple of ``page_bytes``, from one page to
        ``size_bytes``) one QP may hold; None: no cap (a QP may hold the whole pool).
    write_queue : int
        Grants whose payload packet has not started yet that the store remembers (2 to 256;
        default 16); when that many wait, the next grant waits.

    Members
    -------
    reserve : ``In(stream.Signature(store_reserve_layout(n_qp)))``
    grant : ``Out(stream.Signature(store_grant_layout(n_pages)))``
    wdata : ``In(PacketSignature(data_width))``
        ``ready`` constant 1.
    free : ``In(stream.Signature(store_free_layout(n_pages)))``
    read : ``In(stream.Signature(store_read_layout(n_pages)))``
    rdata : ``Out(PacketSignature(data_width))``
    free_pages : ``Out(range(n_pages + 1))``
        Pages in the free list (for the AckReq rule "the buffer is more than half used").
    wdata_dropped : ``Out(32)``
        Beats of ``wdata`` dropped (wrapping count).
    reads_refused : ``Out(32)``
        ``read`` requests refused (wrapping count).

    Raises
    ------
    ValueError
        A size, page size, cap or queue depth out of its range.
    """

    def __init__(self, config, *, size_bytes, page_bytes=None, qp_cap_bytes=None,
                 write_queue=16):
        self._config = cfg = check_config(config)
        if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or \
                not 1 <= size_bytes <= 1 << 31:
            raise ValueError(f"size_bytes must be an integer from 1 to 2**31, "
                             f"not {size_bytes!r}")
        if page_bytes is None:
            page_bytes = default_page_bytes(size_bytes)
        if isinstance(page_bytes, bool) or not isinstance(page_bytes, int) or \
                not MIN_PAGE_BYTES <= page_bytes <= MAX_PAGE_BYTES or \
                page_bytes & (page_bytes - 1):
            raise ValueError(f"page_bytes must be a power of two from {MIN_PAGE_BYTES} to "
                             f"{MAX_PAGE_BYTES}, not {page_bytes!r}")
        if size_bytes % page_bytes:
            raise ValueError(f"size_bytes ({size_bytes}) must be a whole number of pages of "
                             f"{page_bytes} bytes")
        if qp_cap_bytes is not None and (
                isinstance(qp_cap_bytes, bool) or not isinstance(qp_cap_bytes, int)
                or not page_bytes <= qp_cap_bytes <= size_bytes or qp_cap_bytes % page_bytes):
            raise ValueError(f"qp_cap_bytes must be None or a whole number of pages of "
                             f"{page_bytes} bytes from one page to size_bytes ({size_bytes}), "
                             f"not {qp_cap_bytes!r}")
        if isinstance(write_queue, bool) or not isinstance(write_queue, int) or \
                not 2 <= write_queue <= 256:
            raise ValueError(f"write_queue must be an integer from 2 to 256, "
                             f"not {write_queue!r}")
        self._size_bytes = size_bytes
        self._page_bytes = page_bytes
        self._qp_cap_bytes = qp_cap_bytes
        self._write_queue = write_queue
        n_pages = size_bytes // page_bytes
        self._n_pages = n_pages
        # a read's beat counter: as many beats as the pool has rows, rounded up to a power of
        # two (a longer read is refused)
        self._beats_bits = (size_bytes // (cfg.data_width // 8) - 1).bit_length()
        super().__init__({
            "reserve": In(stream.Signature(store_reserve_layout(cfg.n_qp))),
            "grant": Out(stream.Signature(store_grant_layout(n_pages))),
            "wdata": In(PacketSignature(cfg.data_width)),
            "free": In(stream.Signature(store_free_layout(n_pages))),
            "read": In(stream.Signature(store_read_layout(n_pages))),
            "rdata": Out(PacketSignature(cfg.data_width)),
            "free_pages": Out(range(n_pages + 1)),
            "wdata_dropped": Out(32),
            "reads_refused": Out(32),
        })

    @property
    def size_bytes(self):
        """Bytes of the pool."""
        return self._size_bytes

    @property
    def page_bytes(self):
        """Bytes of a page."""
        return self._page_bytes

    @property
    def n_pages(self):
        """Pages of the pool."""
        return self._n_pages

    @property
    def max_read_bytes(self):
        """The longest read (``length - start``) taken: the pool's rows rounded up to a
        power of two, in bytes; a longer one is refused."""
        return (self._config.data_width // 8) << self._beats_bits

    @property
    def qp_cap_bytes(self):
        """Bytes one QP may hold (None: no cap)."""
        return self._qp_cap_bytes

    def elaborate(self, platform):
        cfg = self._config
        m = Module()
        width = cfg.data_width
        nbytes = width // 8
        lb = (nbytes - 1).bit_length()                 # log2(bytes per beat)
        lp = (self._page_bytes - 1).bit_length()       # log2(bytes per page)
        lbp = lp - lb                                  # log2(beats per page), >= 1
        n = self._n_pages
        pw = _page_bits(n)
        cw = n.bit_length()                            # a count of pages, 0..n
        qw = qp_index_width(cfg.n_qp)
        capped = self._qp_cap_bytes is not None
        cap = self._qp_cap_bytes // self._page_bytes if capped else n
        limit = min(n, cap)

        # ------------------------------------------------------------ storage
        m.submodules.words = words = memory.Memory(shape=width, depth=n << lbp, init=[])
        m.submodules.links = links = memory.Memory(
            shape=pw, depth=n, init=[(p + 1) % n for p in range(n)])
        meta_layout = data.StructLayout({"qp": qw, "pages": cw})
        m.submodules.meta = meta = memory.Memory(shape=meta_layout, depth=n, init=[])
        wd_wr = words.write_port()
        wd_rd = words.read_port()
        ln_wr = links.write_port()
        ln_a = links.read_port()        # the reserve walk
        ln_w = links.read_port()        # the write side's next page
        ln_r = links.read_port()        # the read side's walk and next page
        mt_wr, mt_rd = meta.write_port(), meta.read_port()
        if capped:
            m.submodules.usage = usage = memory.Memory(shape=cw, depth=max(2, 1 << qw),
                                                       init=[])
            us_wr, us_rd = usage.write_port(), usage.read_port()

        # grants whose payload has not started: {first, more = pages - 1}
        wq_layout = data.StructLayout({"first": pw, "more": cw})
        m.submodules.wqueue = wq = fifo.SyncFIFO(width=Shape.cast(wq_layout).width,
                                                 depth=self._write_queue)
        wq_in = Signal(wq_layout)
        wq_out = Signal(wq_layout)
        wq_push = Signal()
        m.d.comb += [wq.w_data.eq(wq_in), wq_out.eq(wq.r_data), wq.w_en.eq(wq_push)]

        # ------------------------------------------------------------ pool: reserve and free
        head = Signal(pw, init=0)
        tail = Signal(pw, init=n - 1)
        n_free = Signal(cw, init=n)
        m.d.comb += self.free_pages.eq(n_free)

        r_qp = Signal(qw)
        r_hi = Signal(cw)               # length >> lp, low bits
        r_hi_big = Signal()             # length >> lp has bits above those
        r_frac = Signal()               # length not a whole number of pages
        r_pages = Signal(cw + 1)
        r_more = Signal(cw + 1)         # pages - 1
        r_big = Signal()
        r_zero = Signal()
        r_refuse = Signal()
        r_fit_pool = Signal()
        r_sum = Signal(cw + 1)          # the QP's pages with this message's
        r_pending = Signal()            # a request taken, not yet granted
        w_left = Signal(cw)             # reserve walk: steps left
        w_end = Signal()                # no step left (w_left == 0)
        nf_delta = Signal(cw + 1)       # what the next take / free adds to n_free
        w_prev = Signal(pw)             # the page before the one on ln_a's data
        g_valid = Signal()
        g = Signal(store_grant_layout(n))
        m.d.comb += [self.grant.valid.eq(g_valid), self.grant.payload.eq(g)]

        f_first = Signal(pw)
        f_last = Signal(pw)
        f_qp = Signal(qw)
        f_pages = Signal(cw)

        walking = Signal()
        m.d.comb += ln_a.addr.eq(Mux(walking, ln_a.data, head))
        mt_addr_idle = Signal()
        m.d.comb += mt_rd.addr.eq(Mux(mt_addr_idle, self.free.payload.first, f_first))
        us_addr_meta = Signal()
        us_addr_free = Signal()
        if capped:
            m.d.comb += us_rd.addr.eq(Mux(us_addr_meta, mt_rd.data.qp,
                                          Mux(us_addr_free, f_qp, r_qp)))
            qp_pages = us_rd.data
        else:
            qp_pages = C(0, cw)

        with m.FSM(name="pool"):
            with m.State("Idle"):
                m.d.comb += [
                    mt_addr_idle.eq(1),
                    self.free.ready.eq(1),
                    self.reserve.ready.eq(~self.free.valid & ~r_pending),
                ]
                res = self.reserve.payload
                with m.If(self.free.valid):
                    m.d.sync += [f_first.eq(self.free.payload.first),
                                 f_last.eq(self.free.payload.last)]
                    m.next = "FreeMeta"
                with m.Elif(r_pending):
                    m.next = "Check"            # try again: a free may have made room
                with m.Elif(self.reserve.valid):
                    m.d.sync += [
                        r_qp.eq(res.qp),
                        r_hi.eq(res.length[lp:lp + cw]),
                        r_hi_big.eq(res.length[lp + cw:] != 0),
                        r_frac.eq(res.length[:lp] != 0),
                        r_pending.eq(1),
                    ]
                    m.next = "Size"

            with m.State("Size"):
                m.d.sync += [
                    r_pages.eq(r_hi + r_frac),
                    r_more.eq(r_hi - ~r_frac),
                    r_big.eq(r_hi_big),
                    r_zero.eq(~r_hi_big & ~r_frac & (r_hi == 0)),
                ]
                m.next = "Check"

            with m.State("Check"):
                # (the QP's count is on the usage read port: its address, r_qp, has been
                # stable for a cycle, and no write to it is in flight)
                m.d.sync += [
                    r_refuse.eq(r_big | (r_pages > limit)),
                    r_fit_pool.eq(r_pages <= n_free),
                    r_sum.eq(qp_pages + r_pages),
                ]
                m.next = "Decide"

            with m.State("Decide"):
                fits = Signal()
                m.d.comb += fits.eq(r_fit_pool & (r_sum <= cap) & wq.w_rdy)
                with m.If(r_refuse | r_zero):
                    m.d.sync += [g.refused.eq(~r_zero), g.empty.eq(r_zero), g.first.eq(0),
                                 g.last.eq(0), g_valid.eq(1), r_pending.eq(0)]
                    m.next = "Grant"
                with m.Elif(fits):
                    m.d.sync += [w_left.eq(r_more), w_end.eq(r_more == 0), w_prev.eq(head),
                                 nf_delta.eq(~r_more)]       # - pages = ~(pages - 1)
                    m.next = "Walk"
                with m.Else():
                    m.next = "Idle"             # wait (frees go first)

            with m.State("Walk"):
                # ln_a's data is the page after w_prev; w_left steps to the message's last
                m.d.comb += walking.eq(~w_end)
                with m.If(~w_end):
                    m.d.sync += [w_prev.eq(ln_a.data), w_left.eq(w_left - 1),
                                 w_end.eq(w_left == 1)]
                with m.Else():
                    m.d.comb += [
                        mt_wr.addr.eq(head), mt_wr.data.qp.eq(r_qp),
                        mt_wr.data.pages.eq(r_pages), mt_wr.en.eq(1),
                    ]
                    if capped:
                        m.d.comb += [us_wr.addr.eq(r_qp), us_wr.data.eq(r_sum), us_wr.en.eq(1)]
                    m.d.sync += [
                        head.eq(ln_a.data),
                        n_free.eq(n_free + nf_delta),
                        g.first.eq(head), g.last.eq(w_prev), g.refused.eq(0), g.empty.eq(0),
                        g_valid.eq(1), r_pending.eq(0),
                        wq_in.first.eq(head), wq_in.more.eq(r_more), wq_push.eq(1),
                    ]
                    m.next = "Grant"

            with m.State("Grant"):
                m.d.sync += wq_push.eq(0)
                with m.If(self.grant.ready):
                    m.d.sync += g_valid.eq(0)
                    m.next = "Idle"

            with m.State("FreeMeta"):
                # the message's {qp, pages} is on the meta read port
                m.d.comb += us_addr_meta.eq(1)
                m.d.sync += [f_qp.eq(mt_rd.data.qp), f_pages.eq(mt_rd.data.pages),
                             nf_delta.eq(mt_rd.data.pages)]
                m.next = "FreeAppend"

            with m.State("FreeAppend"):
                m.d.comb += us_addr_free.eq(1)
                if capped:
                    m.d.comb += [us_wr.addr.eq(f_qp), us_wr.data.eq(qp_pages - f_pages),
                                 us_wr.en.eq(1)]
                with m.If(n_free == 0):
                    m.d.sync += head.eq(f_first)
                with m.Else():
                    # (the free list's tail is a free page: no chain of a message changes)
                    m.d.comb += [ln_wr.addr.eq(tail), ln_wr.data.eq(f_first), ln_wr.en.eq(1)]
                m.d.sync += [tail.eq(f_last), n_free.eq(n_free + nf_delta)]
                m.next = "Idle"

        # ------------------------------------------------------------ write side
        wd = self.wdata
        w_in = Signal()                 # inside a packet with pages left to write
        w_page = Signal(pw)
        w_beat = Signal(lbp)
        w_more = Signal(cw)             # pages of the reservation after w_page
        start = Signal()
        ok = Signal()
        m.d.comb += [
            wd.ready.eq(1),
            start.eq(wd.valid & wd.payload.first),
            ok.eq(Mux(start, wq.r_rdy, w_in)),
            wq.r_en.eq(start),
            wd_wr.addr.eq(Mux(start, Cat(C(0, lbp), wq_out.first), Cat(w_beat, w_page))),
            wd_wr.data.eq(wd.payload.data),
            wd_wr.en.eq(wd.valid & ok),
            # the page after the one being written (read during it: a page is >= 2 beats)
            ln_w.addr.eq(Mux(start, wq_out.first, w_page)),
        ]
        with m.If(wd.valid):
            with m.If(start):
                m.d.sync += [w_page.eq(wq_out.first), w_beat.eq(1), w_more.eq(wq_out.more),
                             w_in.eq(wq.r_rdy & ~wd.payload.last)]
            with m.Else():
                m.d.sync += w_beat.eq(w_beat + 1)
                with m.If(w_beat.all()):
                    m.d.sync += [w_page.eq(ln_w.data), w_more.eq(w_more - 1)]
                    with m.If(w_more == 0):
                        m.d.sync += w_in.eq(0)  # the reservation is full
                with m.If(wd.payload.last):
                    m.d.sync += w_in.eq(0)
        m.d.comb += self.wdata_dropped.eq(event_counter(m, 32, wd.valid & ~ok, "n_dropped"))

        # ------------------------------------------------------------ read side
        rq = self.read.payload
        rd_first = Signal(pw)
        rd_start = Signal(LENGTH_BITS)
        rd_length = Signal(LENGTH_BITS)
        rd_dm1 = Signal(LENGTH_BITS + 1)        # length - start - 1 (negative: nothing)
        rd_odd = Signal()
        rd_skip = Signal(cw)                    # pages to walk to the start page
        rd_page = Signal(pw)
        rd_beat = Signal(lbp)
        rd_tkeep = Signal(nbytes)               # keep of the last beat
        beats_w = self._beats_bits
        rd_left = FastCounter(m, beats_w, "rd_left", down=True)    # beats after this one
        rd_is_last = Signal()
        rd_first_beat = Signal()
        follow = Signal()
        m.d.comb += ln_r.addr.eq(Mux(follow, ln_r.data, rd_page))

        o_valid = Signal()
        o_keep = Signal(nbytes)
        o_first = Signal()
        o_last = Signal()
        advance = Signal()
        issue = Signal()
        m.d.comb += [
            advance.eq(~o_valid | self.rdata.ready),
            wd_rd.en.eq(advance),
            wd_rd.addr.eq(Cat(rd_beat, rd_page)),
            self.rdata.valid.eq(o_valid),
            self.rdata.payload.data.eq(wd_rd.data),
            self.rdata.payload.keep.eq(o_keep),
            self.rdata.payload.first.eq(o_first),
            self.rdata.payload.last.eq(o_last),
        ]
        with m.If(advance):
            m.d.sync += o_valid.eq(issue)
            m.d.sync += [o_keep.eq(Mux(rd_is_last, rd_tkeep, (1 << nbytes) - 1)),
                         o_first.eq(rd_first_beat), o_last.eq(rd_is_last)]

        refused = Signal()
        # length - start - 1 in 33 bits (bit 32: negative, nothing to send), one 11-bit piece
        # per cycle with its carry registered (a 33-bit carry chain is 9 cells, a piece and its
        # carry 3): the first piece from the request itself, the others in states Subtract1,
        # Subtract2
        pieces = [(lo, lo + 11) for lo in range(0, LENGTH_BITS + 1, 11)]
        carry = Signal()

        def subtract(m, k, length, start):
            lo, hi = pieces[k]
            total = Signal(hi - lo + 1, name=f"rd_sub{k}")
            m.d.comb += total.eq(Cat(length, C(0, 1))[lo:hi] + Cat(~start, C(1, 1))[lo:hi]
                                 + (carry if k else C(0, 1)))
            m.d.sync += [rd_dm1[lo:hi].eq(total[:hi - lo]), carry.eq(total[-1])]

        # the walk to the start page, one page per cycle, from the second cycle after the
        # request (ln_r's data is then the page after the first), beside the subtraction
        step = Signal()
        rd_skip_zero = Signal()                     # rd_skip == 0
        rd_skip_one = Signal()                      # rd_skip == 1
        with m.If(step & ~rd_skip_zero):
            m.d.comb += follow.eq(1)
            m.d.sync += [rd_page.eq(ln_r.data), rd_skip.eq(rd_skip - 1),
                         rd_skip_zero.eq(rd_skip_one), rd_skip_one.eq(rd_skip == 2)]
        walked = Signal()
        m.d.comb += walked.eq(rd_skip_zero | rd_skip_one)  # done by the end of this cycle

        with m.FSM(name="reader"):
            with m.State("Idle"):
                m.d.comb += self.read.ready.eq(1)
                with m.If(self.read.valid):
                    subtract(m, 0, rq.length, rq.start)
                    m.d.sync += [
                        rd_page.eq(rq.first), rd_start.eq(rq.start), rd_length.eq(rq.length),
                        rd_odd.eq(rq.start[:8] != 0),
                        rd_skip.eq(rq.start[lp:lp + cw]),
                        rd_skip_zero.eq(rq.start[lp:lp + cw] == 0),
                        rd_skip_one.eq(rq.start[lp:lp + cw] == 1),
                        rd_beat.eq(rq.start[lb:lp]),
                    ]
                    m.next = "Subtract1"
            for k in range(1, len(pieces)):
                with m.State(f"Subtract{k}"):
                    subtract(m, k, rd_length, rd_start)
                    m.d.comb += step.eq(k > 1)
                    m.next = f"Subtract{k + 1}" if k + 1 < len(pieces) else "Check"
            with m.State("Check"):
                m.d.comb += step.eq(1)
                tkeep = Signal(nbytes)
                for i in range(nbytes):
                    m.d.comb += tkeep[i].eq(rd_dm1[:lb] >= i)
                beats_m1 = rd_dm1[lb:lb + beats_w]
                m.d.sync += [rd_tkeep.eq(tkeep), rd_is_last.eq(beats_m1 == 0),
                             rd_first_beat.eq(1)]
                m.d.sync += rd_left.load(beats_m1)
                # (more beats than the counter holds: longer than the store)
                too_long = rd_dm1[lb + beats_w:LENGTH_BITS] != 0
                with m.If(rd_dm1[-1] | too_long | rd_odd):
                    m.d.comb += refused.eq(1)
                    m.next = "Idle"
                with m.Elif(walked):
                    m.next = "Stream"
                with m.Else():
                    m.next = "Walk"
            with m.State("Walk"):
                m.d.comb += step.eq(1)
                with m.If(walked):
                    m.next = "Stream"
            with m.State("Stream"):
                m.d.comb += issue.eq(advance)
                with m.If(advance):
                    m.d.sync += [rd_beat.eq(rd_beat + 1), rd_first_beat.eq(0),
                                 rd_is_last.eq(rd_left.value == 1)]
                    m.d.sync += rd_left.advance()
                    with m.If(rd_beat.all()):
                        m.d.sync += rd_page.eq(ln_r.data)
                    with m.If(rd_is_last):
                        m.next = "Idle"
        m.d.comb += self.reads_refused.eq(event_counter(m, 32, refused, "n_refused"))
        return m
