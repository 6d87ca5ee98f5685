#!/usr/bin/env bash
# Issue 17: copy what scripts/kinds_grid.sh wrote into OUTDIR to docs/results/kinds/, without weights:
#   summary.json (summary_t1.json), claims.md, memory_rules.{json,md}, tau_vs_context_by_kind.png,
#   anchor_context.json and grid-settings.txt here; the bench (results.json, table.md, plots, wall_seconds,
#   bench.log) in grid/bench/;
#   every finished run's training log, configs, curves and wall time in grid/runs/NAME/.
# usage: docs/results/kinds/collect.sh OUTDIR        (e.g. runs/kinds-cpu)
set -euo pipefail
die() { echo "collect: error: $*" >&2; exit 2; }
[ $# -eq 1 ] || die "usage: docs/results/kinds/collect.sh OUTDIR"
src=${1%/} dst=${DEST:-$(dirname "$0")}  # DEST: another folder (tests)
[ -f "$src/summary.json" ] || die "$src/summary.json does not exist: run the grid's bench first (STAGE=bench)"
mkdir -p "$dst"
cp "$src"/{summary.json,claims.md,memory_rules.json,memory_rules.md,tau_vs_context_by_kind.png} "$dst/"
cp "$src"/{anchor_context.json,grid-settings.txt} "$dst/"
[ ! -f "$src/summary_t1.json" ] || cp "$src/summary_t1.json" "$dst/"  # when the bench sampled at T = 1
rm -rf "$dst/grid" && mkdir -p "$dst/grid/bench"  # a fresh copy: no run left over from an earlier collect
cp "$src"/bench/{results.json,table.md,wall_seconds} "$src"/bench/*.png "$src/logs/bench.log" "$dst/grid/bench/"
for run in "$src"/runs/*/; do
  name=$(basename "$run")
  [ -f "$run/drafter/config.json" ] || continue  # unfinished: its checkpoint resumes from OUTDIR, not from here
  mkdir -p "$dst/grid/runs/$name"
  cp "$run"/{log.jsonl,train_config.json,wall_seconds} "$dst/grid/runs/$name/"
  cp "$run/drafter/config.json" "$dst/grid/runs/$name/drafter_config.json"
  [ ! -f "$run/curves.png" ] || cp "$run/curves.png" "$dst/grid/runs/$name/"
done
echo "collected $(ls "$dst/grid/runs" | wc -l) runs and the bench of $src into $dst"
