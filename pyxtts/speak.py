"""Test sentences spoken by Coqui's XTTS inference, in a child process.

A run with ``training.test_sentences`` hears its model at each evaluation: the trainer
exports the current weights into a Coqui XTTS folder and runs this module as a child
process (``python -m pyxtts.speak EXPORT_DIR SPEC.json OUT_DIR``), which loads Coqui's
``Xtts`` and writes ``OUT_DIR/<i>.wav`` (16-bit PCM at Coqui's output rate). torch,
Coqui and the whole model live in the child only, so the trainer's memory never grows.

``check_test_sentences`` refuses, before any step, what the child would fail on: a
missing reference clip, a language the XTTS folder does not speak, a sentence of more
text tokens than the model takes, a samples folder that cannot be written."""
from __future__ import annotations

import difflib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import wave
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from pyxtts._args import flag, integer, path_arg
from pyxtts._files import folder_in_use, lock_folder, missing_folders, remove_empty_folders
from pyxtts._interrupts import deferred_sigint

__all__ = ["SAMPLE_RATE_IN", "check_test_sentences", "clip_paths", "coqui_installed", "speak", "synthesize"]

SAMPLE_RATE_IN = 22050  # what Coqui's conditioning encoders read
MIN_REFERENCE_S = 0.33  # Coqui's get_gpt_cond_latents fails on a reference shorter than this
CHILD_TIMEOUT_S = 1800  # a child that hangs does not hold the run for ever


def coqui_installed() -> bool:
    """Whether coqui-tts is installed, asked of the package metadata: nothing is imported."""
    try:
        importlib.metadata.version("coqui-tts")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _check_folder(folder: Path, name: str) -> None:
    """FileNotFoundError naming ``name`` unless ``folder`` holds what Coqui's inference loads."""
    for file in ("config.json", "vocab.json", "model.pth"):
        if not (folder / file).is_file():
            raise FileNotFoundError(f"{name}: expected a Coqui XTTS folder holding {file}, "
                                    f"got {str(folder)!r} (it has no {file})")


def _config_names(i: int, field: str) -> str:
    return f"training.test_sentences[{i}].{field}"


def check_test_sentences(sentences: list[dict], xtts_dir: str | os.PathLike, max_text_tokens: int,
                         samples_dir: Path | None, vocab: str | os.PathLike | None = None, model: Any = None,
                         names: Callable[[int, str], str] = _config_names,
                         folder_name: str = "training.xtts_dir") -> None:
    """ValueError (or FileNotFoundError) naming the entry and field of
    ``training.test_sentences`` that cannot be spoken, before any step. ``vocab``: the
    extended vocabulary of a new language (``training.vocab``), whose language counts too.
    ``model``: the run's ModelConfig, which must be the folder's GPT (each evaluation
    exports the weights into a copy of the folder), when its config.json describes one.
    ``samples_dir``: where the clips go, checked writable (None: not checked). ``names``
    (sentence index, field) and ``folder_name`` name what is refused (``synthesize``
    names its own arguments)."""
    folder = Path(xtts_dir)
    _check_folder(folder, folder_name)
    try:
        doc = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        languages = doc["languages"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{folder_name}: {folder / 'config.json'} names no languages ({exc})") from exc
    if model is not None and isinstance(doc, dict) and isinstance(doc.get("model_args"), dict):
        _check_same_gpt(folder, model, vocab)
    tokenizer = _tokenizer(folder / "vocab.json" if vocab is None else Path(vocab))
    if tokenizer is not None:  # a new language's code, from the extended vocabulary
        languages = list(languages) + [c for c in tokenizer.added_languages if c not in languages]
    for i, s in enumerate(sentences):
        ref = Path(s["reference"])
        if not ref.is_file():
            raise FileNotFoundError(f"{names(i, 'reference')}: expected a recording of the voice to clone, got "
                                    f"{str(ref)!r}, which is not a file")
        _check_voice(ref, names(i, "reference"))
        lang = s["language"]
        if lang not in languages and lang.split("-")[0] not in languages:
            close = ([c for c in languages if c.lower() == lang.lower()]
                     or [c for c in languages if c.split("-")[0] == lang.lower()]  # zh: zh-cn
                     or difflib.get_close_matches(lang, languages, 1))
            raise ValueError(f"{names(i, 'language')}: expected one of the languages of {folder.name} "
                             f"({', '.join(languages)}), got {lang!r}"
                             + (f"; did you mean {close[0]!r}?" if close else ""))
        if tokenizer is not None:
            # Coqui lower-cases the sentence, then takes fewer tokens than the model's maximum
            n = len(tokenizer.encode(s["text"].strip().lower(), lang))
            if n >= max_text_tokens:
                raise ValueError(f"{names(i, 'text')}: expected fewer than {max_text_tokens} text tokens (the "
                                 f"model's max_text_tokens), got {n} for {s['text']!r}; shorten it")
    if samples_dir is None:
        return
    try:
        samples_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=samples_dir):
            pass
    except OSError as exc:
        raise ValueError(f"training.test_sentences: the samples folder {str(samples_dir)!r} cannot be written "
                         f"({exc.strerror or exc}); set training.checkpoint_dir to a writable folder") from None


