"""Device traces (jaxgossip.sim.traces): the .npz / long .csv layout, its columns read by
--time.compute / --time.bandwidth / --time.latency=trace:PATH, and the FedScale converter on a
small made-up device file."""

import json

import numpy as np
import pytest
from tiny import TINY_FLAGS

from jaxgossip.cli import main
from jaxgossip.sim import traces
from jaxgossip.sim.compute import parse_compute
from jaxgossip.sim.network import Network

N = 4
RNG = np.random.default_rng(0)
COMPUTE = RNG.uniform(0.01, 0.05, (3, N)).astype(np.float32)
UPLINK = RNG.uniform(1e6, 1e8, (2, N)).astype(np.float32)
DOWNLINK = (UPLINK * 4).astype(np.float32)
LATENCY = RNG.uniform(0, 1e-2, (1, N)).astype(np.float32)

# A FedScale-style device file: client id, compute speed (ms per sample), communication (kbit/s);
# ids out of order, more clients than nodes.
FEDSCALE = """client_id,compute_speed,communication_kbps
7,12.5,800
2,40.0,12000
5,3.0,2500.5
1,25.0,400
9,9.0,100000
"""


@pytest.mark.parametrize("suffix", [".npz", ".csv"])
def test_round_trip_and_the_options_read_their_columns(tmp_path, suffix):
    path = str(tmp_path / f"devices{suffix}")
    traces.save_device_trace(path, traces.DeviceTrace(COMPUTE, UPLINK, DOWNLINK, LATENCY))
    back = traces.load_device_trace(path)
    for name, want in zip(traces.COLUMNS, (COMPUTE, UPLINK, DOWNLINK, LATENCY)):
        np.testing.assert_array_equal(getattr(back, name), want)
    if suffix == ".csv":  # the long layout: a header, one line per (row, node)
        lines = open(path).read().splitlines()
        assert lines[0] == "row,node,compute_seconds,uplink_bps,downlink_bps,latency_s"
        assert len(lines) == 1 + 3 * N and lines[1].startswith("0,0,")
    np.testing.assert_array_equal(parse_compute(f"trace:{path}").trace, COMPUTE)
    links = Network(bandwidth=f"trace:{path}", latency=f"trace:{path}").link_values(N)
    np.testing.assert_array_equal(links.bandwidth.values, UPLINK.astype(np.float64))  # [R, N] per round
    np.testing.assert_array_equal(links.latency, LATENCY[0].astype(np.float64))  # one row: per node


def test_a_partial_trace_and_bad_files(tmp_path):
    only = str(tmp_path / "compute.npz")
    traces.save_device_trace(only, traces.DeviceTrace(compute_seconds=COMPUTE))
    with pytest.raises(ValueError, match=r"--time.bandwidth=.*has no uplink_bps column"):
        Network(bandwidth=f"trace:{only}")
    grid = tmp_path / "hole.csv"
    grid.write_text("row,node,uplink_bps\n0,0,1e6\n0,1,2e6\n1,0,1e6\n")
    with pytest.raises(ValueError, match=r"every \(row, node\) of the 2 x 2 grid.*\(row 1, node 1\)"):
        traces.load_device_trace(str(grid))
    bad = tmp_path / "bad.csv"
    bad.write_text("row,node,speed\n0,0,1\n")
    with pytest.raises(ValueError, match="header must be row,node followed by"):
        traces.load_device_trace(str(bad))
    slow = tmp_path / "zero.csv"
    slow.write_text("row,node,uplink_bps\n0,0,0\n")
    with pytest.raises(ValueError, match="uplink_bps must be finite and > 0"):
        traces.load_device_trace(str(slow))
    with pytest.raises(ValueError, match="unknown arrays"):
        np.savez(tmp_path / "x.npz", speed=COMPUTE)
        traces.load_device_trace(str(tmp_path / "x.npz"))


def test_from_fedscale_against_a_loop(tmp_path):
    path = tmp_path / "fedscale_devices.csv"
    path.write_text(FEDSCALE)
    trace = traces.from_fedscale(str(path), N, batch_size=8)
    clients = sorted((int(c), float(s), float(k)) for c, s, k in (ln.split(",") for ln in FEDSCALE.split()[1:]))
    for i in range(N):  # node i is the i-th client by id
        _, ms, kbps = clients[i]
        assert trace.compute_seconds[0, i] == np.float32(8 * ms / 1000)
        assert trace.uplink_bps[0, i] == trace.downlink_bps[0, i] == np.float32(kbps * 1000)
    assert trace.latency_s is None and trace.compute_seconds.shape == (1, N)
    with pytest.raises(ValueError, match="5 clients for 6 nodes"):
        traces.from_fedscale(str(path), 6, batch_size=8)
    broken = tmp_path / "broken.csv"
    broken.write_text("client_id,compute_speed\n1,2\n")
    with pytest.raises(ValueError, match=r"columns \['communication_kbps'\] missing"):
        traces.from_fedscale(str(broken), 1, batch_size=8)


def test_a_converted_fedscale_file_drives_a_run(tmp_path):
    """The converted devices as --time.compute and --time.bandwidth of an asynchronous run: the
    slowest device (25 ms per sample) sets the pace of the synchronous run, not of the asynchronous one."""
    path = tmp_path / "fedscale_devices.csv"
    path.write_text(FEDSCALE)
    npz = str(tmp_path / "devices.npz")
    traces.save_device_trace(npz, traces.from_fedscale(str(path), N, batch_size=8))

    def sim_time(execution):
        out = tmp_path / execution
        argv = ["train", *TINY_FLAGS, f"--execution={execution}", f"--time.compute=trace:{npz}"]
        assert main([*argv, f"--time.bandwidth=trace:{npz}", "--out", str(out)]) == 0
        return json.loads((out / "metrics.json").read_text())["rows"][-1]["sim_time"]

    sync, asynchronous = sim_time("sync"), sim_time("async")
    slowest = 8 * 40.0 / 1000  # client 2 (node 1): 40 ms per sample
    assert sync > slowest * 0.99 * json.loads((tmp_path / "sync" / "metrics.json").read_text())["rows"][-1]["round"]
    assert asynchronous < sync
