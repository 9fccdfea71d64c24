"""tools/bench_host.py: interleaved rounds, the target ratios, and the launch stub restored."""

import pytest
from tool_modules import tool

bh = tool("bench_host")


def test_rounds_interleave_the_cases():
    order: list[str] = []
    cases = {n: bh.Case(lambda n=n: order.append(n)) for n in ("a", "b")}
    bh.measure(cases, calls=3, rounds=2, sync=lambda: order.append("|"))
    timed = order[-(2 * 2 * 4):]  # two rounds of two cases: 3 calls and a sync each
    assert "".join(timed) == "aaa|bbb|aaa|bbb|"
    assert all(len(c.samples) == 2 and c.first_us > 0 for c in cases.values())


def test_two_calls_per_fn_are_reported_per_call():
    slow, twice = bh.Case(lambda: None), bh.Case(lambda: None, per=2)
    bh.measure({"slow": slow, "twice": twice}, calls=10, rounds=1, sync=lambda: None)
    assert twice.per == 2 and len(twice.samples) == 1


def _rows(names, us):
    return {n: {"median_us": v, "min_us": v / 2} for n, v in zip(names, us)}


def test_gpu_ratios_are_the_issue_targets():
    names = [bh.ANCHOR, *{r for _, a, b in bh.GPU_RATIOS for r in (a, b)} - {bh.ANCHOR},
             bh.MEMO_HIT, bh.EMPTY]
    rows = _rows(names, [10.0] * len(names))
    rows[bh.EMPTY] = {"median_us": 0.5, "min_us": 0.25}
    rows["torch.ops.kdispatch.write_kv"] = {"median_us": 12.5, "min_us": 6.0}
    r = bh.ratios(rows, gpu=True)
    assert r["torch op / direct, write_kv [<= 1.25]"] == {"median": 1.25, "min": 1.2}
    assert r["decode GQA / bare launch [<= 1.5]"]["median"] == 1.0
    assert r["memo hit (us) [<= 1.0]"] == {"median": 10.0, "min": 5.0}
    assert r["memo hit less the empty call (us)"] == {"median": 9.5, "min": 4.75}
    assert len(r) == len(bh.GPU_RATIOS) + 2
    rows[bh.FLOOR] = {"median_us": 2.0, "min_us": 1.0}  # torch's own cost of an op call
    r = bh.ratios(rows, gpu=True)
    assert r["write_kv torch op - direct - floor (us)"] == {"median": 0.5, "min": 0.0}


def test_the_floor_op_does_nothing_through_torch():
    import torch

    noop = bh._noop_op()
    assert bh._noop_op() is noop  # registered once
    x = torch.ones(2)
    assert noop(x, x, x, x, x) is None and x.tolist() == [1.0, 1.0]


def test_cpu_overheads_are_differences_in_us():
    names = [n for _, a, b in bh.CPU_OVERHEADS for n in (a, b)] + [bh.MEMO_HIT, bh.EMPTY]
    rows = _rows(names, [3.0, 1.0, 4.0, 1.5, 2.0, 0.5, 1.1, 0.1])
    r = bh.ratios(rows, gpu=False)
    assert r["torch op - direct, decode GQA (us)"]["median"] == pytest.approx(2.0)
    assert r["torch op - direct, decode MLA (us)"]["median"] == pytest.approx(2.5)
    assert r["torch op - direct, write_kv (us)"]["median"] == pytest.approx(1.5)
    assert r["memo hit (us) [<= 1.0]"]["median"] == pytest.approx(1.1)
    assert r["memo hit less the empty call (us)"]["median"] == pytest.approx(1.0)
    rows[bh.FLOOR] = {"median_us": 1.25, "min_us": 1.0}
    r = bh.ratios(rows, gpu=False)
    assert r["write_kv torch op - direct - floor (us)"]["median"] == pytest.approx(0.25)


def test_the_launch_stub_is_restored():
    from kdispatch.kernels.decode_attention import launch as dlaunch
    from kdispatch.kernels.decode_attention import torch_op as dop
    from kdispatch.kernels.kv_write import launch as wlaunch
    from kdispatch.kernels.kv_write import torch_op as wop

    before = (dlaunch.decode_attention, dop._decode, wlaunch.write_kv, wop._write_kv)
    with bh.stubbed_launches():
        assert dlaunch.decode_attention is not before[0] and wop._write_kv is not before[3]
        assert wlaunch.write_kv() is None and dop._decode().shape == (1, 32, 128)
        # a fresh output per call, as the real launch returns (the torch op hands it back)
        assert dop._decode() is not dop._decode()
    assert (dlaunch.decode_attention, dop._decode, wlaunch.write_kv, wop._write_kv) == before
