// SPDX-License-Identifier: BSD-2-Clause
// Stream-level harness for the engine tops (roce_engine.v, roce_tx.v) compiled by Verilator.
//
// The harness owns the cycle loop and the bus-functional models of every stream; Python talks to
// it in transactions through the plain C API at the end of this file (ctypes). No Python code
// runs per cycle. sim/backend.py has the same loop for Amaranth's simulator (AmaranthEngine):
// the two must stay step for step identical, random draws included (tests/test_backends.py).
//
// Built with `verilator --prefix Vtop`, so the model class is Vtop whatever the module name.
// ports_gen.h is written by sim/verilator/__init__.py from the port list of the generated top:
// X-macro lists of the WR, resume and QP context fields and the counters, and HAS_* flags for
// the optional streams, so that the harness follows the design's port set.
//
// One cycle (Harness::step):
//   1. drive every input for this cycle (producers: valid/data, consumers: ready, each with a
//      seeded random idle/stall), clk = 0, eval();
//   2. sample every handshake (valid && ready) and record the transfers, stamped with the cycle;
//   3. clk = 1, eval(): the rising edge; cycle++.
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <type_traits>
#include <vector>

#include "Vtop.h"
#include "verilated.h"
#include "ports_gen.h"

// ---- port access helpers: integral ports up to 64 bits, VlWide<N> above ----------------------
template <typename T> static inline void clear(T& v) {
    if constexpr (std::is_integral_v<T>) v = 0;
    else for (auto& w : v.m_storage) w = 0;
}
// bytes[0..n) into lanes 0..n-1 (wire byte k in bits 8k+7..8k); the other lanes are 0.
template <typename T> static inline void put_bytes(T& v, const uint8_t* b, int n) {
    if constexpr (std::is_integral_v<T>) {
        uint64_t x = 0;
        std::memcpy(&x, b, n);               // little-endian host
        v = T(x);
    } else {
        clear(v);
        std::memcpy(&v.m_storage[0], b, n);  // 32-bit words, little-endian host
    }
}
template <typename T> static inline void get_bytes(const T& v, uint8_t* b, int n) {
    if constexpr (std::is_integral_v<T>) {
        uint64_t x = uint64_t(v);
        std::memcpy(b, &x, n);
    } else {
        std::memcpy(b, &v.m_storage[0], n);
    }
}
// keep = n ones from bit 0.
template <typename T> static inline void put_keep(T& v, int n) {
    if constexpr (std::is_integral_v<T>) {
        v = n >= 64 ? T(~uint64_t(0)) : T((uint64_t(1) << n) - 1);
    } else {
        clear(v);
        for (int i = 0; i < n; ++i) v[i / 32] |= 1u << (i % 32);
    }
}
// (ones from bit 0, total ones): keep is well formed when both are equal and non-zero.
template <typename T> static inline void keep_count(const T& v, int lanes, int& low, int& all) {
    if constexpr (std::is_integral_v<T>) {
        uint64_t x = uint64_t(v);
        if (lanes < 64) x &= (uint64_t(1) << lanes) - 1;
        all = __builtin_popcountll(x);
        low = ~x == 0 ? 64 : __builtin_ctzll(~x);
    } else {
        low = all = 0;
        bool run = true;
        for (int i = 0; i < (lanes + 31) / 32; ++i) {    // 32-bit words of a VlWide
            uint32_t w = v[i];
            all += __builtin_popcount(w);
            if (run) {
                if (w == 0xFFFFFFFFu) low += 32;
                else { low += __builtin_ctz(~w); run = false; }
            }
        }
    }
}

// ---- the random idle/stall source: splitmix64, one generator per stream ------------------------
// Same arithmetic in sim/backend.py (Splitmix64): an idle/stall is drawn only when the stream's
// probability is non-zero and it has something to offer (producers) or every cycle (consumers).
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
struct Rng {
    uint64_t state = 0, threshold = 0;   // draw < threshold (of 2^32) -> idle/stall
    bool draw() {
        if (!threshold) return false;
        state += 0x9E3779B97F4A7C15ull;
        return (mix64(state) >> 32) < threshold;
    }
};
// Stream indices (sim/backend.py STREAMS).
enum { S_WR, S_PAYLOAD, S_RX, S_RESUME, S_TX, S_STATUS, S_OTHER, N_STREAMS };

// Framing errors of one output frame (bit mask, sim/backend.py FRAMING_ERRORS).
enum { E_SHORT_BEAT = 1, E_KEEP_HOLE = 2, E_EMPTY_BEAT = 4 };

