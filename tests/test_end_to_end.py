"""From recordings to a voice Coqui speaks with, through the command line: espeak-ng speech
for two dozen sentences in the LJSpeech layout and a small randomly initialised XTTS v2
folder in Coqui's format (model.pth written by Coqui's own classes, a BPE vocabulary
trained on the test's text, a DVAE, mel statistics) -> ``pyxtts prepare`` -> ``pyxtts
train --init`` (the conditioning path trained from each step's reference slice; the loss
falls) -> ``pyxtts export`` -> Coqui's ``Xtts.load_checkpoint(..., strict=True)`` loads the
result, its GPT weights are the fine-tuned ones, and it generates audio codes from text."""
from __future__ import annotations

import json
import re
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import pyxtts
import pyxtts.cli
from pyxtts.checkpoint import load_checkpoint
from pyxtts.prepare import load_audio

fx = pytest.importorskip("fixtures_prepare")
from fixtures_speech import coqui_model, finetune_yaml, write_xtts_folder  # noqa: E402

pytestmark = [pytest.mark.usefixtures("no_limit_no_fault"),
              pytest.mark.skipif(fx.ESPEAK is None, reason="espeak-ng is not installed")]

TRAIN_YAML = finetune_yaml(30, 10)
REPO = Path(__file__).resolve().parent.parent


def run_cli(*argv: str) -> None:
    rc = pyxtts.cli.main(list(argv))
    assert rc == 0, f"pyxtts {' '.join(argv)} exited with {rc}"


def test_recordings_to_a_voice_coqui_speaks_with(tmp_path, capsys):
    from coqui import require_coqui

    require_coqui()
    t0 = time.perf_counter()
    meta = fx.make_ljspeech(tmp_path / "corpus", fx.SENTENCES_EN[:24])
    wavs = sorted((tmp_path / "corpus" / "wavs").glob("*.wav"))
    xtts = write_xtts_folder(tmp_path / "XTTS-v2", wavs[:4])

    # 1. prepare
    shards = tmp_path / "shards"
    run_cli("prepare", "--xtts-dir", str(xtts), "--metadata", str(meta), "--language", "en", "--out",
            str(shards), "--eval-fraction", "0.2", "--no-progress")
    summary = json.loads((shards / "summary.json").read_text())
    assert summary["kept"] == 24, summary

    # 2. train from the released weights
    cfg = tmp_path / "finetune.yaml"
    cfg.write_text(TRAIN_YAML, encoding="utf-8")
    run = tmp_path / "run"
    run_cli("train", "--config", str(cfg), "--init", str(xtts), "--data", str(shards / "train"), "--eval-data",
            str(shards / "eval"), "--checkpoint-dir", str(run), "--no-progress")
    log = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    evals = [r["loss"] for r in log if r["type"] == "eval"]
    # codes of a random DVAE: little to learn beyond their statistics, but every evaluation lower
    assert len(evals) == 4 and all(b < a for a, b in zip(evals, evals[1:])) and evals[-1] < evals[0] - 0.05, evals
    steps = [r for r in log if r["type"] == "train"]
    assert len(steps) == 30
    final = run / "step_00000030.safetensors"
    # the run started from the folder's weights: its model config is the checkpoint's own
    model = pyxtts.XTTSGPT(pyxtts.ModelConfig.from_xtts_config(xtts / "config.json", vocab=xtts / "vocab.json"))
    start = {k: v.copy() for k, v in model.state_dict().items()}
    load_checkpoint(run / "init_xtts.safetensors", model)
    imported = {k: v.copy() for k, v in model.state_dict().items()}
    assert any(not np.array_equal(start[k], imported[k]) for k in start)
    load_checkpoint(final, model)
    tuned = model.state_dict()
    moved = [k for k in tuned if not np.array_equal(tuned[k], imported[k])]
    assert any(k.startswith("conditioning_") for k in moved) and len(moved) > 80, len(moved)

    # 3. export into the folder Coqui loads
    out = tmp_path / "voice"
    run_cli("export", "--checkpoint", str(final), "--base", str(xtts), "--out", str(out))

    # 4. the README's lines load it in Coqui as written, without a warning (they called
    # Xtts.init_from_config, which coqui-tts 0.28 deprecates)
    readme = (REPO / "README.md").read_text()
    snippet = next(b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "strict=True" in b)
    scope: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exec(snippet.replace('"XTTS-v2-finetuned', f'"{out}'), scope)
    loaded = scope["model"].state_dict()
    for k, v in tuned.items():
        np.testing.assert_array_equal(loaded["gpt." + k].detach().numpy(), v, err_msg=k)

    # 5. Coqui loads it (strict) and generates codes from text with the fine-tuned GPT
    c, coqui = coqui_model(out)
    theirs = {k[len("gpt."):]: v.detach().numpy() for k, v in coqui.state_dict().items() if k.startswith("gpt.")}
    for k, v in tuned.items():
        np.testing.assert_array_equal(theirs[k], v, err_msg=k)
    torch = c.torch
    wav = torch.from_numpy(load_audio(wavs[0])).unsqueeze(0)
    with torch.no_grad():
        latents = coqui.get_gpt_cond_latents(wav, 22050)
        text = torch.IntTensor(coqui.tokenizer.encode("the quick brown fox", lang="en")).unsqueeze(0)
        codes = coqui.gpt.generate(cond_latents=latents, text_inputs=text, do_sample=False, num_beams=1,
                                   num_return_sequences=1, max_new_tokens=40, output_attentions=False)
    assert codes.ndim == 2 and codes.shape[1] >= 1
    assert int(codes.max()) <= 65 and int(codes.min()) >= 0
    capsys.readouterr()
    print(f"end to end: {time.perf_counter() - t0:.1f} s")


def test_init_names_a_missing_or_bad_folder(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model.pth").write_bytes(b"not a checkpoint")
    for folder in ("missing", "empty", "bad"):
        rc = pyxtts.cli.main(["train", "--init", str(tmp_path / folder), "--synthetic", "8", "--checkpoint-dir",
                              str(tmp_path / "run"), "--no-progress"])
        err = capsys.readouterr().err
        assert rc == 2 and f"--init {tmp_path / folder}" in err, (folder, err)
        assert not (tmp_path / "run" / "init_xtts.safetensors").exists()
