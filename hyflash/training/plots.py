"""Training curves from log.jsonl: loss and held-out tau against steps (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

from hyflash.files import read_jsonl


def plot_curves(log_path: Path, out_path: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_jsonl(log_path)
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval" in r]
    fig, (ax_loss, ax_tau) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss (weighted)")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss")
    ax_acc = ax_loss.twinx()
    ax_acc.plot([r["step"] for r in train], [r["acc_by_slot"][0] for r in train], color="tab:orange", alpha=0.7,
                label="slot-1 accuracy")
    ax_acc.set_ylabel("slot-1 accuracy")
    ax_loss.set_title("training")
    ax_tau.plot([r["step"] for r in train], [r["expected_tau"] for r in train], alpha=0.5,
                label="tau implied by training blocks")
    ax_tau.plot([r["step"] for r in evals], [r["eval"]["tau"] for r in evals], "o-",
                label="held-out tau (speculative decoding)")
    ax_tau.set_xlabel("step")
    ax_tau.set_ylabel("tau (tokens per target pass)")
    ax_tau.legend(loc="lower right")
    ax_tau.set_title("acceptance")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path
