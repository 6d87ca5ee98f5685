"""Report: the markdown table and the PNG plots, from a small synthetic results dictionary."""

from __future__ import annotations

import pytest

from hyflash.bench.report import markdown_table, write_report
from hyflash.bench.run import summarise


def _results() -> dict:
    runs = []
    for temperature in (0.0, 1.0):
        for set_name, ctx in (("humaneval", 150), ("code", 1024), ("long-2k", 2048)):
            for method, tau in (("plain", 1.0), ("hf-prompt-lookup", 1.5), ("ngram", 1.4), ("hyflash-d1", 2.0)):
                drafting = method not in ("plain", "hf-prompt-lookup")
                runs.append(dict(
                    temperature=temperature, set=set_name, method=method, prompt_tokens=ctx, new_tokens=32,
                    decode_time=32 / (20 * tau), target_passes=20, committed_after_prefill=int(20 * tau),
                    draft_time=0.1 if drafting else 0.0, drafted_by_position=[20, 12, 6] if drafting else [],
                    accepted_by_position=[12, 6, 2] if drafting else [], draft_memory_bytes=4096 if drafting else 0,
                    target_kv_bytes=ctx * 23040 if method == "plain" else None, target_kv_tokens=ctx,
                    peak_rss_bytes=2**30,
                    identical_to_plain=True,
                ))
    sweep = {"ngram": {"256": 2048, "1024": 8192}, "hyflash-d1": {"256": 50000, "1024": 50000}}
    return {"runs": runs, "summary": summarise(runs), "memory_sweep": sweep}


def test_markdown_table_has_every_row_and_column():
    table = markdown_table(_results())
    assert "### Temperature 0 (greedy)" in table and "### Temperature 1" in table
    assert "× HF prompt lookup" in table and "= plain" in table
    assert table.count("| hyflash-d1 |") == 6


def test_write_report_writes_table_and_pngs(tmp_path):
    written = write_report(_results(), tmp_path)
    names = {p.name for p in written}
    assert {"table.md", "tau_vs_context.png", "draft_memory_vs_context.png", "acceptance_by_position.png"} <= names
    for path in written:
        assert path.stat().st_size > 0
        if path.suffix == ".png":
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (tmp_path / "table.md").read_text()
    assert "Draft-side memory" in text and "## Summary" in text
    assert "| 0 | long-2k | 2048 |" in text  # compact comparison: one row per temperature and set


def test_prompt_ratios_pair_each_repeat_and_take_the_median_of_the_paired_ratios():
    from hyflash.bench.report import prompt_ratios

    def run(method, decode_time, times, new_tokens=100):
        return {"temperature": 0.0, "set": "never-slower", "item_id": "prose:x:128", "method": method,
                "prompt_tokens": 128, "new_tokens": new_tokens, "decode_time": decode_time, "decode_times": times,
                "tau": 1.5, "speedup_ceiling": 1.2, "guard": {"fallbacks": 1}, "identical_to_plain": True}

    # The Zen 3's 6k code prompt: plain's median run (3.41 s) came from a fast minute, the default's (4.23 s)
    # from a slow one; run next to each other, the pairs read 0.99 / 0.93 / 0.79
    results = {"runs": [run("plain", 3.41, [3.41, 4.18, 3.33]), run("default", 4.23, [3.46, 4.50, 4.23])]}
    [row] = prompt_ratios(results, "default")
    assert row["repeat_ratios"] == pytest.approx([3.41 / 3.46, 4.18 / 4.50, 3.33 / 4.23], abs=1e-4)  # not sorted
    assert row["ratio"] == pytest.approx(4.18 / 4.50) and row["ratio_of_medians"] == pytest.approx(3.41 / 4.23)
    # different token counts (sampling): each pair compares speeds, not times
    results = {"runs": [run("plain", 2.0, [2.0, 2.0], new_tokens=100), run("default", 1.0, [1.0, 1.0], new_tokens=50)]}
    [row] = prompt_ratios(results, "default")
    assert row["ratio"] == pytest.approx(1.0) and row["repeat_ratios"] == [1.0, 1.0]
    assert row["fallbacks"] == 1 and row["budget_pauses"] is None and row["kind"] == "prose"
    # against another baseline (llama-cpp-python's own loop), paired the same way; plain is then not read
    results = {"runs": [run("plain", 9.0, [9.0, 9.0]), run("llamacpp-plain", 3.0, [3.0, 3.3]),
                        run("default", 2.0, [2.0, 3.0])]}
    [row] = prompt_ratios(results, "default", baseline="llamacpp-plain")
    assert row["repeat_ratios"] == pytest.approx([1.5, 1.1]) and row["ratio"] == pytest.approx(1.3)
