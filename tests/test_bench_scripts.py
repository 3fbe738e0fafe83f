"""The bench scripts still run (tiny sizes, CPU): a broken script would otherwise be found only on the GPU
machine, where each attempt costs scarce device time. The figures themselves are not judged here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(args, tmp_path, timeout=600):
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLAKERN_QUIET="1")
    out = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
    return out.stdout


def test_bench_event_runs(tmp_path):
    js = tmp_path / "event.json"
    text = _run(["bench/bench_event.py", "--platforms", "cpu", "--sizes", "600", "--runs", "1", "--budget", "0.05",
                 "--rates", "0", "0.05", "--json", str(js)], tmp_path)
    rows = [line for line in text.splitlines() if line.startswith("| 600 |")]
    assert [r.split("|")[2].strip() for r in rows] == ["0%", "5%"] and all(r.endswith("| ok |") for r in rows), rows
    assert json.loads(js.read_text())


def test_bench_event_without_baselines(tmp_path):
    """--no-baselines leaves out the BCSR (and on a GPU cuSPARSE) column: no figure, a cell that says so."""
    js = tmp_path / "event.json"
    text = _run(["bench/bench_event.py", "--platforms", "cpu", "--sizes", "600", "--runs", "1", "--budget", "0.05",
                 "--rates", "0.05", "--columns", "s @ CSR", "--no-baselines", "--json", str(js)], tmp_path)
    rows = [line for line in text.splitlines() if line.startswith("| 600 |")]
    assert len(rows) == 1 and "| — (not timed) |" in rows[0] and rows[0].endswith("| ok |"), rows
    (table,) = json.loads(js.read_text())["tables"]
    assert len(table["data"]) == 1 and "bcsr_s" not in table["data"][0], table["data"]
    assert table["data"][0]["s @ CSR"]["xlakern_s"] > 0


def test_bench_graph_update_runs(tmp_path):
    js = tmp_path / "graph_update.json"
    text = _run(["bench/bench_graph_update.py", "--cpu", "--sizes", "300", "--runs", "1", "--json", str(js)], tmp_path)
    rows = [line for line in text.splitlines() if line.startswith("| 300 |")]
    assert len(rows) in (4, 7) and not any("error" in r for r in rows), rows  # 7 with BrainEvent installed
    assert json.loads(js.read_text())


def test_bench_be_api_runs(tmp_path):
    js = tmp_path / "be_api.json"
    text = _run(["bench/bench_be_api.py", "--sizes", "600", "--runs", "1", "--steps", "2", "--budget", "0.05",
                 "--json", str(js)], tmp_path)
    rows = [line for line in text.splitlines() if line.startswith("| 600 |")]
    assert len(rows) == 8 and not any("error" in r for r in rows), rows
    assert json.loads(js.read_text())


def test_bench_event2_sections_run(tmp_path):
    text = _run(["bench/bench_event2.py", "--platforms", "cpu", "--sizes", "600", "--conns", "20", "--runs", "1",
                 "--budget", "0.05"], tmp_path)
    assert "| 600 | 20 |" in text and "| 600 | 80 |" in text  # the JITC row (K = 20) and the plasticity row (K = 80)
    text = _run(["bench/bench_event2.py", "--platforms", "cpu", "--sizes", "600", "--sections", "plasticity",
                 "--runs", "1", "--budget", "0.05"], tmp_path)
    assert "plasticity" in text and "on post" in text and "JITC products" not in text
    text = _run(["bench/bench_event2.py", "--platforms", "cpu", "--sizes", "600", "--sections", "delay",
                 "--runs", "1", "--budget", "0.05"], tmp_path)
    assert "delays per step" in text and "| 600 | 80 |" in text and "CSR plasticity per step" not in text


def test_bench_network_runs(tmp_path):
    js = tmp_path / "network.json"
    text = _run(["bench/bench_network.py", "--single", "800", "--multi=", "--duration", "20", "--variants", "ops,fused",
                 "--skip-brainevent", "--json", str(js)], tmp_path)
    assert "| 800 |" in text
    rows = json.loads(js.read_text())
    assert {r.get("fused") for r in rows} == {False, True} and all("rtf" in r for r in rows)


def test_bench_network_multi_runs(tmp_path):
    js = tmp_path / "multi.json"
    text = _run(["bench/bench_network.py", "--single=", "--multi", "1280", "--duration", "20", "--skip-brainevent",
                 "--json", str(js)], tmp_path)
    row = next(line for line in text.splitlines() if line.startswith("| 1,280 |"))
    assert row.count("Hz") == 3  # the best one-device path, coba_spmd on operators and fused
    rows = json.loads(js.read_text())
    assert {(r["kind"], r["fused"]) for r in rows} == {("single", True), ("multi", False), ("multi", True)}


def test_bench_lif_modes_runs(tmp_path):
    text = _run(["bench/bench_lif_modes.py", "--sizes", "800", "--modes", "auto,block", "--steps", "50", "--runs", "1"],
                tmp_path)
    row = next(line for line in text.splitlines() if line.startswith("| 800 |"))
    assert row.count("µs") == 2 and "Hz" in row


def test_bench_jitc_capacity_runs(tmp_path):
    text = _run(["bench/bench_jitc_capacity.py", "--start", "500", "--max", "1000", "--conns", "20"], tmp_path)
    assert "| 500 |" in text and "| 1,000 |" in text and "Largest that ran: 1,000 neurons" in text


def test_bench_deterministic_runs(tmp_path):
    js = tmp_path / "det.json"
    text = _run(["bench/bench_deterministic.py", "--cases", "900:0.05", "indexed:900:0.05", "jitc:900:0.05:30",
                 "lif:900:0", "--rounds", "1", "--calls", "1", "--json", str(js)], tmp_path)
    for product in ("s @ CSR", "s @ CSR, indexed", "s @ JITC uniform", "run_lif_network, w per synapse"):
        row = next(line for line in text.splitlines() if line.startswith(f"| {product} | 900 |"))
        assert row.count("µs") == 2 and row.endswith("| True | True | ok |"), row  # the CPU's sums are reproducible
    data = json.loads(js.read_text())["tables"][0]["data"]
    assert [d["product"] for d in data] == ["csr", "indexed", "jitc", "lif"] and data[2]["k"] == 30
    assert 0 < data[3]["rate"] < 1  # the network's own activity
    assert all(d["deterministic_runs_equal"] for d in data)


def test_plot_network_draws_the_recorded_results(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "rtf.png"
    _run(["bench/plot_network.py", os.path.join(ROOT, "bench", "network_h100.json"), "--out", str(png)], tmp_path)
    assert png.stat().st_size > 1000


def test_bench_first_call_runs(tmp_path):
    """One case, the default arm, on the CPU: two cold fresh processes (each on empty caches) and a warm one,
    all checked against NumPy."""
    js = tmp_path / "first_call.json"
    text = _run(["bench/bench_first_call.py", "--platforms", "cpu", "--cases", "s @ CSR", "--arms", "xlakern",
                 "--repeats", "1", "--cold-repeats", "2", "--json", str(js)], tmp_path)
    rows = [line for line in text.splitlines() if line.startswith("| s @ CSR |")]
    assert len(rows) == 2 and not any("error" in r or "WRONG" in r for r in rows), rows
    (table,) = json.loads(js.read_text())["tables"]
    cell = table["data"][0]["xlakern"]
    assert cell["cold_s"] > 0 and len(cell["cold_runs_s"]) == 2 and len(cell["warm_s"]) == 1, cell
    assert cell["max_abs_err"] <= 1e-3, cell


def test_bench_eager_runs(tmp_path):
    """Every case at one small size on the CPU, each result checked against NumPy by the script."""
    js = tmp_path / "eager.json"
    text = _run(["bench/bench_eager.py", "--platforms", "cpu", "--sizes", "500", "--runs", "3", "--budget", "0.2",
                 "--json", str(js)], tmp_path)
    rows = [line for line in text.splitlines() if line.startswith("| 500 |")]
    assert len(rows) == 7 and all(r.endswith("| ok |") for r in rows), rows
    (table,) = json.loads(js.read_text())["tables"]
    assert all(d["xlakern_s"] > 0 and d["programs"]["xk"] <= 1 for d in table["data"]), table["data"]
