"""The kinds grid of issue 17: its summarizer on synthetic bench results (summary shape, verdicts both ways,
memory rules kept apart, bad input), the anchor-context share, the grid's commands (a dry run), and the
SCALE=tiny script path end to end on a tiny random model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments.kinds import anchor_context_share as anchor_share
from experiments.kinds import summarize
from hyflash.errors import HyflashError
from hyflash.training.batches import anchor_context_stats, training_batches
from hyflash.training.data import TokenDataset, write_dataset

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "experiments" / "kinds" / "grid.sh"
COLLECT = ROOT / "experiments" / "kinds" / "collect.sh"
SETS = ["humaneval", "code", "long-2k", "long-4k", "long-8k"]
LENGTHS = {"humaneval": 150, "code": 1024, "long-2k": 2048, "long-4k": 4096, "long-8k": 8192}


# ----- synthetic bench results -------------------------------------------------------------------------------
def _record(method: str, set_name: str, tau: float, temperature: float = 0.0) -> dict:
    return {"method": method, "set": set_name, "temperature": temperature, "tau": tau,
            "prompt_tokens": LENGTHS[set_name], "item_id": f"{set_name}:x", "target_passes": 10}


def _config(name: str) -> dict:
    m = summarize.SEED_NAME.match(name) or summarize.RULE_NAME.match(name)
    rule = m.groupdict().get("rule") or "gated_delta"
    return {"config": {"kind": m["kind"], "num_layers": int(m["depth"]), "memory_rule": rule}}


def write_bench(folder: Path, taus: dict[str, dict[str, list[float]]], extra_runs=()) -> Path:
    """A results.json as `hyflash bench` writes it: taus[method][set] = greedy tau of each prompt."""
    runs = [_record("plain", s, 1.0) for s in SETS]
    for method, by_set in taus.items():
        for set_name, values in by_set.items():
            runs += [_record(method, set_name, t) for t in values]
            runs.append(_record(method, set_name, 9.0, temperature=1.0))  # sampled runs must not count
    runs += list(extra_runs)
    drafters = {m: _config(m) for m in taus if m != "plain"}
    results = {"meta": {"command": "hyflash bench (synthetic)", "drafters": drafters}, "runs": runs,
               "summary": [], "memory_sweep": {}, "errors": {},
               "drafter_params": {m: 6_310_000 if m.startswith(("full", "local")) else 6_325_000 for m in drafters}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(results))
    return folder


def grid_taus(gain_d1: float, gain_d2: float, spread: float, long_extra: float = 0.0, seeds=(3, 2)) -> dict:
    """Every kind-depth of the grid; full at 1.5 (d1) / 1.4 (d2) on every set, hyflash that plus its gain (plus
    long_extra on long-8k at d1); seed s adds s * spread / (seeds - 1), so each cell's seed spread is `spread`.
    Two prompts per set, +-0.1 around the seed's value (their mean is the value)."""
    def cell(base: float, s: int, n: int) -> list[float]:
        v = base + (s * spread / (n - 1) if n > 1 else 0.0)
        return [v - 0.1, v + 0.1]

    taus = {}
    plan = {("full", 1): 1.5, ("hyflash", 1): 1.5 + gain_d1, ("local", 1): 1.45, ("memory", 1): 1.4,
            ("full", 2): 1.4, ("hyflash", 2): 1.4 + gain_d2}
    for (kind, depth), base in plan.items():
        n = seeds[0] if (kind in ("full", "hyflash") and depth == 1) else seeds[1]
        for s in range(n):
            taus[f"{kind}-d{depth}-s{s}"] = {
                x: cell(base + (long_extra if (kind, depth, x) == ("hyflash", 1, "long-8k") else 0.0), s, n)
                for x in SETS}
    return taus


