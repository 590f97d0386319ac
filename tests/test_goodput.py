# SPDX-License-Identifier: BSD-2-Clause
"""bench.goodput: the go-back-N bound and a small run of the CLI."""

import json

import pytest

from bench.goodput import gbn_bound, main

__all__ = []


def test_bound_matches_protocol_examples():
    """PROTOCOL.md §5.10a: 100 Gb/s, 4 KiB MTU (about 0.33 us a packet), 5 us RTT (N about 15),
    a window above N: 98 % at 0.1 % loss, 84 % at 1 % with a 46 us timeout (T about 140),
    24-27 % with 4.2 ms (T about 12,800)."""
    n, w = 15.3, 64
    assert gbn_bound(0.001, window=w, round_trip=n, timeout=140) == pytest.approx(0.98, abs=0.01)
    assert gbn_bound(0.01, window=w, round_trip=n, timeout=140) == pytest.approx(0.84, abs=0.01)
    assert 0.24 <= gbn_bound(0.01, window=w, round_trip=n, timeout=12_800) <= 0.27
    assert gbn_bound(0.0, window=4, round_trip=8, timeout=10) == 0.5
    with pytest.raises(ValueError):
        gbn_bound(1.0, window=1, round_trip=1, timeout=1)


def test_cli_small_run(tmp_path, capsys):
    out = tmp_path / "g.json"
    assert main(["--width", "64", "--qps", "1,2", "--loss", "0.01", "--mbytes", "0.25",
                 "--message-kib", "16", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "bound" in text and "ratio" in text
    rows = json.loads(out.read_text())
    assert [(r["qps"], r["loss"], r["ok"]) for r in rows] == [(1, 0.01, True), (2, 0.01, True)]
    assert all(0 < r["efficiency"] <= 1 and 0 < r["bound"] <= 1 for r in rows)


def test_cli_refuses_bad_arguments(capsys):
    assert main(["--width", "65"]) == 2
    assert main(["--loss", "1.5"]) == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.tools("verilator")
def test_cli_hardware_requester(tmp_path, capsys):
    """``--requester hw``: the whole engine (Verilator, 64 bits, 16 QPs: the shared library) in
    the model loop. At 0 % loss it delivers everything at the model's goodput (both measured to
    the responder's last message); at 1 % it loses messages -- it does not retransmit yet --
    and the run says so and exits 1."""
    out = tmp_path / "hw.json"
    args = ["--width", "64", "--qps", "1", "--loss", "0,0.01", "--mbytes", "1",
            "--message-kib", "16"]
    assert main(["--requester", "hw", *args, "--json", str(out)]) == 1
    assert "does not retransmit" in capsys.readouterr().err
    hw = json.loads(out.read_text())
    assert main(["--requester", "model", *args, "--json", str(out)]) == 0
    model = json.loads(out.read_text())
    assert [(r["requester"], r["basis"]) for r in hw] == [("hw", "delivery")] * 2
    assert hw[0]["ok"] and hw[0]["delivered"] == hw[0]["messages"] == 64
    assert hw[0]["goodput_bytes_per_cycle"] == pytest.approx(
        model[0]["delivery_goodput_bytes_per_cycle"], rel=0.01)
    assert not hw[1]["ok"] and hw[1]["delivered"] < hw[1]["messages"] and hw[1]["naks"] >= 1
    assert hw[1]["retransmitted"] == 0 and model[1]["ok"] and model[1]["retransmitted"] > 0
