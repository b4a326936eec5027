"""Detection curves of a calibration run: P(a cheat is caught within n audited sessions), per
cheat, from `calibration.json` (meshnet.verify.calibrate writes both; this also redraws the
plot from a saved file: `python -m meshnet.verify.curves calibration.json detection.png`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

AUDITED = list(range(1, 11))
SERVED = list(range(1, 201, 4))
RATE = 0.05


def plot(report: dict, path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    for name, cheat in sorted(report["cheats"].items()):
        p = cheat["per_session"]["p_session"]
        left.plot(AUDITED, [1 - (1 - p) ** n for n in AUDITED], marker=".", label=f"{name} (p = {p:.3f})")
        right.plot(SERVED, [1 - (1 - RATE * p) ** n for n in SERVED], label=name)
    left.set_xlabel("audited sessions through the cheating hop")
    right.set_xlabel(f"sessions through the cheating hop, {RATE:.0%} of them audited")
    for ax in (left, right):
        ax.set_ylabel("P(caught)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    left.legend(fontsize=7, loc="center right")
    fig.suptitle(f"Detection of each cheat (p: per audited session, {report['k']} values committed per position)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    plot(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