# ----- the summarizer ----------------------------------------------------------------------------------------
def test_summary_averages_prompts_per_seed_then_over_seeds(tmp_path):
    taus = {"hyflash-d1-s0": {"code": [1.0, 2.0]}, "hyflash-d1-s1": {"code": [2.5, 2.5]},
            "hyflash-d1-s2": {"code": [2.0]}, "full-d2-s1": {"code": [1.2], "long-8k": [1.1, 1.3]},
            "hyflash-d1-rule-delta": {"code": [4.0]}, "hyflash-d1-rule-linear": {"code": [3.0]}}
    bench = write_bench(tmp_path / "bench", taus, extra_runs=[_record("ngram", "code", 3.0),
                                                              _record("hyflash-d1-s0@t8", "code", 5.0)])
    written = summarize.write_all(bench, tmp_path / "out")
    assert all(p.exists() for p in written)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    # Exactly {kind-depth: {set: {"tau_mean", "tau_seeds"}}}: no rule runs, no other methods.
    assert list(summary) == ["full-d2", "hyflash-d1"]
    for cells in summary.values():
        for cell in cells.values():
            assert set(cell) == {"tau_mean", "tau_seeds"}
    assert summary["hyflash-d1"] == {"code": {"tau_mean": 2.0, "tau_seeds": [1.5, 2.5, 2.0]}}
    assert summary["full-d2"] == {"code": {"tau_mean": 1.2, "tau_seeds": [1.2]},
                                  "long-8k": {"tau_mean": 1.2, "tau_seeds": [1.2]}}
    # Memory rules apart: the default rule's row is hyflash-d1-s0 itself.
    rules = json.loads((tmp_path / "out" / "memory_rules.json").read_text())
    assert list(rules) == ["linear", "delta", "gated_delta"]
    assert rules["delta"] == {"drafter": "hyflash-d1-rule-delta", "sets": {"code": 4.0}}
    assert rules["gated_delta"] == {"drafter": "hyflash-d1-s0", "sets": {"code": 1.5}}
    claims = (tmp_path / "out" / "claims.md").read_text()
    assert "not used" in claims and "ngram" in claims and "hyflash-d1-s0@t8" in claims
    # The sampled runs (tau 9.0 in write_bench) make their own summary and claims section, apart from greedy's.
    sampled = json.loads((tmp_path / "out" / "summary_t1.json").read_text())
    assert sampled["hyflash-d1"]["code"] == {"tau_mean": 9.0, "tau_seeds": [9.0, 9.0, 9.0]}
    assert claims.index("## Greedy") < claims.index(summarize.SAMPLED_TITLE)


def _verdicts(tmp_path, **grid) -> dict[str, tuple[float, float, str]]:
    bench = write_bench(tmp_path / "bench", grid_taus(**grid))
    seeds, _, sets, _ = summarize.taus(summarize.load_results(bench)[0])
    rows = summarize.claims(summarize.summary(seeds, sets), sets)
    return {r["claim"][:3]: (r["statistic"], r["noise"], r["verdict"]) for r in rows}


def test_verdicts_supported_refuted_and_within_noise(tmp_path):
    # A clear gain at both depths, larger at d1, and larger at 8k: supported three times.
    v = _verdicts(tmp_path / "a", gain_d1=0.5, gain_d2=0.1, spread=0.02, long_extra=0.3)
    assert v["(a)"][2] == v["(b)"][2] == v["(c)"][2] == "supported"
    assert v["(a)"][0] == pytest.approx(0.5 + 0.3 / 5) and v["(a)"][1] == pytest.approx(0.02)
    assert v["(c)"][0] == pytest.approx(0.3)
    # The same differences under a seed spread larger than all of them: within noise.
    v = _verdicts(tmp_path / "b", gain_d1=0.05, gain_d2=0.0, spread=0.2, long_extra=0.1)
    assert v["(a)"][2] == v["(b)"][2] == v["(c)"][2] == "within noise"
    assert v["(a)"][1] == pytest.approx(0.2)
    # full ahead by more than the spread, the gain smaller at d1 and at 8k: refuted.
    v = _verdicts(tmp_path / "c", gain_d1=-0.3, gain_d2=0.2, spread=0.05, long_extra=-0.2)
    assert v["(a)"][2] == v["(b)"][2] == v["(c)"][2] == "refuted"
    # One seed per cell: no spread to judge by.
    v = _verdicts(tmp_path / "d", gain_d1=0.5, gain_d2=0.1, spread=0.0, seeds=(1, 1))
    assert v["(a)"][2] == "not enough seeds"


