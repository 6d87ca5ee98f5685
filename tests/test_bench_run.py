"""The benchmark runner on the tiny target: every method, the JSON fields, speed-ups from one run."""

from __future__ import annotations

import json

import pytest

from hyflash.bench.run import BenchConfig, run_bench, summarise

from bench_fixtures import word_target
from conftest import import_llama_cpp

METHODS = ("plain", "hf-plain", "hf-prompt-lookup", "ngram")


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    from hyflash.drafters.config import DrafterConfig
    from hyflash.drafters.model import DrafterModel

    out = tmp_path_factory.mktemp("bench")
    target = word_target()
    folder = DrafterModel(DrafterConfig.for_target(target, kind="hyflash", window=16), target).save_pretrained(
        out / "hyflash-d1"
    )
    config = BenchConfig(
        sets=("prose",), n=2, max_new_tokens=10, temperatures=(0.0, 1.0), methods=METHODS,
        drafters={"untrained": str(folder), "broken": "/nonexistent/drafter"},
        memory_contexts=(32, 128, 256), sweep_depths=(1,),
    )
    return run_bench(config, target=target, out_dir=out, log=lambda _: None), out


def test_results_json_has_every_method_set_and_temperature(bench):
    results, out = bench
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["summary"] == json.loads(json.dumps(results["summary"]))
    assert on_disk["meta"]["machine"]["cpu_count"] and on_disk["meta"]["config"]["n"] == 2
    keys = {(r["temperature"], r["set"], r["method"]) for r in results["summary"]}
    methods = (*METHODS, "untrained")
    assert keys == {(t, "prose", m) for t in (0.0, 1.0) for m in methods}
    assert len(results["runs"]) == 2 * 2 * len(methods)
    for row in results["summary"]:
        for field in ("tau", "tokens_per_second", "speedup", "speedup_vs_hf_pld", "draft_share",
                      "draft_memory_bytes", "peak_rss_bytes", "acceptance_by_position"):
            assert field in row
        assert row["tau"] >= 1.0 and row["tokens_per_second"] > 0 and row["peak_rss_bytes"] > 0


def test_a_drafter_that_does_not_load_is_reported_not_fatal(bench):
    results, _ = bench
    assert "broken" in results["errors"]
    assert not any(r["method"] == "broken" for r in results["runs"])
    (identity,) = results["meta"]["drafters"].values()  # the drafter that ran, identified by its weights
    assert identity["config"]["kind"] == "hyflash" and len(identity["sha256"]["model.safetensors"]) == 64


def test_greedy_outputs_match_plain_in_fp32(bench):
    # The tiny target is fp32: every lossless method, ours and Hugging Face's, must reproduce plain greedy.
    results, _ = bench
    greedy = [r for r in results["summary"] if r["temperature"] == 0]
    assert all(r["identical_to_plain"] == r["prompts"] for r in greedy)
    assert all(r["identical_to_plain"] is None for r in results["summary"] if r["temperature"] != 0)


def test_acceptance_and_memory_are_recorded_for_drafting_methods(bench):
    results, _ = bench
    ngram = [r for r in results["summary"] if r["method"] == "ngram"]
    assert all(r["acceptance_by_position"] and r["draft_memory_bytes"] > 0 for r in ngram)
    plain = [r for r in results["summary"] if r["method"] == "plain"]
    assert all(r["target_kv_bytes"] > 0 and r["tau"] == 1.0 for r in plain)
    sweep = results["memory_sweep"]
    # The n-gram drafter keeps the token history, `full` every context K/V: both grow with the context.
    assert sweep["ngram"][256] == 2 * sweep["ngram"][128] > 0
    assert sweep["full-d1"][256] > sweep["full-d1"][128]
    # Window and state kinds are bounded: constant once the window is full (default window 64).
    for kind in ("local-d1", "memory-d1", "hyflash-d1"):
        assert sweep[kind][256] == sweep[kind][128] < sweep["full-d1"][256]
    assert results["drafter_params"]["ngram"] is None and results["drafter_params"]["hyflash-d1"] > 0


