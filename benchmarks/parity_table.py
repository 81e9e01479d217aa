"""Print (and write as Markdown) how far each strategy's run is from DDP's, from parity_run.py's output.

python benchmarks/parity_table.py RUN_DIR [--markdown OUT.md]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def rows(directory: Path, reference: str = "ddp") -> list[tuple[str, int, float, float, str]]:
    base = torch.load(directory / f"{reference}.pt")
    table = []
    for path in sorted(directory.glob("*.pt")):
        if path.stem == reference:
            continue
        run = torch.load(path)
        loss = max(abs(a - b) for a, b in zip(run["losses"], base["losses"], strict=True))
        weight = max((run["state_dict"][k] - base["state_dict"][k]).abs().max().item() for k in base["state_dict"])
        footprint = " / ".join(f"{local}:{state}" for local, _, state in run["footprints"])
        table.append((path.stem, len(run["losses"]), loss, weight, footprint))
    return table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    lines = [
        "| strategy | steps | max loss diff vs DDP | max weight diff vs DDP | per rank: params:optimizer-state |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {n} | {s} | {lo:.2e} | {w:.2e} | {fp} |" for n, s, lo, w, fp in rows(args.directory)]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
