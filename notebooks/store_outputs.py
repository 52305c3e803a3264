"""Executes MyXTTSTrain.ipynb on the CPU demo (no XTTS_DIR) and stores its outputs in the
file, so that a reader sees what each cell prints before running it.

    python notebooks/store_outputs.py      # from the repository root, pyxtts installed

It runs in a scratch folder (the run folders go there, not into notebooks/runs/), with
matplotlib's inline backend; a progress bar's carriage-return updates are reduced to what
a terminal would show last, so the file stays small. tests/test_notebook.py checks the
stored outputs (a run of every cell, in order, with the plot)."""
from __future__ import annotations

import re
import sys
import tempfile
import time
from pathlib import Path

import nbclient
import nbformat

NOTEBOOK = Path(__file__).resolve().parent / "MyXTTSTrain.ipynb"


BAR = re.compile(r"^train: +\d+%\|")  # a state of the Trainer's progress bar


def settle(text: str) -> str:
    """The text as a terminal leaves it: each line the part after its last carriage return,
    no blank lines, and of the progress bar's states only the last."""
    lines = [line.rsplit("\r", 1)[-1].rstrip() for line in text.split("\n")]
    lines = [line for line in lines if line]
    bars = [i for i, line in enumerate(lines) if BAR.match(line)]
    return "\n".join(line for i, line in enumerate(lines) if i not in bars[:-1]) + "\n"


def merge_streams(outputs: list) -> list:
    """Consecutive outputs of one stream (stdout, stderr) as one, settled."""
    merged: list = []
    for out in outputs:
        if out.output_type == "stream" and merged and merged[-1].output_type == "stream" \
                and merged[-1].name == out.name:
            merged[-1].text += out.text
        else:
            merged.append(out)
    for out in merged:
        if out.output_type == "stream":
            out.text = settle(out.text)
    return merged


def main() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    with tempfile.TemporaryDirectory(prefix="pyxtts-notebook-") as scratch:
        t0 = time.perf_counter()
        nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": scratch}}).execute()
        wall = time.perf_counter() - t0
    for cell in nb.cells:
        cell.metadata.pop("execution", None)  # timestamps: noise in every diff
        if cell.cell_type == "code":
            cell.outputs = merge_streams(cell.outputs)
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, NOTEBOOK)
    print(f"{NOTEBOOK.name}: executed in {wall:.0f} s, outputs stored ({NOTEBOOK.stat().st_size:,} bytes)",
          file=sys.stderr)


if __name__ == "__main__":
    main()