def test_verdict_rule_and_claims_table(tmp_path):
    cell = lambda *seeds: {"tau_mean": sum(seeds) / len(seeds), "tau_seeds": list(seeds)}  # noqa: E731
    assert summarize.verdict(0.11, [cell(1.0, 1.1), cell(1.2, 1.25)]) == ("supported", pytest.approx(0.1))
    assert summarize.verdict(0.09, [cell(1.0, 1.1), cell(1.2, 1.25)])[0] == "within noise"
    assert summarize.verdict(-0.11, [cell(1.0, 1.1), cell(1.2, 1.25)])[0] == "refuted"
    assert summarize.verdict(0.5, [cell(1.0, 1.1), None]) == ("not measured", None)
    bench = write_bench(tmp_path / "bench", grid_taus(0.5, 0.1, 0.02))
    summarize.write_all(bench)
    claims = (bench / "claims.md").read_text()
    rows = [line for line in claims.splitlines() if line.startswith("| (")]
    assert len(rows) == 6 and all("**supported**" in r for r in rows[:2])  # greedy, then T = 1
    assert all("**within noise**" in r for r in rows[3:])  # write_bench samples 9.0 for every drafter: no gain
    assert "largest seed spread" in claims and "Parameters (seed 0): full-d1 6,310,000, hyflash-d1 6,325,000" in claims
    assert "| linear |" not in claims and "gated_delta | hyflash-d1-s0" in claims  # no rule runs but the default
    # A claim with a missing kind: not measured.
    taus = {k: v for k, v in grid_taus(0.5, 0.1, 0.02).items() if not k.startswith("full-d2")}
    write_bench(tmp_path / "partial", taus)
    summarize.write_all(tmp_path / "partial")
    assert "**not measured**" in (tmp_path / "partial" / "claims.md").read_text()