def test_speedup_is_a_ratio_within_one_run():
    def record(method, tokens, seconds, set_name="code"):
        return dict(
            temperature=0.0, set=set_name, method=method, prompt_tokens=10, new_tokens=tokens,
            decode_time=seconds, target_passes=tokens - 1, committed_after_prefill=tokens - 1, draft_time=0.0,
            drafted_by_position=[], accepted_by_position=[], draft_memory_bytes=0, target_kv_bytes=None,
            peak_rss_bytes=1, identical_to_plain=True,
        )

    rows = summarise([
        record("plain", 10, 1.0), record("plain", 10, 1.0), record("llamacpp-plain", 30, 1.0),
        record("hf-prompt-lookup", 20, 1.0), record("ngram", 20, 0.5), record("ngram", 20, 1.5),
        record("plain", 10, 1.0, set_name="prose"), record("ngram", 20, 1.0, set_name="prose"),
    ])
    by = {r["method"]: r for r in rows if r["set"] == "code"}
    assert by["plain"]["speedup"] == 1.0
    assert by["ngram"]["speedup"] == pytest.approx(2.0)  # 40 tokens in 2 s vs 20 in 2 s (pooled, not averaged)
    assert by["ngram"]["speedup_vs_hf_pld"] == pytest.approx(1.0)
    assert by["ngram"]["speedup_vs_hf_plain"] is None  # not measured in this run: never invented
    # Against the fastest plain decoding of the same set and temperature: llama.cpp's 30 tok/s here.
    assert {r["fastest_plain"] for r in by.values()} == {"llamacpp-plain"}
    assert by["ngram"]["speedup_vs_fastest_plain"] == pytest.approx(20 / 30)
    assert by["llamacpp-plain"]["speedup_vs_fastest_plain"] == 1.0
    prose = {r["method"]: r for r in rows if r["set"] == "prose"}
    assert prose["ngram"]["fastest_plain"] == "plain" and prose["ngram"]["speedup_vs_fastest_plain"] == 2.0
    assert by["ngram"]["speedup_vs_llamacpp_plain"] == pytest.approx(20 / 30)
    assert prose["ngram"]["speedup_vs_llamacpp_plain"] is None  # no llama.cpp run on that set


def test_greedy_runs_are_compared_with_each_reference_that_ran():
    from hyflash.bench.run import compare_greedy, first_difference

    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # a shorter text differs where it ends
    out = compare_greedy([1, 2, 3], {"plain": [1, 2, 3], "llamacpp-plain": [1, 2, 4]})
    assert out == {"identical_to_plain": True, "identical_to_llamacpp_plain": False,
                   "first_difference_vs_llamacpp_plain": 2}
    assert compare_greedy([1], {"plain": [1], "llamacpp-plain": None}) == {"identical_to_plain": True}


def test_quick_mode_is_small_and_valid():
    from hyflash.bench.datasets import SETS
    from hyflash.bench.run import quick

    config = quick(BenchConfig(n=20, max_new_tokens=512))
    assert config.n <= 2 and config.max_new_tokens <= 48 and 0.0 in config.temperatures
    assert set(config.sets) <= set(SETS) and "long-8k" not in config.sets


def test_default_drafter_never_silently_becomes_ngram():
    from hyflash.bench.methods import build_methods
    from hyflash.errors import HyflashError

    (method,) = build_methods([], {"default": "default"}, word_target())
    with pytest.raises(HyflashError, match="no default drafter"):
        method.drafter()


@pytest.mark.parametrize("installed", [True, False])
def test_llama_cpp_peers_are_skipped_with_a_note(monkeypatch, tmp_path, installed):
    """Without llama-cpp-python, or for a model that has no GGUF (the tiny test model), the llama.cpp peers are
    skipped with the reason, in results.json and the table, and the other methods run."""
    import sys

    from hyflash.bench.report import markdown_table

    if installed:
        import_llama_cpp()
    else:
        monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises ImportError
    config = BenchConfig(sets=("prose",), n=1, max_new_tokens=4, temperatures=(0.0,),
                         methods=("plain", "llamacpp-plain", "llamacpp-prompt-lookup"), memory_contexts=())
    results = run_bench(config, target=word_target(), out_dir=tmp_path, log=lambda _: None)
    assert {r["method"] for r in results["summary"]} == {"plain"} and not results["errors"]
    reason = "not installed" if not installed else "GGUF"
    assert set(results["skipped"]) == {"llamacpp-plain", "llamacpp-prompt-lookup"}
    assert all(reason in why for why in results["skipped"].values()), results["skipped"]
    assert "Method llamacpp-plain skipped:" in markdown_table(results)