struct Frame {
    std::vector<uint8_t> bytes;
    uint64_t first_cycle = 0, last_cycle = 0, beats = 0, ready_first = 0, ready_last = 0;
    int tuser = 0;          // tuser of the last beat (tx: aborted frame)
    int errors = 0;
};

struct WrReq { uint64_t f[N_WR_FIELDS]; };
struct ResumeReq { uint64_t f[N_RESUME_FIELDS > 0 ? N_RESUME_FIELDS : 1]; };
struct MgmtReq { uint64_t qp, write; uint64_t ctx[N_CTX_FIELDS]; };
struct MgmtRsp { uint64_t cycle, qp, write, error; uint64_t ctx[N_CTX_FIELDS]; };
struct Status { uint64_t cycle, wr_id, qp, status; };
struct RxFrame { std::vector<uint8_t> bytes; uint64_t earliest; int tuser; };
struct Snapshot { uint64_t cycle; uint64_t c[N_COUNTERS > 0 ? N_COUNTERS : 1]; };

struct Harness {
    VerilatedContext ctx;
    Vtop top{&ctx};
    int lanes;
    uint64_t cycle = 0;
    Rng rng[N_STREAMS];
    bool wr_waits_mgmt = true;  // hold WRs, resumes and payload while management is pending

    // inputs
    std::deque<WrReq> wrs;
    std::deque<ResumeReq> resumes;
    std::deque<std::vector<uint8_t>> payloads;
    size_t pl_pos = 0;          // byte offset into payloads.front()
    std::deque<RxFrame> rx;
    size_t rx_pos = 0;
    std::deque<MgmtReq> mgmt;
    std::deque<uint64_t> ip_ids;
    bool mgmt_outstanding = false;
    // producers' "offering" state: valid may not drop before the transfer
    bool wr_on = false, rs_on = false, pl_on = false, rx_on = false, mgmt_on = false,
         ip_on = false;
    // outputs
    std::deque<Frame> tx, other;
    Frame tx_cur, other_cur;
    bool tx_in = false, other_in = false;
    std::deque<Status> statuses;
    std::deque<MgmtRsp> mgmt_rsps;
    std::deque<uint64_t> wr_accepts;
    std::deque<Snapshot> snapshots;
    uint64_t snapshot_period = 0;
    uint64_t tx_frames_total = 0, tx_beats_total = 0, tx_ready_cycles = 0;
    uint64_t wrs_accepted = 0, resumes_accepted = 0;
    // the last cycle with a tx beat, an input queued or a tx frame begun (rh_run's quiet)
    uint64_t quiet_since = 0;

    explicit Harness(uint64_t seed) {
        lanes = int(sizeof(top.s_axis_payload_tdata));
        for (int i = 0; i < N_STREAMS; ++i) rng[i].state = mix64(seed + mix64(uint64_t(i) + 1));
        top.clk = 0;
        top.rst = 0;
    }

    void reset(int n) {
        top.rst = 1;
        for (int i = 0; i < n; ++i) { top.clk = 0; top.eval(); top.clk = 1; top.eval(); }
        top.rst = 0;
    }

    bool inputs_pending() const {
        return !wrs.empty() || !resumes.empty() || !payloads.empty() || !rx.empty() ||
               !mgmt.empty() || mgmt_outstanding || !ip_ids.empty();
    }

