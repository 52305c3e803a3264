"""notebooks/MyXTTSTrain.ipynb runs end to end on a fresh kernel (nbclient + ipykernel)
on CPU within 5 minutes, under a memory budget like a tier's, and its cells show what they
promise; the outputs stored in the file are those of such a run."""
from __future__ import annotations

import ast
import os
import re
import time
import wave
from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient", reason="nbclient (the test extra) is not installed")
nbformat = pytest.importorskip("nbformat", reason="nbformat (the test extra) is not installed")

import pyxtts  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = REPO / "notebooks" / "MyXTTSTrain.ipynb"


def kernel_env(monkeypatch) -> None:
    """The kernel imports this very pyxtts (installed, or the in-place build), never the
    source folder, and draws with the kernel's inline matplotlib backend (figures as PNG)."""
    root = str(Path(pyxtts.__file__).resolve().parent.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    monkeypatch.delenv("MPLBACKEND", raising=False)


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
    kernel_env(monkeypatch)
    # A budget like a tier's: the plan of the micro-batch the notebook trains, plus 25%. One
    # trainer fits it (a step's peak is its plan); two do not (the reloading cell used to
    # build the second while the first was alive: out of memory at the 8 and 12 GB tiers).
    config_at = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "XTTS_DIR = None" in c.source)
    nb.cells.insert(config_at + 1, nbformat.v4.new_code_cell(
        "probe = XTTSConfig.load('cpu_demo')\n"
        "probe.data.batch_size //= 2  # as the training cell halves it\n"
        "pyxtts.set_memory_limit(int(probe.memory_plan().total * 1.25), 'cpu')"))
    # out-of-memory errors from the training cell on (the batch search before it makes some)
    fit_at = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "trainer.fit(" in c.source)
    nb.cells.insert(fit_at, nbformat.v4.new_code_cell("ooms = pyxtts.memory_stats('cpu')['num_ooms']"))
    # facts the figures must agree with, read from the kernel after the last cell
    nb.cells.append(nbformat.v4.new_code_cell(
        "print('CHECK', ax[1].get_ylim()[0], ax[1].lines[-1].get_ydata()[0] == trained_plan.total / 2**20, "
        "trained_plan.batch_size == d.batch_size, pyxtts.memory_stats('cpu')['num_ooms'] - ooms)"))
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    t0 = time.perf_counter()
    client.execute()
    wall = time.perf_counter() - t0
    text = outputs(nb)
    assert "devices:" in text  # gpu-info
    assert "memory plan" in text and "total" in text  # the plan
    assert "largest micro-batch at" in text  # find_optimal_batch_size
    largest = int(text.split("largest micro-batch at ")[1].split(": ")[1].split()[0])
    # the search's cap is said as such, not passed off as the largest that fits
    assert ("(the search's cap, max_batch_size=256" in text) == (largest == 256)
    # the plan printed before training is the micro-batch trained, and the one drawn
    assert "training micro-batch 2 x 2 accumulation; its plan:" in text
    # memory axis from zero; the line drawn is that plan; training and reloading under the
    # budget without an out-of-memory error
    assert "CHECK 0.0 True True 0" in text
    assert "StepResult(" in text and "FitResult(step=300" in text  # accumulation, training
    assert "GPUMonitor:" in text
    assert "no audio samples in runs/notebook/run_001/samples" in text
    assert "reloaded runs/notebook/run_001/final.safetensors" in text
    pngs = sum(1 for c in nb.cells for o in c.get("outputs", []) if "data" in o and "image/png" in o.data)
    assert pngs == 1, "the loss and memory plots"
    assert (tmp_path / "runs" / "notebook" / "run_001" / "train_log.jsonl").exists()
    if not os.environ.get("PYXTTS_SANITIZED"):
        assert wall < 300, f"the notebook took {wall:.0f} s"