def test_benches_of_one_grid_made_apart_are_summarised_as_one(tmp_path):
    """Depth 1 benched in one session, depth 2 in another: one summary and claim (b) decided across them; a
    drafter in both benches, other settings, or no --out are refused."""
    taus = grid_taus(gain_d1=0.4, gain_d2=0.0, spread=0.05)
    d1 = write_bench(tmp_path / "d1", {m: t for m, t in taus.items() if "-d1-" in m})
    d2 = write_bench(tmp_path / "d2", {m: t for m, t in taus.items() if "-d2-" in m})
    summarize.write_all([d1, d2], tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary == json.loads((write_bench_and_summarize(tmp_path / "one", taus) / "summary.json").read_text())
    claims = (tmp_path / "out" / "claims.md").read_text()
    assert f"- {d1}:" in claims and f"- {d2}:" in claims
    b = summarize.claims(summary, SETS)[1]
    assert b["claim"].startswith("(b)") and b["verdict"] == "supported"
    with pytest.raises(HyflashError, match="--out"):
        summarize.write_all([d1, d2])
    with pytest.raises(HyflashError, match="in both"):
        summarize.write_all([d1, write_bench(tmp_path / "again", {"full-d1-s0": taus["full-d1-s0"]})], tmp_path / "x")
    other = json.loads((d2 / "results.json").read_text())
    other["meta"]["config"] = {"max_new_tokens": 7}
    (d2 / "results.json").write_text(json.dumps(other))
    with pytest.raises(HyflashError, match="other settings .*max_new_tokens"):
        summarize.write_all([d1, d2], tmp_path / "x")


def write_bench_and_summarize(folder: Path, taus: dict) -> Path:
    summarize.write_all(write_bench(folder / "bench", taus), folder)
    return folder


def test_summarizer_refuses_bad_input(tmp_path, capsys):
    with pytest.raises(HyflashError, match="does not exist"):
        summarize.write_all(tmp_path / "nothing")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text("{not json")
    with pytest.raises(HyflashError, match="cannot be read as JSON"):
        summarize.write_all(tmp_path / "bad")
    bench = write_bench(tmp_path / "named", {"hyflash-d1-s0": {"code": [1.5]}})
    results = json.loads((bench / "results.json").read_text())
    results["meta"]["drafters"]["hyflash-d1-s0"]["config"]["kind"] = "full"  # the name lies about the folder
    (bench / "results.json").write_text(json.dumps(results))
    with pytest.raises(HyflashError, match="named as"):
        summarize.write_all(bench)
    write_bench(tmp_path / "none", {})
    assert summarize.main([str(tmp_path / "none")]) == 2
    assert "summarize: error: no greedy runs" in capsys.readouterr().err


# ----- the anchor-context share ------------------------------------------------------------------------------
SIGNATURE = {"hidden_size": 8, "vocab_size": 100, "num_layers": 2, "feature_layers": [0]}


def test_anchor_context_share_counts_the_training_anchors(tmp_path):
    rng = np.random.default_rng(0)
    # Long prompts (every anchor has >= 100 tokens before it), short ones (< 40 tokens in all), one cropped one.
    seqs = [rng.integers(1, 100, 150).tolist() for _ in range(4)] + [rng.integers(1, 100, 30).tolist() for _ in range(4)]
    starts = [100] * 4 + [5] * 4
    write_dataset(tmp_path / "d", seqs, starts, SIGNATURE)
    data = TokenDataset(tmp_path / "d")
    stats = anchor_context_stats(data, steps=6, batch_size=2, num_anchors=8, block_size=4, max_length=512, seed=0,
                                 window=64, chunk_size=16)
    contexts = [int(a) for _, _, b in training_batches(data, 6, 2, 8, 4, 512, 0)
                for a, ok in zip(b.anchors.flatten(), (b.labels[:, :, 0] >= 0).flatten()) if ok]
    assert stats["anchors"] == len(contexts) and stats["anchors"] + stats["padded_anchor_slots"] == 6 * 2 * 8
    long = sum(a > 64 for a in contexts)
    assert 0 < long < len(contexts) and stats["share_context_exceeds_window"] == round(long / len(contexts), 4)
    # Memory in use from a >= window + chunk (hyflash's memory_start > 0): every long-prompt anchor (a >= 100).
    assert stats["share_memory_in_use"] == stats["share_context_exceeds_window"]
    assert stats["share_context_over"]["256"] == 0.0 and stats["context_max"] <= 148
    # Cropping to max_length moves every anchor of the long sequences below the window.
    cropped = anchor_context_stats(data, 6, 2, 8, 4, 60, 0, window=64, chunk_size=16)
    assert cropped["share_context_exceeds_window"] == 0.0
    out = tmp_path / "share.json"
    assert anchor_share.main(["--data", str(tmp_path / "d"), "--steps", "6", "--batch-size", "2", "--anchors", "8",
                              "--block-size", "4", "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["share_context_exceeds_window"] == stats["share_context_exceeds_window"]
    assert written["settings"]["steps"] == 6 and written["data"]["sequences"] == 8
    assert anchor_share.main(["--data", str(tmp_path / "d"), "--steps", "1", "--batch-size", "9", "--anchors", "8",
                              "--out", str(out)]) == 2  # fewer sequences than one batch


# ----- the script ----------------------------------------------------------------------------------------------
def _script(out: Path, timeout: float = 600, **env) -> subprocess.CompletedProcess:
    full = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable, **env}
    return subprocess.run(["bash", str(SCRIPT), str(out)], env=full, capture_output=True, text=True, timeout=timeout)


def test_dry_run_prints_the_whole_grid_and_one_bench(tmp_path):
    done = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "g")], capture_output=True, text=True,
                          env={**os.environ, "SCALE": "gpu", "DRY_RUN": "1"}, timeout=30)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    train = [line for line in lines if " train " in line]
    names = [re.search(r"--out \S+/runs/(\S+) ", line)[1] for line in train]
    expected = ([f"{k}-d1-s{s}" for k in ("full", "hyflash") for s in range(3)]
                + [f"{k}-d{d}-s{s}" for k, d in (("local", 1), ("memory", 1), ("full", 2), ("hyflash", 2)) for s in (0, 1)]
                + [f"hyflash-d1-rule-{r}" for r in ("linear", "gated", "delta")])
    assert sorted(names) == sorted(expected)
    assert names[:4] == ["full-d2-s0", "hyflash-d2-s0", "full-d1-s0", "hyflash-d1-s0"]  # costliest first, by seed
    for name, line in zip(names, train):
        kind, depth = re.match(r"(\w+)-d(\d)", name).groups()
        seed = re.search(r"-s(\d)$", name)
        rule = re.search(r"-rule-(\w+)$", name)
        assert f"--kind {kind} --num-layers {depth} --seed {seed[1] if seed else 0} " in line
        assert f"--memory-rule {rule[1] if rule else 'gated_delta'} " in line
        assert "--max-length 4096" in line and line.endswith("--resume")
        assert "--data data/smollm2-135m/train-v2 data/smollm2-135m/long-v1 data/smollm2-135m/train-v3 " in line
        assert "--steps 250 --batch-size 64 --anchors 64 " in line  # the gpu budget, the same for every run
        assert "--copy-ngram 16 --copy-gate" in line  # the shipped drafter's copy input and gate, for every kind
    bench = [line for line in lines if " bench " in line]
    assert len(bench) == 1
    assert "--sets humaneval,code,long-2k,long-4k,long-8k" in bench[0] and "--temperatures 0,1" in bench[0]
    assert sorted(re.findall(r"--drafter (\S+)=", bench[0])) == sorted(expected)
    assert "--memory-contexts 256,1024,2048,4096,8192" in bench[0] and "--out " + str(tmp_path / "g/bench") in bench[0]
    assert bench[0].endswith(" --resume")  # the bench grows with the grid: only new drafters and prompts run
    assert any("anchor_context_share.py" in line for line in lines) and "summarize.py" in lines[-1]
    assert not (tmp_path / "g").exists()  # a dry run writes nothing
    plain = _script(tmp_path / "g", SCALE="gpu", DRY_RUN="1", COPY_NGRAM="0")
    assert plain.returncode == 0 and " train " in plain.stdout and "--copy" not in plain.stdout
    assert _script(tmp_path / "g", SCALE="gpu", DRY_RUN="1", COPY_NGRAM="17").returncode == 2
    # Pinned autocast and float32 feature passes reach every run (a grid that moves between machines).
    pinned = _script(tmp_path / "g", SCALE="cpu", DRY_RUN="1", AUTOCAST="off", FEATURE_COMPUTE_DTYPE="float32")
    runs = [line for line in pinned.stdout.splitlines() if " train " in line]
    assert len(runs) == len(expected) and all(x.endswith("--no-autocast --feature-compute-dtype float32") for x in runs)
    assert _script(tmp_path / "g", SCALE="cpu", DRY_RUN="1", AUTOCAST="maybe").returncode == 2
    bad = _script(tmp_path / "g", SCALE="huge")
    assert bad.returncode == 2 and "SCALE must be gpu, cpu or tiny" in bad.stderr


