"""Per prompt of a `hyflash bench --repeats N` folder: `default`'s decode speed over hyflash plain's and over
llama-cpp-python's own plain loop, each the median of the repeats' paired ratios (issue 37's bar reads the latter).

    python experiments/qwen/paired_ratios.py experiments/qwen/default-vs-plain/results.json
"""
import json, statistics, sys
from collections import defaultdict
d = json.load(open(sys.argv[1]))
runs = {(r["temperature"], r["set"], r["item_id"], r["method"]): r for r in d["runs"]}
rows = []
for (t, s, i, m), r in runs.items():
    if m != "default":
        continue
    out = [t, s, i, r["tau"]]
    for base in ("plain", "llamacpp-plain"):
        b = runs.get((t, s, i, base))
        pairs = [bt / rt * r["new_tokens"] / b["new_tokens"] for bt, rt in zip(b["decode_times"], r["decode_times"])]
        out.append(statistics.median(pairs)); out.append((min(pairs), max(pairs)))
    out.append(r.get("identical_to_plain"))
    rows.append(out)
rows.sort(key=lambda x: (x[0], x[1], x[2]))
print("| T | set | prompt | τ | × hyflash plain | repeats | × llama.cpp plain | repeats | text = plain |")
print("|---:|---|---|---:|---:|---|---:|---|---|")
for t, s, i, tau, r1, (a1, b1), r2, (a2, b2), same in rows:
    print(f"| {t:g} | {s} | {i[:28]} | {tau:.2f} | {r1:.2f} | {a1:.2f}–{b1:.2f} | {r2:.2f} | {a2:.2f}–{b2:.2f} | {same} |")
for t in sorted({r[0] for r in rows}):
    x = [r[4] for r in rows if r[0] == t]; y = [r[6] for r in rows if r[0] == t]
    print(f"T={t}: n={len(x)} vs plain min {min(x):.2f} median {statistics.median(x):.2f}; vs llama.cpp min {min(y):.2f} median {statistics.median(y):.2f}")