    void drive() {
        bool gate = wr_waits_mgmt && (!mgmt.empty() || mgmt_outstanding);
        if (!wr_on && !wrs.empty() && !gate && !rng[S_WR].draw()) {
            const WrReq& w = wrs.front();
            int i = 0;
#define X(name) top.s_wr_##name = w.f[i++];
            WR_FIELDS(X)
#undef X
            wr_on = true;
        }
        top.s_wr_valid = wr_on;
#if HAS_RESUME
        if (!rs_on && !resumes.empty() && !gate && !rng[S_RESUME].draw()) {
            const ResumeReq& r = resumes.front();
            int i = 0;
#define X(name) top.s_resume_##name = r.f[i++];
            RESUME_FIELDS(X)
#undef X
            rs_on = true;
        }
        top.s_resume_valid = rs_on;
#endif
        if (!pl_on && !payloads.empty() && !gate && !rng[S_PAYLOAD].draw()) {
            const auto& p = payloads.front();
            int n = int(std::min<size_t>(lanes, p.size() - pl_pos));
            put_bytes(top.s_axis_payload_tdata, p.data() + pl_pos, n);
            put_keep(top.s_axis_payload_tkeep, n);
            top.s_axis_payload_tlast = pl_pos + n >= p.size();
            pl_on = true;
        }
        top.s_axis_payload_tvalid = pl_on;
#if HAS_IP_ID_LOAD
        if (!ip_on && !ip_ids.empty()) {
            top.s_ip_id_load_value = ip_ids.front();
            ip_on = true;
        }
        top.s_ip_id_load_valid = ip_on;
#endif
#if HAS_RX
        if (!rx_on && !rx.empty() && rx.front().earliest <= cycle && !rng[S_RX].draw()) {
            const auto& f = rx.front();
            int n = int(std::min<size_t>(lanes, f.bytes.size() - rx_pos));
            put_bytes(top.s_axis_rx_tdata, f.bytes.data() + rx_pos, n);
            put_keep(top.s_axis_rx_tkeep, n);
            top.s_axis_rx_tlast = rx_pos + n >= f.bytes.size();
            top.s_axis_rx_tuser = f.tuser && top.s_axis_rx_tlast;
            rx_on = true;
        }
        top.s_axis_rx_tvalid = rx_on;
#endif
        // s_qp_mgmt_req: one request at a time, the next after the previous response
        if (!mgmt_on && !mgmt_outstanding && !mgmt.empty()) {
            const MgmtReq& r = mgmt.front();
            top.s_qp_mgmt_req_qp = r.qp;
            top.s_qp_mgmt_req_write = r.write;
            int i = 0;
#define X(name) top.s_qp_mgmt_req_ctx_##name = r.ctx[i++];
            CTX_FIELDS(X)
#undef X
            mgmt_on = true;
        }
        top.s_qp_mgmt_req_valid = mgmt_on;
        // consumers
        top.m_axis_tx_tready = !rng[S_TX].draw();
        top.m_status_ready = !rng[S_STATUS].draw();
#if HAS_RX_OTHER
        top.m_axis_rx_other_tready = !rng[S_OTHER].draw();
#endif
        top.m_qp_mgmt_rsp_ready = 1;
    }

    void sample() {
        if (snapshot_period && cycle % snapshot_period == 0) {
            Snapshot s{cycle, {}};
            int i = 0;
#define X(name) s.c[i++] = top.name;
            COUNTERS(X)
#undef X
            (void)i;
            snapshots.push_back(s);
        }
        if (wr_on && top.s_wr_ready) {
            wrs.pop_front(); wr_on = false; ++wrs_accepted; wr_accepts.push_back(cycle);
        }
#if HAS_RESUME
        if (rs_on && top.s_resume_ready) { resumes.pop_front(); rs_on = false; ++resumes_accepted; }
#endif
        if (pl_on && top.s_axis_payload_tready) {
            pl_on = false;
            pl_pos += lanes;
            if (pl_pos >= payloads.front().size()) { payloads.pop_front(); pl_pos = 0; }
        }
#if HAS_IP_ID_LOAD
        if (ip_on && top.s_ip_id_load_ready) { ip_ids.pop_front(); ip_on = false; }
#endif
#if HAS_RX
        if (rx_on && top.s_axis_rx_tready) {
            rx_on = false;
            rx_pos += lanes;
            if (rx_pos >= rx.front().bytes.size()) { rx.pop_front(); rx_pos = 0; }
        }
#endif
        if (mgmt_on && top.s_qp_mgmt_req_ready) {
            mgmt.pop_front(); mgmt_on = false; mgmt_outstanding = true;
        }
        if (top.m_qp_mgmt_rsp_valid && top.m_qp_mgmt_rsp_ready) {
            MgmtRsp r{cycle, top.m_qp_mgmt_rsp_qp, top.m_qp_mgmt_rsp_write,
                      top.m_qp_mgmt_rsp_error, {}};
            int i = 0;
#define X(name) r.ctx[i++] = top.m_qp_mgmt_rsp_ctx_##name;
            CTX_FIELDS(X)
#undef X
            mgmt_rsps.push_back(r);
            mgmt_outstanding = false;
        }
        if (top.m_status_valid && top.m_status_ready)
            statuses.push_back({cycle, top.m_status_wr_id, top.m_status_qp, top.m_status_status});
        tx_ready_cycles += top.m_axis_tx_tready;
        if (top.m_axis_tx_tvalid && top.m_axis_tx_tready) {
            take_beat(tx_cur, tx_in, tx, top.m_axis_tx_tdata, top.m_axis_tx_tkeep,
                      top.m_axis_tx_tlast, top.m_axis_tx_tuser);
            ++tx_beats_total;
            if (top.m_axis_tx_tlast) ++tx_frames_total;
        }
#if HAS_RX_OTHER
        if (top.m_axis_rx_other_tvalid && top.m_axis_rx_other_tready)
            take_beat(other_cur, other_in, other, top.m_axis_rx_other_tdata,
                      top.m_axis_rx_other_tkeep, top.m_axis_rx_other_tlast,
                      top.m_axis_rx_other_tuser);
#endif
    }