def _check_same_gpt(folder: Path, model: Any, vocab: str | os.PathLike | None) -> None:
    """ValueError when the run's model is not the GPT of the XTTS folder (its text rows grown
    by ``vocab``): every evaluation would fail to export into it, an export each time."""
    from pyxtts.coqui_checkpoint import export_diffs
    from pyxtts.model import ModelConfig

    theirs = ModelConfig.from_xtts_config(folder / "config.json", vocab=vocab)
    diffs = [f"{f} {getattr(theirs, f)!r} there, {getattr(model, f)!r} here" for f in export_diffs(model, theirs)]
    if diffs:
        raise ValueError(f"training.xtts_dir: the run trains another GPT than {str(folder)!r}'s ("
                         + "; ".join(diffs[:3]) + (f"; and {len(diffs) - 3} more" if len(diffs) > 3 else "")
                         + "), so its weights cannot be exported there to speak the test sentences; start from that "
                         "folder (pyxtts train --init, which also sets xtts_dir) or set xtts_dir to the folder the run "
                         "fine-tunes")


def _tokenizer(vocab: Path) -> Any:
    """XTTS's tokenizer over ``vocab``, or None without the tokenizers package (then the
    child reports a sentence too long, as Coqui does)."""
    try:
        from pyxtts.prepare.text import XTTSTokenizer

        return XTTSTokenizer(vocab)
    except ImportError:
        return None


def speak(export_dir: Path, sentences: list[dict], out_dir: Path, seed: int) -> list[Path]:
    """``out_dir/<i>.wav`` for each sentence, spoken by the XTTS folder ``export_dir`` in a
    child process (its sampling seeded with ``seed``). RuntimeError with the child's
    last output when it fails."""
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = out_dir / "sentences.json"
    # the child runs in out_dir: a reference relative to this process's working directory
    # (a config loaded from a relative path gives those) is made absolute here
    sentences = [{**s, "reference": os.path.abspath(s["reference"])} for s in sentences]
    spec.write_text(json.dumps({"seed": seed, "sentences": sentences}, ensure_ascii=False), encoding="utf-8")
    try:
        # run in out_dir: "-m" puts the working directory first on the child's path, and a
        # checkout's pyxtts/ source folder there would hide the installed package
        r = subprocess.run([sys.executable, "-m", "pyxtts.speak", str(export_dir.resolve()), str(spec.resolve()),
                            str(out_dir.resolve())], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                           cwd=out_dir)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"speaking took more than {CHILD_TIMEOUT_S} s") from exc
    finally:
        spec.unlink(missing_ok=True)
    if r.returncode != 0:
        raise RuntimeError(f"speaking failed (exit {r.returncode}): {r.stderr[-2000:]}")
    return [out_dir / f"{i}.wav" for i in range(len(sentences))]


