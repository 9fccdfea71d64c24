"""tools/bench_tune.py: its steps and the verdicts it draws from whichever runs it made."""

from tool_modules import tool

bt = tool("bench_tune")


def _run(wall: float, code: int = 0) -> dict:
    return {"wall_s": wall, "exit_code": code, "budget_stopped": False}


def test_ahead_6_alone_is_the_compile_ahead_run_of_one_gpu_6():
    steps = bt.steps_of(dry=False)
    assert [n for n, _ in steps["ahead-6"]] == ["ahead-6"]
    assert steps["ahead-6"][0][1] == dict(steps["one-gpu-6"])["ahead-6"]
    assert "--compile-workers" not in steps["ahead-6"][0][1]


def test_verdicts_from_the_runs_made():
    assert bt.verdicts({"ahead-6": _run(19.5)}) == {
        "one_gpu_6": {"ahead_s": 19.5, "target_le_20s": True}}
    both = bt.verdicts({"plain-6": _run(70.0), "ahead-6": _run(28.0)})["one_gpu_6"]
    assert both["speedup"] == 2.5 and both["target_le_20s"] is False
    scale = bt.verdicts({"one-gpu-12": _run(34.0), "two-gpu-12": _run(20.0)})["scale_12"]
    assert scale["speedup"] == 1.7 and scale["target_ge_1_7x"] is True
    assert bt.verdicts({"ahead-6": _run(10.0, code=1)}) == {}  # a failed run proves nothing