def test_resume_keeps_matching_records_and_runs_only_what_is_missing(tmp_path):
    """A bench grown by a drafter runs only that drafter; a drafter with new weights, and the records a stopped
    bench never wrote, are measured again; other settings are refused."""
    import torch

    from hyflash.drafters.config import DrafterConfig
    from hyflash.drafters.model import DrafterModel
    from hyflash.errors import HyflashError

    target = word_target()

    def drafter(name, seed):
        torch.manual_seed(seed)
        config = DrafterConfig.for_target(target, kind="hyflash", window=16)
        return str(DrafterModel(config, target).save_pretrained(tmp_path / name))

    def bench(drafters, resume=True, **changes):
        settings = dict(sets=("prose",), n=2, max_new_tokens=8, temperatures=(0.0, 1.0), methods=("plain", "ngram"))
        config = BenchConfig(**{**settings, **changes}, drafters=drafters, memory_contexts=())
        lines = []
        results = run_bench(config, target=target, out_dir=tmp_path / "bench", log=lines.append, resume=resume)
        return results, lines

    first, _ = bench({"a": drafter("a", 0)}, resume=False)
    assert len(first["runs"]) == 2 * 2 * 3  # temperatures x prompts x methods
    grown, lines = bench({"a": drafter("a", 0), "b": drafter("b", 1)})
    assert grown["meta"]["resumed"][-1]["records_kept"] == 12 and any("12 of its 12 records kept" in x for x in lines)
    old = {(r["temperature"], r["item_id"], r["method"]): r for r in first["runs"]}
    for r in grown["runs"]:  # kept records are the earlier measurements themselves, in the configured order
        if r["method"] != "b":
            assert r == old[(r["temperature"], r["item_id"], r["method"])]
    assert [r["method"] for r in grown["runs"][:4]] == ["plain", "ngram", "a", "b"]
    b_greedy = [r for r in grown["summary"] if r["method"] == "b" and r["temperature"] == 0]
    assert b_greedy[0]["identical_to_plain"] == 2  # checked against the kept plain tokens

    # New weights under the same name: a's records are measured again, the others kept.
    retrained, _ = bench({"a": drafter("a", 2), "b": drafter("b", 1)})
    assert retrained["meta"]["resumed"][-1]["records_kept"] == 12
    # A bench stopped before its last prompt: only that prompt's records are missing, so only they run.
    on_disk = json.loads((tmp_path / "bench" / "results.json").read_text())
    on_disk["runs"] = on_disk["runs"][:-4]
    (tmp_path / "bench" / "results.json").write_text(json.dumps(on_disk))
    finished, _ = bench({"a": drafter("a", 2), "b": drafter("b", 1)})
    assert finished["meta"]["resumed"][-1]["records_kept"] == 12 and len(finished["runs"]) == 16
    with pytest.raises(HyflashError, match="other settings \\(max_new_tokens\\)"):
        bench({"a": drafter("a", 2)}, max_new_tokens=6)


def test_resume_with_repeats_skips_prompts_whose_records_are_all_kept(tmp_path):
    """--resume --repeats N: a prompt with every method's record kept runs nothing (it once divided by the empty
    list of methods left to run), and only the missing prompt is timed again, N times."""
    target = word_target()
    config = BenchConfig(sets=("prose",), n=2, max_new_tokens=8, temperatures=(0.0,), methods=("plain", "ngram"),
                         repeats=2, memory_contexts=())
    first = run_bench(config, target=target, out_dir=tmp_path / "bench", log=lambda line: None)
    on_disk = json.loads((tmp_path / "bench" / "results.json").read_text())
    on_disk["runs"] = on_disk["runs"][:-2]  # stopped before its second prompt
    (tmp_path / "bench" / "results.json").write_text(json.dumps(on_disk))
    resumed = run_bench(config, target=target, out_dir=tmp_path / "bench", log=lambda line: None, resume=True)
    assert resumed["meta"]["resumed"][-1]["records_kept"] == 2 and len(resumed["runs"]) == 4
    assert resumed["runs"][:2] == first["runs"][:2]
    assert all(len(r["decode_times"]) == 2 for r in resumed["runs"][2:])


def test_repeats_time_the_same_generation_and_keep_the_median_run():
    """--repeats: each method runs from the policy state it had before the prompt each time (not one that learned
    from its own repeats), in rotated order, and the run of median decode time stands; the state after the
    first run carries on to the next prompt."""
    from hyflash.bench.methods import PromptRun
    from hyflash.bench.run import _repeated

    class Method:
        def __init__(self, name, times):
            self.name, self.times, self.policy = name, list(times), {"prompts_seen": 0}

    ran = []

    def run(m):
        ran.append((m.name, m.policy["prompts_seen"]))
        m.policy["prompts_seen"] += 1  # what a policy learns from a generation
        return PromptRun(method=m.name, tokens=[1], prompt_tokens=1, target_passes=1, committed_after_prefill=1,
                         prefill_time=0.0, decode_time=m.times.pop(0))

    a, b = Method("a", [3.0, 1.0, 2.0]), Method("b", [5.0, 9.0, 4.0])
    out = _repeated([a, b], 3, run)
    assert ran == [("a", 0), ("b", 0), ("b", 0), ("a", 0), ("a", 0), ("b", 0)]  # rotated, same state each time
    assert out["a"].decode_time == 2.0 and out["a"].decode_times == [3.0, 1.0, 2.0]
    assert out["b"].decode_time == 5.0
    assert a.policy == {"prompts_seen": 1} and b.policy == {"prompts_seen": 1}  # as after one run
    with pytest.raises(Exception, match="--repeats"):
        BenchConfig(repeats=0)