def synthesize(texts: str | Sequence[str], out: str | os.PathLike, reference: str | os.PathLike,
               language: str = "en", *, xtts_dir: str | os.PathLike | None = None, checkpoint: Any = None,
               base: str | os.PathLike | None = None, vocab: str | os.PathLike | None = None, seed: int = 0,
               overwrite: bool = False, progress: bool = False) -> list[Path]:
    """Speaks ``texts`` in the voice of the ``reference`` recording with Coqui's XTTS
    inference, in a child process as the test sentences are, and returns the files written:
    ``out`` itself (a name ending in ``.wav``) for one text, else ``out/0.wav``, ``1.wav``,
    ... (16-bit PCM at Coqui's output rate, sampling seeded with ``seed``).

    The voice is ``xtts_dir``, a Coqui XTTS folder (the released one, or ``pyxtts export``'s
    output), or ``checkpoint``, a pyxtts checkpoint (or an ``XTTSGPT``) exported first into
    a copy of ``base``, the folder it was fine-tuned from (``vocab``: a new language's
    vocabulary, as for ``export_xtts_checkpoint``). That export and the clips are written in a
    scratch folder beside ``out`` and moved into place once all are spoken: a failure leaves
    ``out`` as it was (a Ctrl-C during the moves comes after them). Existing clips are
    replaced only with ``overwrite``, the ``reference`` recording never. A folder ``out`` is
    held (``pyxtts._files.lock_folder``) until its clips are in place: another speak into it
    meanwhile is refused (BlockingIOError naming the process); a ``.wav`` file another
    process wrote meanwhile is not replaced without ``overwrite`` (FileExistsError).
    ``progress``: a line says what speaks (a checkpoint's step as its export read it) once
    the inputs are checked and the checkpoint exported. Needs coqui-tts
    (``pip install coqui-tts``, which brings torch)."""
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, (list, tuple)) or not texts or \
            not all(isinstance(t, str) and t.strip() for t in texts):
        raise TypeError(f"texts: expected a non-empty str or a non-empty list of them, got {texts!r}")
    out = path_arg("out", out)
    reference = path_arg("reference", reference)
    if not isinstance(language, str) or not language.strip():
        raise TypeError(f"language: expected a language code such as 'en', got {language!r}")
    seed = integer("seed", seed, minimum=0)
    overwrite = flag("overwrite", overwrite)
    progress = flag("progress", progress)
    if (xtts_dir is None) == (checkpoint is None):
        given = "both" if xtts_dir is not None else "neither"
        raise ValueError("xtts_dir, checkpoint: expected exactly one voice to speak with, a Coqui XTTS folder "
                         f"(xtts_dir) or a pyxtts checkpoint (checkpoint), got {given}")
    if checkpoint is not None and base is None:
        raise ValueError("base: expected the Coqui XTTS folder the checkpoint was fine-tuned from (its export "
                         "goes into a copy of it), got None")
    folder = path_arg("xtts_dir", xtts_dir) if xtts_dir is not None else path_arg("base", base)
    files = _targets(out, len(texts), overwrite, reference)
    if not coqui_installed():
        raise ImportError("speaking needs coqui-tts, which runs XTTS's inference: pip install coqui-tts "
                          "(it brings torch)")
    from pyxtts.model import ModelConfig

    def names(i: int, field: str) -> str:
        return f"texts[{i}]" if field == "text" and len(texts) > 1 else "texts" if field == "text" else field

    folder_name = "xtts_dir" if xtts_dir is not None else "base"
    _check_folder(folder, folder_name)
    try:
        max_text = ModelConfig.from_xtts_config(folder / "config.json", vocab=vocab).max_text_tokens
    except (OSError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{folder_name}: {str(folder / 'config.json')!r} is not an XTTS config ({exc})") from None
    sentences = [{"text": t, "language": language, "reference": str(reference)} for t in texts]
    check_test_sentences(sentences, folder, max_text, None, vocab=vocab, names=names, folder_name=folder_name)
    made = _make_folder(files[0].parent)
    lock = _hold_clips_folder(out, files[0].parent)
    done = False
    try:
        files = _targets(out, len(texts), overwrite, reference)  # again, held: what is there now
        try:
            scratch = Path(tempfile.mkdtemp(prefix=".pyxtts-speak-", dir=files[0].parent))
        except OSError as exc:
            raise ValueError(f"out: the folder {str(files[0].parent)!r} cannot be written "
                             f"({exc.strerror or exc})") from None
        try:
            voice, what = folder, str(folder)
            if checkpoint is not None:
                from pyxtts.coqui_checkpoint import export_xtts_checkpoint

                voice = scratch / "xtts"
                # the step of the weights exported: a run may have replaced the file since
                step = export_xtts_checkpoint(checkpoint, folder, voice, vocab=vocab)["step"]
                at = "" if step is None else f" (step {step})"
                what = f"{checkpoint}{at} exported into a scratch copy of {folder}"
            if progress:
                print(f"speaking {len(texts)} text{'s' if len(texts) > 1 else ''} with {what}: Coqui's inference in "
                      "a child process, loading the model first", flush=True)
            spoken = speak(voice, sentences, scratch / "clips", seed)
            _place(spoken, files, overwrite)
            done = True
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    finally:
        if not done:  # the folders made for the clips: gone again, as they were
            remove_empty_folders(made)
        if lock is not None:
            os.close(lock)
    return files


def _hold_clips_folder(out: Path, folder: Path) -> int | None:
    """The lock on the folder ``out`` names (``pyxtts._files.lock_folder``), held until the
    clips are in it: a second speak into it meanwhile would find no clip there yet and have
    its clips replaced by this one's (or, with overwrite, mixed with them). None for a
    ``.wav`` file ``out``, whose folder other speaks may write their own files into
    (``_place`` puts it in place without replacing another's)."""
    if out.suffix.lower() == ".wav":
        return None
    try:
        return lock_folder(folder)
    except BlockingIOError:
        raise folder_in_use(folder, "out", "wait for it to end, or speak into another folder") from None


def _place(spoken: list[Path], files: list[Path], overwrite: bool) -> None:
    """Moves the ``spoken`` clips to ``files``, all of them or, a Ctrl-C meanwhile being
    taken once they are, none. Without ``overwrite``, a file that has appeared at a target
    since it was checked (a speak into the same ``.wav`` file) is not replaced: the clips
    moved so far are taken back and FileExistsError names it."""
    placed: list[Path] = []
    with deferred_sigint():
        try:
            for clip, target in zip(spoken, files):
                if overwrite:
                    os.replace(clip, target)
                else:
                    _move_new(clip, target)
                placed.append(target)
        except BaseException:
            for target in placed if not overwrite else []:
                target.unlink(missing_ok=True)
            raise


def _move_new(clip: Path, target: Path) -> None:
    """``clip`` renamed to ``target``, which must not exist: a hard link, which fails when
    it does (a file system without hard links: checked just before the rename)."""
    try:
        os.link(clip, target)
    except FileExistsError:
        raise FileExistsError(f"out: {str(target)!r} was written by another process while this one spoke; "
                              "overwrite=True replaces it") from None
    except OSError:
        if target.exists():
            raise FileExistsError(f"out: {str(target)!r} was written by another process while this one spoke; "
                                  "overwrite=True replaces it") from None
        os.replace(clip, target)
        return
    clip.unlink()


def _make_folder(folder: Path) -> list[Path]:
    """Makes ``folder`` and its missing parents; returns those it made, deepest first.
    ValueError naming ``out`` when it cannot."""
    missing = missing_folders(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"out: the folder {str(folder)!r} cannot be made ({exc.strerror or exc})") from None
    return missing


def clip_paths(out: str | os.PathLike, n: int) -> list[Path]:
    """Where ``synthesize`` puts the clips of ``n`` texts: ``out`` itself (a name ending in
    ``.wav``), else ``out/0.wav``, ``out/1.wav``, ..."""
    out = Path(out)
    return [out] if out.suffix.lower() == ".wav" else [out / f"{i}.wav" for i in range(n)]


def _targets(out: Path, n: int, overwrite: bool, reference: Path) -> list[Path]:
    """The files ``synthesize`` writes for ``n`` texts, refused when one exists and
    ``overwrite`` is off, or when one is the ``reference`` recording itself (the voice
    would be lost to the clip spoken in it)."""
    if out.suffix.lower() == ".wav":
        if n != 1:
            raise ValueError(f"out: expected a folder for {n} texts (it receives 0.wav, 1.wav, ...), got the file "
                             f"name {str(out)!r}")
        if out.is_dir():
            raise ValueError(f"out: {str(out)!r} is a folder; name a .wav file, or a folder without .wav")
    elif out.exists() and not out.is_dir():
        raise ValueError(f"out: expected a folder for the clips, got {str(out)!r}, which is a file")
    files = clip_paths(out, n)
    there = [str(f) for f in files if f.exists()]
    if there and not overwrite:
        raise FileExistsError(f"out: {there[0]!r} exists; overwrite=True replaces it")
    voice = [f for f in files if _same_file(f, reference)]
    if voice:
        raise ValueError(f"out: {str(voice[0])!r} is the recording the voice is cloned from (reference "
                         f"{str(reference)!r}), which the clip would replace; speak into another file or folder")
    return files


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one file (a link, another spelling of the path)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist
        return False


def _read_audio(path: Path, where: str) -> tuple[np.ndarray, int]:
    """(mono float32 samples, rate) of an audio file; soundfile reads every format, the
    standard library 16-bit PCM WAV. ValueError naming ``where`` for a file neither reads."""
    try:
        import soundfile

        try:
            data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
        except Exception as exc:  # noqa: BLE001 - soundfile raises its own error types
            raise ValueError(f"{where}: {str(path)!r} is not a readable audio file ({exc})") from None
        return data.mean(axis=1), int(rate)
    except ImportError:
        pass
    try:
        with wave.open(str(path), "rb") as w:
            if w.getsampwidth() != 2:
                raise ValueError(f"{where}: {str(path)!r}: only 16-bit WAV reads without the soundfile package")
            raw = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").reshape(-1, w.getnchannels())
            return raw.mean(axis=1).astype(np.float32) / 32768.0, w.getframerate()
    except (wave.Error, EOFError) as exc:
        raise ValueError(f"{where}: {str(path)!r} is not a readable audio file ({exc})") from None


def _check_voice(path: Path, where: str) -> None:
    """ValueError naming ``where`` for a recording Coqui's inference cannot clone a voice
    from: one it cannot read, one shorter than its minimum (it fails only after loading the
    model), or one that holds silence or non-finite samples (no voice, or a NaN clip)."""
    data, rate = _read_audio(path, where)
    seconds = data.size / rate if rate > 0 else 0.0
    if seconds < MIN_REFERENCE_S:
        raise ValueError(f"{where}: expected a recording of at least {MIN_REFERENCE_S} s (Coqui's minimum for a "
                         f"voice to clone), got {seconds:.2f} s in {str(path)!r}")
    if not np.all(np.isfinite(data)):
        raise ValueError(f"{where}: expected finite samples, got NaN or inf in {str(path)!r}")
    if not np.any(data):
        raise ValueError(f"{where}: expected a recording of a voice, got {str(path)!r}, which is silent "
                         "(every sample is zero)")


def write_wav(path: Path, samples: np.ndarray, rate: int) -> None:
    """16-bit PCM WAV, clipped to [-1, 1]. ValueError for NaN or inf samples, which would
    become silence (a cast of NaN to int16 gives 0) and hide a broken model."""
    x = np.asarray(samples, dtype=np.float32).reshape(-1)
    bad = int(np.count_nonzero(~np.isfinite(x)))
    if bad:
        raise ValueError(f"{bad} of {x.size} samples for {path.name} are NaN or inf: the model's weights (or the "
                         "reference's voice) hold non-finite values, as a diverged run's do")
    pcm = (np.clip(x, -1.0, 1.0) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())


def main(argv: list[str]) -> int:
    """The child: EXPORT_DIR SPEC.json OUT_DIR."""
    export_dir, spec_path, out_dir = (Path(a) for a in argv)
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    import torch
    from TTS.tts.configs.xtts_config import XttsConfig
    from TTS.tts.models.xtts import Xtts

    config = XttsConfig()
    config.load_json(str(export_dir / "config.json"))
    model = Xtts(config)  # init_from_config is deprecated in coqui-tts 0.28
    model.load_checkpoint(config, checkpoint_dir=str(export_dir), eval=True)
    from pyxtts.prepare.cleaners import LANGUAGES

    for lang in {s["language"].split("-")[0] for s in spec["sentences"]} - set(LANGUAGES):
        from pyxtts.coqui import enable_language  # a new language's export: Coqui's tokenizer learns its code

        enable_language(model, lang)
    torch.manual_seed(int(spec["seed"]))
    for i, s in enumerate(spec["sentences"]):
        # the clip read here, not by Coqui's torchaudio loader (whose codecs may be absent);
        # then Coqui's own get_conditioning_latents steps
        data, rate = _read_audio(Path(s["reference"]), f"test_sentences[{i}].reference")
        audio = torch.from_numpy(data)[None]
        if rate != SAMPLE_RATE_IN:
            import torchaudio  # Coqui's dependency; only its resampler, no codec

            audio = torchaudio.functional.resample(audio, rate, SAMPLE_RATE_IN)
        audio = audio[:, : SAMPLE_RATE_IN * int(config.max_ref_len)]
        embedding = model.get_speaker_embedding(audio, SAMPLE_RATE_IN)
        latents = model.get_gpt_cond_latents(audio, SAMPLE_RATE_IN, length=config.gpt_cond_len,
                                             chunk_length=config.gpt_cond_chunk_len)
        out = model.inference(s["text"], s["language"], latents, embedding)
        try:
            write_wav(out_dir / f"{i}.wav", np.asarray(out["wav"]), int(config.audio.output_sample_rate))
        except ValueError as exc:
            print(f"sentence {i}: {exc}", file=sys.stderr)  # the parent shows the child's last line
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
