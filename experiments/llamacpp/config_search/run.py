"""Issue 36 item 4: the llama.cpp configuration search (hyflash/config_search.py) on a real file, recorded.

Runs the search `hyflash calibrate --backend llama.cpp --search-config` runs, on its full grid, and writes
<out>/<model>.json (every trial) and <out>/<model>.md (the table, the choice, the command and the CPU).
Run it through /work/shared/bin/heavy, with HYFLASH_CACHE pointing at a cache of its own if the searched
choice must not reach other runs on the machine.

    PYTHONPATH=$PWD python experiments/llamacpp/config_search/run.py --model smollm2-135m
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from hyflash.config_search import choice_line, search_settings, search_table, settings_grid
from hyflash.machine import cpu_description, physical_cores, set_torch_threads
from hyflash.targets import gguf_path
from hyflash.targets.llamacpp import LlamaCppTarget

HERE = Path(__file__).parent


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--out", default=str(HERE))
    p.add_argument("--threads", type=int, nargs="*", default=None,
                   help="search these thread counts only (a large file's full grid takes long)")
    args = p.parse_args()
    set_torch_threads()
    start = time.time()
    precision = LlamaCppTarget(gguf_path(args.model), record_features=False, n_ctx=64).precision
    grid = [s for s in settings_grid(precision) if not args.threads or s.threads in args.threads]
    result = search_settings(args.model, grid, announce=lambda line: print(line, file=sys.stderr, flush=True))
    minutes = (time.time() - start) / 60
    cpu = cpu_description()[0]
    name = Path(args.model).name.removesuffix(".gguf")
    out = Path(args.out)
    (out / f"{name}.json").write_text(json.dumps(result.to_dict() | {"cpu": cpu, "cores": physical_cores(),
                                                                      "minutes": round(minutes, 2)}, indent=1) + "\n")
    threads = "" if not args.threads else " --threads " + " ".join(map(str, args.threads))
    command = ("HYFLASH_CACHE=<a private cache> PYTHONPATH=$PWD /work/shared/bin/heavy python "
               f"experiments/llamacpp/config_search/run.py --model {args.model}{threads}")
    (out / f"{name}.md").write_text(
        f"# llama.cpp configuration search: {args.model} ({result.precision})\n\n"
        f"CPU: {cpu}, {physical_cores()} physical cores (lscpu model name). Search took {minutes:.1f} min.\n\n"
        f"Command: `{command}` (the search of `hyflash calibrate --backend llama.cpp --model {args.model} "
        "--search-config`).\n\n"
        "Exact = an 8-token pass gives bit for bit the logits of 8 one-token passes after 300 and 1,000 tokens "
        "(max |dlogit| = 0). c(q) = one cached pass over q tokens after 300 tokens, no features, median.\n\n"
        + search_table(result) + "\n\n" + choice_line(result) + "\n")
    print(search_table(result))
    print(choice_line(result))


if __name__ == "__main__":
    main()
