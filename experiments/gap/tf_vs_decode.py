"""Where does held-out acceptance go? Teacher-forced block accuracy vs the decoding loop, same drafter.

    ../shared/bin/heavy .venv/bin/python experiments/gap/tf_vs_decode.py [N_HELDOUT] [N_TRAIN]

For the shipped drafter (float32 weights, no int8) this measures, with the float32 target:
- held-out: N chat prompts from held-out modules (the training run's own eval prompts); the target writes 96
  greedy tokens; then one teacher-forced pass gives features for the whole sequence and `train_forward` drafts a
  block at every generated position (its slots compared with the target's own greedy tokens). Replaying the
  loop over those blocks (draft, keep the accepted prefix and the bonus token, jump) gives the tau the loop
  should have; beside it, the decoding loop's real tau on the same prompts. If the two differ, inference and
  training disagree (a bug); if they agree, the gap is the drafter. 1 + the mean accepted prefix over every
  position is reported too: it overstates tau (positions inside a long accepted run are skipped by the loop).
- train: the same measure on N greedy target-written sequences of the training data (their last 1,024 tokens).
Writes gap.json next to this file and prints it.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from hyflash.decoding import generate
from hyflash.drafters.model import DrafterModel
from hyflash.drafters.state import DrafterState
from hyflash.targets import HFTarget
from hyflash.training.data import TokenDataset
from hyflash.drafters.registry import resolve_spec
from hyflash.training.features import teacher_features
from hyflash.corpora import build_prompts

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@torch.no_grad()
def block_stats(model, target, seq: list[int], gen_start: int) -> tuple[np.ndarray, list[int]]:
    """Per anchor in [gen_start, len-1): accepted-prefix length of the teacher-forced block, and slot hits."""
    tokens = torch.tensor([seq])
    feats, _ = teacher_features(target, tokens, torch.tensor([len(seq)]))
    S = model.config.block_size
    anchors = torch.arange(max(1, gen_start), len(seq) - 1)[None]
    hidden = model.train_forward(feats.float(), tokens, anchors)  # [1, A, S-1, H]
    pred = model.to_target_ids(model.logits(hidden).argmax(-1))[0]  # [A, S-1]
    prefix, hits = [], np.zeros(S - 1)
    for i, a in enumerate(anchors[0].tolist()):
        n = 0
        for k in range(S - 1):
            if a + 1 + k >= len(seq) or int(pred[i, k]) != seq[a + 1 + k]:
                break
            n += 1
        prefix.append(n)
        for k in range(S - 1):
            if a + 1 + k < len(seq):
                hits[k] += int(pred[i, k]) == seq[a + 1 + k]
    return np.array(prefix), (hits / max(1, len(prefix))).tolist()


def simulated_loop_tau(prefix: np.ndarray) -> float:
    """tau of a decoding loop that drafts at the first anchor and after every pass jumps past what it committed
    (accepted prefix + the bonus token): the loop visits only some anchors, so this differs from 1 + mean."""
    i, passes, committed = 0, 0, 0
    while i < len(prefix):
        passes += 1
        committed += prefix[i] + 1
        i += prefix[i] + 1
    return committed / max(1, passes)


def main() -> None:
    n_heldout = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    n_train = int(sys.argv[2]) if len(sys.argv) > 2 else 24
    torch.set_num_threads(2)
    target = HFTarget.load("smollm2-135m", dtype="float32")
    path = resolve_spec("default", "smollm2-135m")
    model = DrafterModel.from_pretrained(path, target, dtype=torch.float32).eval()
    out = {"drafter": str(path), "started": time.strftime("%Y-%m-%d %H:%M:%S")}

    prompts = [p for p in build_prompts("heldout", seed=1, long_chars=0) if p.kind == "complete"][:n_heldout]
    tf_prefix, tf_hits, loop_tau, loop_acc, sim = [], [], [], [], []
    for p in prompts:
        ids = target.encode_prompt(p.text, chat=True)
        plain = generate(target, ids, None, max_new_tokens=96)
        spec = generate(target, ids, DrafterState(model), max_new_tokens=96)
        assert spec.tokens == plain.tokens
        prefix, hits = block_stats(model, target, ids + plain.tokens, len(ids))
        tf_prefix.append(prefix)
        tf_hits.append(hits)
        loop_tau.append(spec.tau)
        loop_acc.append(spec.acceptance_by_position)
        sim.append(simulated_loop_tau(prefix))
        print(f"heldout prompt: teacher-forced 1 + mean prefix {1 + prefix.mean():.2f}, simulated loop {sim[-1]:.2f}, "
              f"real loop tau {spec.tau:.2f}", flush=True)
    allp = np.concatenate(tf_prefix)
    out["heldout"] = {"prompts": len(prompts), "tf_mean_prefix_plus_1": float(1 + allp.mean()),
                      "tf_slot_accuracy": np.mean(tf_hits, 0).round(4).tolist(),
                      "tf_simulated_loop_tau_mean": float(np.mean(sim)), "loop_tau_mean": float(np.mean(loop_tau)),
                      "loop_acceptance_by_position": np.mean(loop_acc, 0).round(4).tolist()}

    data = TokenDataset([ROOT / "data/smollm2-135m/train-v2"])
    rng = np.random.default_rng(0)
    picks = [i for i in rng.permutation(len(data)) if not data.sampled[i]][:n_train]
    tr_prefix, tr_hits, tr_sim = [], [], []
    for i in picks:
        full, g = data[i]
        seq = full.tolist()[-1024:]
        prefix, hits = block_stats(model, target, seq, max(1, g - (len(full) - len(seq))))
        tr_prefix.append(prefix)
        tr_hits.append(hits)
        tr_sim.append(simulated_loop_tau(prefix))
    allp = np.concatenate(tr_prefix)
    out["train"] = {"sequences": len(picks), "tf_mean_prefix_plus_1": float(1 + allp.mean()),
                    "tf_simulated_loop_tau_mean": float(np.mean(tr_sim)),
                    "tf_slot_accuracy": np.mean(tr_hits, 0).round(4).tolist()}
    (HERE / "gap.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