def test_each_stage_trains_then_benches_run_after_run_in_the_order_given(tmp_path):
    done = _script(tmp_path / "g", SCALE="cpu", DRY_RUN="1", STAGE="each", RUNS="hyflash-d1-s1 full-d2-s0")
    assert done.returncode == 0, done.stderr
    steps = [("train", re.search(r"--out \S+/runs/(\S+) ", line)[1]) if " train " in line else
             ("bench", re.findall(r"--drafter (\S+)=", line)) for line in done.stdout.splitlines()
             if " train " in line or " bench " in line]
    assert steps == [("train", "hyflash-d1-s1"), ("bench", ["hyflash-d1-s1"]),
                     ("train", "full-d2-s0"), ("bench", ["full-d2-s0"])]
    bad = _script(tmp_path / "g", SCALE="cpu", DRY_RUN="1", STAGE="every")
    assert bad.returncode == 2 and "STAGE must be all, train, bench, summary or each" in bad.stderr


def test_the_default_rule_retrained_as_a_rule_run_is_the_baseline_of_the_rule_table(tmp_path):
    # Rule runs trained with another arithmetic than hyflash-d1-s0 need a baseline of their own: RUNS may name
    # the default rule as a rule run (the whole grid leaves it out), and the summary's default row is then it.
    done = _script(tmp_path / "g", SCALE="cpu", DRY_RUN="1", STAGE="each", RUNS="hyflash-d1-rule-gated_delta")
    assert done.returncode == 0, done.stderr
    train = [line for line in done.stdout.splitlines() if " train " in line]
    assert len(train) == 1 and "--kind hyflash --num-layers 1 --seed 0 --memory-rule gated_delta " in train[0]
    bench = [line for line in done.stdout.splitlines() if " bench " in line]  # and the bench then takes it
    assert len(bench) == 1 and re.findall(r"--drafter (\S+)=", bench[0]) == ["hyflash-d1-rule-gated_delta"]
    whole = _script(tmp_path / "g", SCALE="cpu", DRY_RUN="1")
    assert "rule-gated_delta" not in whole.stdout
    assert _script(tmp_path / "g", SCALE="cpu", DRY_RUN="1", RUNS="hyflash-d2-rule-gated_delta").returncode == 2
    out = write_bench_and_summarize(tmp_path / "s", {"hyflash-d1-s0": {"code": [1.5]},
                                                     "hyflash-d1-rule-gated_delta": {"code": [2.5]},
                                                     "hyflash-d1-rule-delta": {"code": [2.0]}})
    rules = json.loads((out / "memory_rules.json").read_text())
    assert rules["gated_delta"] == {"drafter": "hyflash-d1-rule-gated_delta", "sets": {"code": 2.5}}
    # A bench of rule runs alone (the rules trained apart from the seed runs) has a rule table, not an error.
    alone = write_bench_and_summarize(tmp_path / "r", {"hyflash-d1-rule-linear": {"code": [2.0]}})
    assert json.loads((alone / "memory_rules.json").read_text()) == {
        "linear": {"drafter": "hyflash-d1-rule-linear", "sets": {"code": 2.0}}}
    assert json.loads((alone / "summary.json").read_text()) == {} and not (alone / summarize.PLOT).exists()


