"""tools/bench_decode.py's shapes: the ragged DP-attention rows (no GPU needed to build them)."""

from tool_modules import tool

bd = tool("bench_decode")


def test_ragged_rows_draw_seeded_lengths_within_the_context_and_count_their_bytes():
    rows = [s for s in bd.shapes() if "ragged" in s.name]
    assert [s.mean for s in rows] == [4096, 8192, 16384, 32768]
    for s in rows:
        lens = s.lengths()
        assert len(lens) == s.batch == 128 and s.page == 64 and s.hq == 128
        assert min(lens) >= 1 and max(lens) <= s.context == 2 * s.mean
        assert 0.8 * s.mean < sum(lens) / len(lens) < 1.2 * s.mean
        assert lens == s.lengths()  # seeded
        per_tok = s.dk * 2  # the latent, read once, bf16
        assert bd.live_bytes(s) == sum(lens) * per_tok + s.batch * s.hq * (s.dk + s.dv) * 2
    twins = bd.variants(rows[:1], ("bf16", "fp8"), (1, 2))
    assert {(t.page, t.mean, tuple(t.lengths())) for t in twins} == {
        (64, 4096, tuple(rows[0].lengths()))}
    full = next(s for s in bd.shapes() if s.name == "llama3-8b-gqa-b64-c8192")
    assert full.lengths() == [8192] * 64 and full.page == 16
