// SPDX-License-Identifier: BSD-2-Clause
// A minimal Verilator main for roce_engine.v at any width: reset the engine, send it one ARP
// request for its IP on s_axis_rx and check that the ARP reply leaves on m_axis_tx.
// Build and run (docs/verilator.md):
//   verilator --cc --exe --build -j 2 --top-module roce_engine \
//       roce_engine.v build/roce_engine_64/roce_engine.vlt docs/verilator/arp_smoke.cpp
//   obj_dir/Vroce_engine        # prints the reply, exits 0 if it is right
#include <cstdint>
#include <cstdio>
#include <type_traits>
#include <vector>

#include "Vroce_engine.h"
#include "verilated.h"

// Wire byte k of a beat travels in tdata[8k+7:8k] (byte 0 in the low bits). Up to 64 bits a
// port is a C++ integer, wider ones a VlWide of 32-bit words.
template <typename T> static void clear(T& v) {
    if constexpr (std::is_integral_v<T>) v = 0;
    else for (auto& w : v.m_storage) w = 0;
}
template <typename T> static void put_bits(T& v, int bit, uint32_t value, int n) {
    for (int i = 0; i < n; ++i) {
        int b = bit + i;
        if (!((value >> i) & 1)) continue;
        if constexpr (std::is_integral_v<T>) v |= T(1) << b;
        else v[b / 32] |= 1u << (b % 32);
    }
}
template <typename T> static uint8_t get_byte(const T& v, int k) {
    if constexpr (std::is_integral_v<T>) return uint8_t(v >> (8 * k));
    else return uint8_t(v[(8 * k) / 32] >> ((8 * k) % 32));
}
template <typename T> static bool get_bit(const T& v, int b) {
    if constexpr (std::is_integral_v<T>) return (v >> b) & 1;
    else return (v[b / 32] >> (b % 32)) & 1;
}

int main(int argc, char** argv) {
    VerilatedContext ctx;
    ctx.commandArgs(argc, argv);
    Vroce_engine top{&ctx};
    const int bytes = int(sizeof(top.s_axis_rx_tdata));   // bytes per beat: W / 8
    const uint64_t mac = 0x020000000001ull, peer_mac = 0x020000000002ull;
    const uint32_t ip = 0x0a000001, peer_ip = 0x0a000002;   // 10.0.0.1, 10.0.0.2

    auto tick = [&] { top.clk = 0; top.eval(); top.clk = 1; top.eval(); };
    top.local_mac = mac;
    top.local_ip = ip;
    top.m_axis_tx_tready = 1;
    top.m_axis_rx_other_tready = 1;
    top.rst = 1;
    for (int i = 0; i < 4; ++i) tick();
    top.rst = 0;

    // ARP request (RFC 826) "who has 10.0.0.1, tell 10.0.0.2", padded to 60 bytes.
    std::vector<uint8_t> f(60, 0);
    auto put = [&](int at, uint64_t v, int n) {
        for (int i = 0; i < n; ++i) f[at + i] = uint8_t(v >> (8 * (n - 1 - i)));
    };
    put(0, 0xffffffffffffull, 6); put(6, peer_mac, 6); put(12, 0x0806, 2);
    put(14, 1, 2); put(16, 0x0800, 2); put(18, 6, 1); put(19, 4, 1); put(20, 1, 2);
    put(22, peer_mac, 6); put(28, peer_ip, 4); put(38, ip, 4);

    // s_axis_rx_tready is constant 1: one beat per cycle.
    for (size_t at = 0; at < f.size(); at += bytes) {
        clear(top.s_axis_rx_tdata);
        clear(top.s_axis_rx_tkeep);
        for (int k = 0; k < bytes && at + k < f.size(); ++k) {
            put_bits(top.s_axis_rx_tdata, 8 * k, f[at + k], 8);
            put_bits(top.s_axis_rx_tkeep, k, 1, 1);
        }
        top.s_axis_rx_tvalid = 1;
        top.s_axis_rx_tlast = at + bytes >= f.size();
        top.s_axis_rx_tuser = 0;
        tick();
    }
    top.s_axis_rx_tvalid = 0;

    std::vector<uint8_t> reply;
    for (int cycle = 0; cycle < 1000; ++cycle) {
        top.eval();
        bool last = false;
        if (top.m_axis_tx_tvalid) {
            for (int k = 0; k < bytes; ++k)
                if (get_bit(top.m_axis_tx_tkeep, k)) reply.push_back(get_byte(top.m_axis_tx_tdata, k));
            last = top.m_axis_tx_tlast;
        }
        tick();
        if (last) break;
    }
    printf("reply (%zu bytes):", reply.size());
    for (uint8_t b : reply) printf(" %02x", b);
    printf("\n");
    auto field = [&](int at, int n) {
        uint64_t v = 0;
        for (int i = 0; i < n; ++i) v = v << 8 | reply[at + i];
        return v;
    };
    bool ok = reply.size() >= 42 && field(0, 6) == peer_mac && field(6, 6) == mac &&
              field(12, 2) == 0x0806 && field(20, 2) == 2 && field(22, 6) == mac &&
              field(28, 4) == ip && field(32, 6) == peer_mac && field(38, 4) == peer_ip;
    printf("%s\n", ok ? "ARP reply OK" : "FAIL: no correct ARP reply");
    top.final();
    return ok ? 0 : 1;
}