def _tiny_model_and_data(folder: Path) -> tuple[Path, Path]:
    """A tiny random Llama with SmolLM2's tokenizer (the bench's sets are text), and target-written data for it:
    its greedy continuations of random prompts, some longer than the drafters' 64-token window."""
    import torch
    from conftest import tiny_llama
    from transformers import AutoTokenizer

    from hyflash.targets import HFTarget, resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m"))
    model = tiny_llama(vocab=len(tok))
    model.save_pretrained(folder / "model")
    tok.save_pretrained(folder / "model")
    target = HFTarget(model, tok, name="tiny")
    prompts = torch.randint(0, len(tok), (6, 90), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model.generate(prompts, max_new_tokens=30, do_sample=False, pad_token_id=0)
    write_dataset(folder / "data", [row.tolist() for row in out], [90] * len(out), target.signature(), name="tiny")
    return folder / "model", folder / "data"


@pytest.mark.slow  # ~30 s: three `hyflash` processes (two trainings and the bench) on a tiny model
def test_tiny_scale_runs_end_to_end_and_resumes(tmp_path):
    if os.environ.get("HYFLASH_SKIP_REAL_MODEL"):
        pytest.skip("HYFLASH_SKIP_REAL_MODEL is set (the tiny model borrows the real model's tokenizer)")
    model, data = _tiny_model_and_data(tmp_path)
    out = tmp_path / "grid"
    env = {"SCALE": "tiny", "MODEL": str(model), "DATA": str(data), "RUNS": "hyflash-d1-s0 full-d1-s0"}
    alone = _script(out, **{**env, "RUNS": "hyflash-d1-s0"})  # one run trained and benched ...
    assert alone.returncode == 0, alone.stdout[-3000:] + alone.stderr[-3000:]
    first = _script(out, **env)  # ... then the bench grows by the next: the first run's records are kept
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "records kept" in (out / "logs" / "bench.log").read_text()
    for name in ("hyflash-d1-s0", "full-d1-s0"):
        assert (out / "runs" / name / "drafter" / "config.json").exists()
        assert json.loads((out / "runs" / name / "train_config.json").read_text())["max_length"] == 4096
        drafter = json.loads((out / "runs" / name / "drafter" / "config.json").read_text())
        assert drafter["copy_ngram"] == 16 and drafter["copy_gate"] is True
    results = json.loads((out / "bench" / "results.json").read_text())
    assert results["meta"]["config"]["sets"] == SETS and results["meta"]["config"]["temperatures"] == [0.0, 1.0]
    assert {r["method"] for r in results["runs"]} == {"plain", "hyflash-d1-s0", "full-d1-s0"}
    assert set(results["memory_sweep"]) == {"hyflash-d1-s0", "full-d1-s0"}
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"full-d1", "hyflash-d1"} and set(summary["hyflash-d1"]) == set(SETS)
    assert all(len(c["tau_seeds"]) == 1 for cells in summary.values() for c in cells.values())
    assert "**not enough seeds**" in (out / "claims.md").read_text()
    share = json.loads((out / "anchor_context.json").read_text())
    assert 0 < share["share_context_exceeds_window"] <= 1 and share["settings"]["max_length"] == 4096
    assert (out / "tau_vs_context_by_kind.png").stat().st_size > 0
    # Run again: both runs and the bench are finished, so only the summary is redone.
    again = _script(out, **env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("finished, skipped") == 2 and "bench: finished with the same command" in again.stdout
    # The committed copy: summary, claims, the bench and each run's configs and curves; no weights, no raw logs.
    docs = tmp_path / "docs"
    collected = subprocess.run(["bash", str(COLLECT), str(out)], env={**os.environ, "DEST": str(docs)},
                               capture_output=True, text=True, timeout=180)
    assert collected.returncode == 0, collected.stderr
    assert json.loads((docs / "summary.json").read_text()) == summary and (docs / "grid/bench/results.json").exists()
    assert sorted(p.name for p in (docs / "grid/runs").iterdir()) == ["full-d1-s0", "hyflash-d1-s0"]
    assert not list(docs.rglob("*.safetensors")) and not list(docs.rglob("*.jsonl")) and not list(docs.rglob("*.log"))
    # A second bench of the same grid goes beside the first; the same drafters in two benches are refused.
    def collect(*args):
        return subprocess.run(["bash", str(COLLECT), str(out), *args], env={**os.environ, "DEST": str(docs)},
                              capture_output=True, text=True, timeout=180)

    again = collect("bench-2")
    assert again.returncode == 2 and "in both" in again.stderr and (docs / "grid/bench/results.json").exists()
    assert sorted(p.name for p in (docs / "grid").iterdir()) == ["bench", "runs"]  # nothing left of the refused one
    assert collect("other").returncode == 2
    # A feature cache moved elsewhere changes no result: the OUTDIR is still this grid's ...
    moved = _script(out, **{**env, "FEATURE_CACHE": str(tmp_path / "fc")})
    assert moved.returncode == 0 and moved.stdout.count("finished, skipped") == 2, moved.stderr[-3000:]
    # ... but other settings in the same OUTDIR are refused.
    other = _script(out, **{**env, "COPY_NGRAM": "8"})
    assert other.returncode == 2 and "other settings" in other.stderr


def test_the_rule_table_names_the_default_rule_by_the_seed_noise_of_its_mean(tmp_path):
    # hyflash-d1 seeds 0 and 1 differ by 0.2 on every set, so the mean column's noise is 0.2: a rule 0.3 ahead of
    # gated_delta (hyflash-d1-s0 itself) should become the default, one 0.1 ahead should not.
    seeds = {"hyflash-d1-s0": {s: [2.0] for s in SETS}, "hyflash-d1-s1": {s: [2.2] for s in SETS}}
    ahead = write_bench_and_summarize(tmp_path / "a", {**seeds, "hyflash-d1-rule-delta": {s: [2.3] for s in SETS},
                                                       "hyflash-d1-rule-linear": {s: [1.5] for s in SETS}})
    table = (ahead / "memory_rules.md").read_text()
    assert "| *noise: hyflash-d1 seed spread* |" in table and "| 0.200 | |" in table
    assert "**delta** is ahead of gated_delta by +0.300 (noise 0.200): it should be the default rule." in table
    close = write_bench_and_summarize(tmp_path / "c", {**seeds, "hyflash-d1-rule-delta": {s: [2.1] for s in SETS}})
    assert "no rule is ahead of gated_delta beyond noise (the best, delta, +0.100; noise 0.200)" in (
        close / "memory_rules.md").read_text()
    # One seed of hyflash-d1: no noise to judge by, so no verdict.
    alone = write_bench_and_summarize(tmp_path / "o", {"hyflash-d1-s0": {s: [2.0] for s in SETS},
                                                       "hyflash-d1-rule-delta": {s: [2.9] for s in SETS}})
    assert "**Verdict:** none: hyflash-d1 needs 2 seeds" in (alone / "memory_rules.md").read_text()
