"""The overlap figure's arithmetic (`benchmarks/overlap_figure.py`): how much of the error's copy
time ran beside a kernel on another stream, on intervals laid out by hand."""
import json

import pytest

from benchmarks.overlap_figure import main, overlap


def _rows():
    # stream 7: compute kernels at 0-100 us and 150-200 us; stream 9: a copy up at 50-170 us (beside
    # compute for 50-100 and 150-170: 70 of 120 us); stream 11: a copy down at 210-250 us, alone;
    # a kernel on the copy's own stream (9) at 60-80 us never counts as hiding it
    return [[7, "kernel", 0, 100, "gemm"], [7, "kernel", 150, 50, "gemm"], [9, "h2d", 50, 120, "Memcpy HtoD"],
            [9, "kernel", 60, 20, "add"], [11, "d2h", 210, 40, "Memcpy DtoH"]]


def test_a_copy_is_hidden_only_where_another_stream_computes():
    o = overlap(_rows())
    assert o["update_s"] == pytest.approx(250e-6)
    assert o["kernel_s"] == pytest.approx(150e-6)  # 0-100 and 150-200 merged with 60-80 inside
    assert o["h2d_s"] == pytest.approx(120e-6) and o["h2d_beside_compute"] == pytest.approx(70 / 120)
    assert o["d2h_s"] == pytest.approx(40e-6) and o["d2h_beside_compute"] == 0.0


def test_overlapping_copies_count_once_and_a_profile_without_copies_has_no_share():
    rows = _rows() + [[13, "h2d", 90, 30, "Memcpy HtoD"]]  # inside the first copy's time: no new copy time
    assert overlap(rows)["h2d_s"] == pytest.approx(120e-6)
    alone = overlap([[7, "kernel", 0, 10, "gemm"]])
    assert alone["h2d_s"] == 0 and alone["h2d_beside_compute"] is None


def test_the_command_prints_a_row_and_draws_the_figure(tmp_path, capsys):
    f = tmp_path / "streams_powersgd.json"
    f.write_text(json.dumps({"unit": "us", "rows": _rows()}))
    main([str(f), "--png", str(tmp_path / "overlap.png")])
    out = capsys.readouterr().out
    assert "| powersgd | 0.2 | 0.1 | 0.1 | 58% | 0.0 | 0% |" in out
    assert (tmp_path / "overlap.png").stat().st_size > 1000
