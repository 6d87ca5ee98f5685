"""Benchmark suite: every decoding method side by side on held-out evaluation sets, one run, one machine.

datasets.py  registry of evaluation sets (deterministic, disjoint from the training prompts)
methods.py   the methods compared: our loop (plain, n-gram, trained drafters) and Hugging Face generate
run.py       the runner: same target, same prompts, interleaved methods; per-run records and aggregates
report.py    markdown table and plots from results.json
cli.py       `hyflash bench`
"""
