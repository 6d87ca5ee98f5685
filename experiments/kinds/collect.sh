#!/usr/bin/env bash
# Issue 17: copy what experiments/kinds/grid.sh wrote into OUTDIR to experiments/kinds/, without weights or raw
# logs (they stay in OUTDIR), then summarise every bench collected here as one grid:
#   grid/NAME/       the bench (results.json, which summarize.py reads, table.md, plots, wall_seconds) and its
#                    grid-settings.txt;
#   grid/runs/RUN/   each finished run's configs, curves and wall time;
#   here             anchor_context.json, and summarize.py's outputs over all grid/bench*/ folders: summary.json
#                    (summary_t1.json), claims.md, memory_rules.{json,md}, tau_vs_context_by_kind.png.
# NAME (default: bench) keeps apart the benches of one grid made in several sessions or on several machines (e.g.
# bench-d2): collecting under a NAME replaces that bench and the runs OUTDIR holds, nothing else.
# usage: experiments/kinds/collect.sh OUTDIR [NAME]        (e.g. runs/kinds-cpu bench-d2)
set -euo pipefail
die() { echo "collect: error: $*" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || die "usage: experiments/kinds/collect.sh OUTDIR [NAME]"
here=$(cd "$(dirname "$0")" && pwd)
src=${1%/} name=${2:-bench} dst=${DEST:-$here}  # DEST: another folder (tests)
[[ "$name" =~ ^bench[A-Za-z0-9_-]*$ ]] || die "NAME must start with 'bench' (e.g. bench-d2), got '$name'"
[ -f "$src/bench/results.json" ] || die "$src/bench/results.json does not exist: run the grid's bench first (STAGE=bench)"
py=${PYTHON:-$here/../../.venv/bin/python}
[ -x "$py" ] || py=python3
mkdir -p "$dst/grid/runs"
stage=$(mktemp -d "$dst/grid/.collect.XXXXXX")  # checked here first: a bench that cannot join leaves nothing behind
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/$name" "$stage/runs"
cp "$src"/bench/{results.json,table.md,wall_seconds} "$src"/bench/*.png "$src/grid-settings.txt" "$stage/$name/"
for run in "$src"/runs/*/; do
  run_name=$(basename "$run")
  [ -f "$run/drafter/config.json" ] || continue  # unfinished: its checkpoint resumes from OUTDIR, not from here
  mkdir -p "$stage/runs/$run_name"
  cp "$run"/{train_config.json,wall_seconds} "$stage/runs/$run_name/"
  cp "$run/drafter/config.json" "$stage/runs/$run_name/drafter_config.json"
  [ ! -f "$run/curves.png" ] || cp "$run/curves.png" "$stage/runs/$run_name/"
done
benches=("$stage/$name")
for b in "$dst"/grid/bench*/; do [ "$(basename "$b")" = "$name" ] || [ ! -d "$b" ] || benches+=("$b"); done
"$py" "$here/summarize.py" "${benches[@]}" --out "$stage/check" > /dev/null || die "$src's bench does not join the others"
rm -rf "${dst:?}/grid/$name" && mv "$stage/$name" "$dst/grid/$name"
for run in "$stage"/runs/*/; do
  [ -d "$run" ] || continue
  rm -rf "${dst:?}/grid/runs/$(basename "$run")" && mv "$run" "$dst/grid/runs/"
done
cp "$src/anchor_context.json" "$dst/"
"$py" "$here/summarize.py" "$dst"/grid/bench*/ --out "$dst" > /dev/null
echo "collected the bench of $src into $dst/grid/$name; the summary covers $(ls -d "$dst"/grid/bench*/ | wc -l) bench(es)" \
  "and $(ls "$dst/grid/runs" | wc -l) runs"
