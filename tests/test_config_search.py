"""The fastest exact llama.cpp configuration per file (issue 36): the selection rule on fake measurements, the
cached choice and how a loaded target uses it (explicit settings win), and one real search on SmolLM2 Q4_1
with a reduced grid."""

from __future__ import annotations

import json
import os

import pytest

from conftest import import_llama_cpp
from hyflash.cli import main
from hyflash.targets.llamacpp_settings import LlamaCppSettings, Trial, choose

FA_Q8 = LlamaCppSettings(2, True, "q8_0", "f16", True)
FA_F16 = LlamaCppSettings(2, True, "f16", "f16", True)
NOFA_F16 = LlamaCppSettings(2, False, "f16", "f16", True)
ONE_THREAD = LlamaCppSettings(1, False, "f16", "f16", False)


def trial(settings, exactness, c1, c2=None, c4=None) -> Trial:
    return Trial(settings, exactness, [c1, c2 or 1.5 * c1, c4 or 2.5 * c1])


def test_a_faster_configuration_that_is_not_exact_loses_to_a_slower_exact_one():
    exact, inexact = trial(FA_Q8, 0.0, 12.0), trial(NOFA_F16, 0.4, 9.0)
    assert choose([inexact, exact]) is exact
    assert choose([inexact, trial(FA_F16, 0.0, 11.0), exact]).settings == FA_F16  # the fastest exact one


def test_one_token_costs_within_three_percent_tie_and_the_cheaper_four_token_pass_wins():
    cheap_drafts = trial(FA_Q8, 0.0, 10.2, c4=22.0)
    fastest_step = trial(FA_F16, 0.0, 10.0, c4=30.0)
    assert choose([fastest_step, cheap_drafts]) is cheap_drafts  # 2% slower step, 2.16x vs 3.0x for q = 4
    slower = trial(FA_Q8, 0.0, 10.5, c4=22.0)  # 5% slower: no tie
    assert choose([fastest_step, slower]) is fastest_step


def test_with_nothing_exact_the_fastest_runs_and_says_so():
    from hyflash.config_search import SearchResult, choice_line

    trials = [trial(FA_Q8, 0.2, 12.0), trial(NOFA_F16, 0.5, 9.0), Trial(ONE_THREAD, error="refused")]
    choice = choose(trials)
    assert choice.settings == NOFA_F16
    result = SearchResult("m", None, "Q4_1", trials, choice)
    assert not result.exact and "NOT bit-identical" in choice_line(result)


def test_settings_the_user_fixed_choose_among_the_matching_configurations_only():
    trials = [trial(FA_Q8, 0.0, 12.0), trial(NOFA_F16, 0.0, 9.0), trial(ONE_THREAD, 0.0, 8.0)]
    assert choose(trials).settings == ONE_THREAD
    assert choose(trials, {"threads": 2}).settings == NOFA_F16
    assert choose(trials, {"threads": 2, "cache_type_k": "q8_0"}).settings == FA_Q8
    assert choose(trials, {"threads": 4}) is None
    assert choose([Trial(FA_Q8, error="refused")]) is None


def test_the_grid_holds_each_cache_pair_once_and_no_quantised_v_without_flash_attention():
    import_llama_cpp()
    from hyflash.config_search import settings_grid, thread_counts

    assert thread_counts(1) == [1] and thread_counts(2) == [1, 2] and thread_counts(6) == [1, 2, 4, 6]
    grid = settings_grid("Q4_1", cores=2)
    assert len(grid) == len(set(grid))
    assert all(s.flash_attn or s.cache_type_v == "f16" for s in grid)
    assert {s.threads for s in grid} == {1, 2} and {s.flash_attn for s in grid} == {True, False}
    assert {(s.cache_type_k, s.cache_type_v) for s in grid} == {("q8_0", "f16"), ("f16", "f16"), ("q8_0", "q8_0")}