def test_notebook_refuses_xtts_data_without_the_xtts_folder(tmp_path, monkeypatch):
    """DATA alone used to train the demo model, whose 256-id vocabulary rejects XTTS ids
    after minutes of setup; the configuration cell now says what is missing."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"][:2]  # imports, configuration
    cells[1].source = cells[1].source.replace("DATA = None ", "DATA = 'shards' ", 1)
    assert "DATA = 'shards'" in cells[1].source
    nb.cells = cells
    kernel_env(monkeypatch)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="set XTTS_DIR to the XTTS v2 folder"):
        client.execute()


@pytest.mark.parametrize("settings, said", [
    ([("REFERENCE = None ", "REFERENCE = 'me.wav' ")], "REFERENCE: the export speaks SENTENCE, and only an XTTS run"),
    ([("XTTS_DIR = None ", "XTTS_DIR = 'XTTS-v2' "), ("REFERENCE = None ", "REFERENCE = 'nope.wav' ")],
     "REFERENCE: expected a recording of the voice to clone, got 'nope.wav'"),
])
def test_notebook_refuses_a_reference_it_cannot_speak_before_training(tmp_path, monkeypatch, settings, said):
    """A REFERENCE that could not be spoken (no XTTS run to export, no such file) was found
    in the last cell, after the whole training; the configuration cell now says so."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"][:2]  # imports, configuration
    for old, new in settings:
        assert old in cells[1].source
        cells[1].source = cells[1].source.replace(old, new, 1)
    nb.cells = cells
    kernel_env(monkeypatch)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    with pytest.raises(nbclient.exceptions.CellExecutionError, match=re.escape(said)):
        client.execute()
    assert list(tmp_path.iterdir()) == []  # no run folder, no shards


@pytest.mark.slow
def test_notebook_runs_the_xtts_workflow_from_recordings(tmp_path, monkeypatch):
    """The real workflow: with XTTS_DIR (a small released-style folder) and METADATA (espeak
    recordings in the LJSpeech layout) the notebook prepares the data, plans, finds the
    batch, fine-tunes from the folder's weights (the conditioning path trained from each
    step's reference slice), exports the folder Coqui loads, and, given REFERENCE, has it
    speak."""
    fx = pytest.importorskip("fixtures_prepare")
    if fx.ESPEAK is None:
        pytest.skip("espeak-ng is not installed")
    from coqui import require_coqui
    from fixtures_speech import write_xtts_folder

    require_coqui()
    meta = fx.make_ljspeech(tmp_path / "corpus", fx.SENTENCES_EN[:12])
    xtts = write_xtts_folder(tmp_path / "XTTS-v2", sorted((tmp_path / "corpus" / "wavs").glob("*.wav"))[:4])
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    config_cell = cells[1]
    voice = sorted((tmp_path / "corpus" / "wavs").glob("*.wav"))[0]
    for old, new in (("XTTS_DIR = None ", f"XTTS_DIR = {str(xtts)!r} "), ("METADATA = None ", f"METADATA = {str(meta)!r} "),
                     ("MAX_STEPS = 300 ", "MAX_STEPS = 3 "), ("REFERENCE = None ", f"REFERENCE = {str(voice)!r} ")):
        assert old in config_cell.source, old
        config_cell.source = config_cell.source.replace(old, new, 1)
    # the batch search at its cap of 256 takes minutes on a CPU at these sequence lengths
    cells[3].source = cells[3].source.replace("CAP = 256 ", "CAP = 8 ", 1)
    kernel_env(monkeypatch)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    text = outputs(nb)
    assert "prepared 12 of 12 samples" in text  # prepare's summary
    assert "tier gpu_12gb: 2 layers x d 64" in text  # the folder's GPT, the CPU's tier
    assert "FitResult(step=3" in text
    assert "exported" in text
    exported = tmp_path / "runs" / "notebook" / "run_001" / "xtts_finetuned"
    assert (exported / "model.pth").is_file() and (exported / "vocab.json").is_file()
    # the export spoke SENTENCE in the reference's voice, played in the cell
    spoken = tmp_path / "runs" / "notebook" / "run_001" / "spoken.wav"
    assert "spoken: runs/notebook/run_001/spoken.wav" in text and spoken.stat().st_size > 44
    last = [c for c in nb.cells if c.cell_type == "code"][-1]
    assert any("data" in o and "<audio" in o.data.get("text/html", "") for o in last.outputs)
    # the run trained the conditioning path from the recordings' slices
    log = (tmp_path / "runs" / "notebook" / "run_001" / "train_log.jsonl").read_text().splitlines()
    assert sum('"type": "train"' in line for line in log) == 3


