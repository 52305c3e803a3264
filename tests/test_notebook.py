"""notebooks/MyXTTSTrain.ipynb runs end to end on a fresh kernel (nbclient + ipykernel)
on CPU within 5 minutes, and its cells show what they promise."""
from __future__ import annotations

import os
import time
from pathlib import Path

import nbclient
import nbformat
import pytest

import pyxtts

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "MyXTTSTrain.ipynb"


def outputs(nb) -> str:
    text = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            if o.output_type == "stream":
                text.append(o.text)
            elif "data" in o and "text/plain" in o.data:
                text.append(o.data["text/plain"])
    return "\n".join(text)


@pytest.mark.slow
def test_notebook_runs_end_to_end(tmp_path, monkeypatch):
    assert NOTEBOOK.exists(), NOTEBOOK
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # the kernel imports this very pyxtts (installed, or the in-place build), never the
    # source folder, and draws with the kernel's inline matplotlib backend (figures as PNG)
    root = str(Path(pyxtts.__file__).resolve().parent.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    monkeypatch.delenv("MPLBACKEND", raising=False)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    t0 = time.perf_counter()
    client.execute()
    wall = time.perf_counter() - t0
    text = outputs(nb)
    assert "devices:" in text  # gpu-info
    assert "memory plan" in text and "total" in text  # the plan
    assert "largest micro-batch at" in text  # find_optimal_batch_size
    assert "StepResult(" in text and "FitResult(step=300" in text  # accumulation, training
    assert "GPUMonitor:" in text
    assert "reloaded runs/notebook/final.safetensors" in text
    pngs = sum(1 for c in nb.cells for o in c.get("outputs", []) if "data" in o and "image/png" in o.data)
    assert pngs >= 2, "the loss and memory plots"
    assert (tmp_path / "runs" / "notebook" / "train_log.jsonl").exists()
    if not os.environ.get("PYXTTS_SANITIZED"):
        assert wall < 300, f"the notebook took {wall:.0f} s"