    template <typename D, typename K>
    void take_beat(Frame& cur, bool& in, std::deque<Frame>& out, const D& data, const K& keep,
                   bool last, bool tuser) {
        if (!in) { cur = Frame(); cur.first_cycle = cycle; cur.ready_first = tx_ready_cycles;
                   in = true; }
        int low, all;
        keep_count(keep, lanes, low, all);
        if (all == 0) cur.errors |= E_EMPTY_BEAT;
        else if (low != all) cur.errors |= E_KEEP_HOLE;
        else if (!last && low != lanes) cur.errors |= E_SHORT_BEAT;
        size_t at = cur.bytes.size();
        cur.bytes.resize(at + lanes);
        get_bytes(data, cur.bytes.data() + at, lanes);
        cur.bytes.resize(at + low);
        ++cur.beats;
        if (last) {
            cur.last_cycle = cycle;
            cur.ready_last = tx_ready_cycles;
            cur.tuser = tuser;
            out.push_back(std::move(cur));
            cur = Frame();
            in = false;
        }
    }

    inline void step() {
        uint64_t beats_before = tx_beats_total;
        drive();
        top.clk = 0;
        top.eval();
        sample();
        top.clk = 1;
        top.eval();
        ++cycle;
        if (tx_beats_total != beats_before || inputs_pending() || tx_in) quiet_since = cycle;
    }
};