def test_the_stored_outputs_are_a_run_of_every_cell_in_order():
    """A reader sees what to expect before running it: the file holds the outputs of one run
    of the CPU demo (notebooks/store_outputs.py), every code cell executed once, top to
    bottom, with the plot; small enough to read on GitHub (no widget state, one PNG)."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))
    assert all(c.outputs for c in code), [c.source.splitlines()[0] for c in code if not c.outputs]
    assert not any(o.output_type == "error" for c in code for o in c.outputs)
    text = outputs(nb)
    assert "FitResult(step=300" in text and "reloaded runs/notebook/run_001/final.safetensors" in text
    assert "no audio samples in runs/notebook/run_001/samples: this run made none" in text
    assert len(re.findall(r"^train: +\d+%\|", text, flags=re.M)) == 1  # the bar's last state only
    pngs = [o.data["image/png"] for c in code for o in c.outputs if "data" in o and "image/png" in o.data]
    assert len(pngs) == 1 and len(pngs[0]) < 80_000
    assert "widgets" not in nb.metadata and NOTEBOOK.stat().st_size < 150_000


def test_the_samples_cell_plays_the_latest_step(tmp_path, monkeypatch):
    """<run>/samples/step_<N>/*.wav of the largest N that has any, with IPython's Audio; a
    run without samples gets one line saying so (the end-to-end test sees that line)."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and "(RUN_DIR / \"samples\")" in c.source]
    run = tmp_path / "run_007"
    for step, names in ((100, ["a.wav"]), (1000, ["a.wav", "b.wav"]), (2000, [])):  # 2000: none yet
        (run / "samples" / f"step_{step:08d}").mkdir(parents=True)
        for name in names:
            with wave.open(str(run / "samples" / f"step_{step:08d}" / name), "wb") as w:
                w.setnchannels(1), w.setsampwidth(2), w.setframerate(24000)
                w.writeframes(bytes(480))
    nb.cells = [nbformat.v4.new_code_cell(f"from pathlib import Path\nRUN_DIR = Path({str(run)!r})"), cell]
    kernel_env(monkeypatch)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    out = nb.cells[1].outputs
    assert f"samples of step 1000 ({run}/samples/step_00001000):" in outputs(nb)
    players = [o for o in out if "data" in o and "text/html" in o.data and "<audio" in o.data["text/html"]]
    assert len(players) == 2


def test_the_notebook_extra_installs_what_the_notebook_imports():
    """It needed Jupyter and matplotlib, which nothing installed or named: the `notebook` extra
    has a Jupyter front end, the kernel and every package the notebook imports beyond
    pyxtts's own requirements (IPython comes with the kernel)."""
    from helpers.project import pyproject

    extras = pyproject()["project"]["optional-dependencies"]
    names = {re.split(r"[<>=!~\[ ]", r, maxsplit=1)[0].lower() for r in extras["notebook"]}
    assert {"notebook", "ipykernel", "matplotlib"} <= names, names
    nb = nbformat.read(NOTEBOOK, as_version=4)
    imported = set()
    for c in nb.cells:
        if c.cell_type == "code":
            for node in ast.walk(ast.parse(c.source)):
                if isinstance(node, ast.Import):
                    imported |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom):
                    imported.add(node.module.split(".")[0])
    stdlib = {"json", "pathlib"}
    provided = {"pyxtts", "matplotlib", "IPython"}  # pyxtts; the extra (IPython with ipykernel)
    assert imported - stdlib <= provided, imported - stdlib - provided
    # the notebook's first cell says how to install it
    assert "pip install '.[notebook]'" in nb.cells[0].source