@pytest.fixture
def settings_cache(tmp_path, monkeypatch):
    """An empty cache folder, the searched settings switched on (conftest switches them off), and no thread
    count chosen in the environment (it would fix the threads)."""
    import_llama_cpp()
    if os.environ.get("HYFLASH_SKIP_REAL_MODEL"):
        pytest.skip("HYFLASH_SKIP_REAL_MODEL is set")
    monkeypatch.setenv("HYFLASH_CACHE", str(tmp_path))
    for name in ("HYFLASH_NO_SEARCHED_SETTINGS", "HYFLASH_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    from hyflash.targets import gguf_path

    return gguf_path("smollm2-135m")


def test_a_saved_search_comes_back_for_the_same_file_only(settings_cache, tmp_path):
    from hyflash.targets.llamacpp_settings import load_search, save_search, settings_folder

    trials = [trial(FA_Q8, 0.0, 12.0), trial(ONE_THREAD, 0.3, 8.0), Trial(FA_F16, error="refused")]
    cached = save_search(settings_cache, "Q4_1", trials)
    assert cached.parent == settings_folder() and settings_folder().is_relative_to(tmp_path)
    precision, back = load_search(settings_cache)
    assert precision == "Q4_1" and back == trials
    assert json.loads(cached.read_text())["choice"]["cache_type_k"] == "q8_0"  # the exact one
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF" + bytes(64))
    assert load_search(other) is None  # another file's fingerprint
    cached.write_text("{not json")
    assert load_search(settings_cache) is None


def test_load_runs_the_searched_choice_unless_the_user_gave_settings(settings_cache, monkeypatch):
    from hyflash.targets.llamacpp import LlamaCppTarget
    from hyflash.targets.llamacpp_build import default_repack
    from hyflash.targets.llamacpp_settings import save_search

    def load(**options):  # by path: llama.cpp's own tokenizer loads in milliseconds
        return LlamaCppTarget.load(str(settings_cache), record_features=False, n_ctx=256, **options)

    default = load()
    assert (default.threads, default.flash_attn, default.cache_types) == (1, True, ("q8_0", "f16"))  # conftest: 1
    repack = default_repack()  # False on a build where repacking crashes
    searched = LlamaCppSettings(1, False, "f16", "f16", not repack)
    save_search(settings_cache, "Q4_1", [trial(LlamaCppSettings(2, True, "q8_0", "f16", repack), 0.0, 12.0),
                                         trial(searched, 0.0, 8.0),
                                         trial(LlamaCppSettings(2, True, "q8_0", "q8_0", repack), 0.0, 9.0)])
    chosen = load()
    assert (chosen.threads, chosen.flash_attn, chosen.cache_types, chosen.repack) == (
        1, False, ("f16", "f16"), not repack)
    assert chosen.identity()["repack"] is (not repack)  # its cost curves are its own
    assert "repack" not in default.identity()  # keys made before the setting existed stay valid
    # Explicit settings win; the rest is the best searched configuration that matches them.
    fixed = load(cache_type_k="auto", cache_type_v="auto")
    assert (fixed.threads, fixed.flash_attn, fixed.cache_types) == (2, True, ("q8_0", "f16"))
    two = load(n_threads=2)
    assert (two.threads, two.cache_types) == (2, ("q8_0", "q8_0"))
    monkeypatch.setenv("HYFLASH_THREADS", "2")
    assert load().cache_types == ("q8_0", "q8_0")
    monkeypatch.delenv("HYFLASH_THREADS")
    unmatched = load(flash_attn=False, cache_type_k="q8_0")  # searched with flash attention only: defaults
    assert (unmatched.flash_attn, unmatched.cache_types, unmatched.repack) == (False, ("q8_0", "f16"), repack)
    monkeypatch.setenv("HYFLASH_NO_SEARCHED_SETTINGS", "1")
    assert load().flash_attn is True


def test_the_plain_llama_cpp_peer_loads_with_the_targets_weight_buffers():
    llama_cpp = import_llama_cpp()
    from hyflash.targets.llamacpp_build import _peer_model_params, model_params

    assert model_params(repack=False).use_extra_bufts is False and model_params(repack=True).use_extra_bufts
    for repack in (True, False):
        with _peer_model_params(repack):
            assert llama_cpp.llama_cpp.llama_model_default_params().use_extra_bufts is repack


@pytest.mark.slow
def test_a_real_search_on_a_reduced_grid_measures_caches_and_is_used(settings_cache, capsys, monkeypatch):
    """SmolLM2 Q4_1 at one thread, two configurations that run and one llama.cpp refuses; reps=1 (its numbers
    are not the point: that each is measured, chosen by the rule and run by the next load)."""
    import hyflash.config_search as config_search
    from hyflash.targets.llamacpp import LlamaCppTarget

    grid = [LlamaCppSettings(1, True, "q8_0", "f16", False), LlamaCppSettings(1, False, "f16", "f16", False),
            LlamaCppSettings(1, False, "q8_0", "q8_0", False)]
    lines = []
    result = config_search.search_settings("smollm2-135m", grid, reps=1, announce=lines.append)
    assert len(lines) == 3 and "1/3" in lines[0] and "not run" in lines[2]
    ran = result.trials[:2]
    assert all(t.ran and t.exactness >= 0.0 and all(ms > 0 for ms in t.pass_ms) for t in ran)
    assert ran[0].exactness == 0.0  # the shipped default's exactness (experiments/llamacpp/kv_cache.md)
    assert not result.trials[2].ran
    assert result.choice is choose(result.trials) and result.cache_file.exists()
    target = LlamaCppTarget.load(str(settings_cache), record_features=False, n_ctx=256)
    assert (target.flash_attn, target.cache_types) == (result.choice.settings.flash_attn,
                                                       (result.choice.settings.cache_type_k,
                                                        result.choice.settings.cache_type_v))
    # The command prints the table and the choice, then calibrates the chosen settings (faked here).
    import hyflash.calibration as calibration
    from hyflash.costs import CostCurve

    monkeypatch.setattr(config_search, "search_settings", lambda model, announce=None: result)
    monkeypatch.setattr(calibration, "calibrate", lambda model, dtype, *a, **k: (
        CostCurve(model, "Q4_1", [0], [[10.0, 14.0]]), False))
    assert main(["calibrate", "--backend", "llama.cpp", "--search-config", "--plot", ""]) == 0
    out = capsys.readouterr().out
    assert "| c(1) ms |" in out and "**(chosen)**" in out and "chosen 1 thread" in out
    assert main(["calibrate", "--backend", "llama.cpp", "--search-config", "--plot", "", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["config_search"]["choice"]["settings"] == result.choice.to_dict()["settings"]


def test_search_config_is_for_llama_cpp_only(capsys):
    assert main(["calibrate", "--search-config"]) == 2
    assert "add --backend llama.cpp" in capsys.readouterr().err


def test_calibrate_reports_the_llama_cpp_settings_a_curve_was_measured_with():
    from hyflash.calibration import exactness_line
    from hyflash.costs import CostCurve

    machine = {"backend": "llama.cpp", "threads": 2, "flash_attn": False, "cache_types": ["f16", "f16"],
               "repack": True}
    line = exactness_line(CostCurve("m", "Q4_1", [0], [[1.0]], machine=machine, exactness=0.0))
    assert "2 threads, flash attention off, K f16 / V f16, repacked weights" in line and "bit-identical" in line
    assert "two-by-two" not in line
    patched = exactness_line(CostCurve("m", "Q4_1", [0], [[1.0]], machine={**machine, "two_by_two": 1}, exactness=0.0))
    assert patched.endswith("bit-identical: speculative greedy text equals plain decoding's")
    assert "repacked weights (not the build's default), ggml's two-by-two kernels (patches/))" in patched