// ---- C API ------------------------------------------------------------------------------------
extern "C" {

int rh_n_fields(int which) {
    switch (which) {
        case 0: return N_WR_FIELDS;
        case 1: return N_CTX_FIELDS;
        case 2: return N_COUNTERS;
        case 3: return N_RESUME_FIELDS;
    }
    return 0;
}
// Comma-separated names, in the order the arrays below use: 0 WR fields, 1 QP context fields,
// 2 counters (port names), 3 resume fields, 4 the optional streams the top has.
const char* rh_names(int which) {
    switch (which) {
        case 0: return WR_FIELD_NAMES;
        case 1: return CTX_FIELD_NAMES;
        case 2: return COUNTER_NAMES;
        case 3: return RESUME_FIELD_NAMES;
        case 4: return FEATURE_NAMES;
    }
    return "";
}

// Verilator keeps a per-thread "current context": several models live at once (one per
// Harness), so every entry point that evaluates or destroys a model makes its own context
// current first (else closing the newest model first leaves a dangling one: hang or crash).
static inline Harness* use(void* p) {
    Harness* h = static_cast<Harness*>(p);
    Verilated::threadContextp(&h->ctx);
    return h;
}

void* rh_create(uint64_t seed, int reset_cycles) {
    Harness* h = new Harness(seed);
    use(h)->reset(reset_cycles);
    return h;
}
void rh_destroy(void* p) {
    Harness* h = use(p);
    h->top.final();
    delete h;
}
int rh_lanes(void* p) { return static_cast<Harness*>(p)->lanes; }
uint64_t rh_cycle(void* p) { return static_cast<Harness*>(p)->cycle; }

void rh_set_addr(void* p, uint64_t mac, uint32_t ip) {
    Harness* h = static_cast<Harness*>(p);
    h->top.local_mac = mac;
    h->top.local_ip = ip;
}
// thresholds[N_STREAMS]: idle/stall when a draw (32 bits) is below it.
void rh_set_random(void* p, const uint64_t* thresholds) {
    Harness* h = static_cast<Harness*>(p);
    for (int i = 0; i < N_STREAMS; ++i) h->rng[i].threshold = thresholds[i];
}
void rh_set_wr_waits_mgmt(void* p, int on) { static_cast<Harness*>(p)->wr_waits_mgmt = on; }
void rh_set_snapshot_period(void* p, uint64_t n) {
    static_cast<Harness*>(p)->snapshot_period = n;
}

void rh_push_wr(void* p, const uint64_t* fields) {
    WrReq w;
    std::memcpy(w.f, fields, sizeof w.f);
    static_cast<Harness*>(p)->wrs.push_back(w);
}
void rh_push_resume(void* p, const uint64_t* fields) {
    ResumeReq r{};
    std::memcpy(r.f, fields, sizeof(uint64_t) * N_RESUME_FIELDS);
    static_cast<Harness*>(p)->resumes.push_back(r);
}
void rh_push_payload(void* p, const uint8_t* data, size_t n) {
    if (n) static_cast<Harness*>(p)->payloads.emplace_back(data, data + n);
}
void rh_push_ip_id(void* p, uint64_t value) { static_cast<Harness*>(p)->ip_ids.push_back(value); }
void rh_push_rx(void* p, const uint8_t* data, size_t n, uint64_t earliest, int tuser) {
    if (n) static_cast<Harness*>(p)->rx.push_back({std::vector<uint8_t>(data, data + n),
                                                   earliest, tuser});
}
void rh_push_mgmt(void* p, uint64_t qp, int write, const uint64_t* ctx) {
    MgmtReq r{qp, uint64_t(write), {}};
    if (ctx) std::memcpy(r.ctx, ctx, sizeof r.ctx);
    static_cast<Harness*>(p)->mgmt.push_back(r);
}

// Run until `max_cycles` more cycles have passed, or (if until_tx > 0) until the tx queue holds
// at least `until_tx` frames, or (if quiet > 0) until every input queue has been empty and no tx
// beat seen for `quiet` cycles (counted across calls: slicing a run changes nothing). The stop
// conditions are checked before every cycle. Returns the cycles run.
uint64_t rh_run(void* p, uint64_t max_cycles, uint64_t until_tx, uint64_t quiet) {
    Harness* h = use(p);
    uint64_t start = h->cycle, end = start + max_cycles;
    while (h->cycle < end) {
        if (until_tx && h->tx.size() >= until_tx) break;
        if (quiet && h->cycle - h->quiet_since >= quiet) break;
        h->step();
    }
    return h->cycle - start;
}

// Counts (sim/backend.py COUNTS): 0 tx frames queued, 1 statuses, 2 mgmt responses, 3 rx_other
// frames, 4 WRs still to post, 5 payload packets still to send, 6 rx frames still to deliver,
// 7 mgmt requests to send, 8 WRs accepted so far, 9 tx frames seen so far, 10 tx beats seen so
// far, 11 resumes still to post, 12 resumes accepted, 13 cycles with m_axis_tx_tready high,
// 14 counter snapshots queued, 15 WR accept cycles queued, 16 IP ID loads to send, 17 mgmt
// request outstanding.
uint64_t rh_count(void* p, int which) {
    Harness* h = static_cast<Harness*>(p);
    switch (which) {
        case 0: return h->tx.size();
        case 1: return h->statuses.size();
        case 2: return h->mgmt_rsps.size();
        case 3: return h->other.size();
        case 4: return h->wrs.size();
        case 5: return h->payloads.size();
        case 6: return h->rx.size();
        case 7: return h->mgmt.size();
        case 8: return h->wrs_accepted;
        case 9: return h->tx_frames_total;
        case 10: return h->tx_beats_total;
        case 11: return h->resumes.size();
        case 12: return h->resumes_accepted;
        case 13: return h->tx_ready_cycles;
        case 14: return h->snapshots.size();
        case 15: return h->wr_accepts.size();
        case 16: return h->ip_ids.size();
        case 17: return h->mgmt_outstanding;
    }
    return 0;
}

// Length of the oldest frame of queue `which` (0 tx, 3 rx_other), or -1 if empty.
int64_t rh_frame_len(void* p, int which) {
    Harness* h = static_cast<Harness*>(p);
    auto& q = which == 3 ? h->other : h->tx;
    return q.empty() ? -1 : int64_t(q.front().bytes.size());
}
// Pop the oldest frame into buf (at least rh_frame_len bytes); meta = first cycle, last cycle,
// tuser, beats, tx ready cycles at the first and the last beat, framing errors. Returns its
// length, -1 if empty.
int64_t rh_frame_pop(void* p, int which, uint8_t* buf, uint64_t* meta) {
    Harness* h = static_cast<Harness*>(p);
    auto& q = which == 3 ? h->other : h->tx;
    if (q.empty()) return -1;
    Frame& f = q.front();
    std::memcpy(buf, f.bytes.data(), f.bytes.size());
    meta[0] = f.first_cycle; meta[1] = f.last_cycle; meta[2] = uint64_t(f.tuser);
    meta[3] = f.beats; meta[4] = f.ready_first; meta[5] = f.ready_last;
    meta[6] = uint64_t(f.errors);
    int64_t n = int64_t(f.bytes.size());
    q.pop_front();
    return n;
}
// out = cycle, wr_id, qp, status. Returns 0 if empty.
int rh_status_pop(void* p, uint64_t* out) {
    Harness* h = static_cast<Harness*>(p);
    if (h->statuses.empty()) return 0;
    const Status& s = h->statuses.front();
    out[0] = s.cycle; out[1] = s.wr_id; out[2] = s.qp; out[3] = s.status;
    h->statuses.pop_front();
    return 1;
}
// out = cycle, qp, write, error, then the N_CTX_FIELDS context fields. Returns 0 if empty.
int rh_mgmt_rsp_pop(void* p, uint64_t* out) {
    Harness* h = static_cast<Harness*>(p);
    if (h->mgmt_rsps.empty()) return 0;
    const MgmtRsp& r = h->mgmt_rsps.front();
    out[0] = r.cycle; out[1] = r.qp; out[2] = r.write; out[3] = r.error;
    std::memcpy(out + 4, r.ctx, sizeof r.ctx);
    h->mgmt_rsps.pop_front();
    return 1;
}
// The cycle of the oldest WR accepted not yet popped, in out[0]. Returns 0 if none.
int rh_wr_accept_pop(void* p, uint64_t* out) {
    Harness* h = static_cast<Harness*>(p);
    if (h->wr_accepts.empty()) return 0;
    out[0] = h->wr_accepts.front();
    h->wr_accepts.pop_front();
    return 1;
}
// The counters' present values (after the last cycle run), in COUNTER_NAMES order.
void rh_counters(void* p, uint64_t* out) {
    Harness* h = static_cast<Harness*>(p);
    int i = 0;
#define X(name) out[i++] = h->top.name;
    COUNTERS(X)
#undef X
    (void)i;
}
// out = cycle, then the counters as sampled in that cycle. Returns 0 if none is queued.
int rh_snapshot_pop(void* p, uint64_t* out) {
    Harness* h = static_cast<Harness*>(p);
    if (h->snapshots.empty()) return 0;
    const Snapshot& s = h->snapshots.front();
    out[0] = s.cycle;
    std::memcpy(out + 1, s.c, sizeof(uint64_t) * N_COUNTERS);
    h->snapshots.pop_front();
    return 1;
}

// A plain C++ cycle loop over the same model, for the harness-overhead comparison (the loop
// issue 34 measured): for `n` cycles a WR (RDMA WRITE of `length` bytes on QP `qp`) is always
// offered, the payload always valid (beats of `length` bytes back to back), m_axis_tx always
// ready. Leaves the engine mid-stream: for benchmarks only, destroy the handle afterwards.
// Returns the tx beats seen.
uint64_t rh_bare_busy(void* p, uint64_t n, uint32_t length, uint32_t qp) {
    Harness* h = use(p);
    Vtop& t = h->top;
    std::vector<uint8_t> body(length);
    for (uint32_t i = 0; i < length; ++i) body[i] = uint8_t(i);
    uint64_t tx_beats = 0;
    size_t pos = 0;
    t.s_wr_opcode = 0; t.s_wr_qp = qp; t.s_wr_remote_addr = 0x1000; t.s_wr_r_key = 5;
    t.s_wr_length = length; t.s_wr_wr_id = 1; t.s_wr_signaled = 1;
    t.s_wr_valid = 1;
    t.s_axis_payload_tvalid = 1;
    t.m_axis_tx_tready = 1;
    t.m_status_ready = 1;
    for (uint64_t i = 0; i < n; ++i) {
        int k = int(std::min<size_t>(h->lanes, length - pos));
        put_bytes(t.s_axis_payload_tdata, body.data() + pos, k);
        put_keep(t.s_axis_payload_tkeep, k);
        t.s_axis_payload_tlast = pos + k >= length;
        t.clk = 0; t.eval();
        if (t.s_axis_payload_tready) { pos += k; if (pos >= length) pos = 0; }
        tx_beats += t.m_axis_tx_tvalid && t.m_axis_tx_tready;
        t.clk = 1; t.eval();
    }
    h->cycle += n;
    return tx_beats;
}

}  // extern "C"
