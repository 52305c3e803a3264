"""Inputs of ``pyxtts prepare`` made by the tests themselves: speech synthesised by
espeak-ng in the LJSpeech layout, and the files prepare reads from an XTTS v2 checkpoint
folder, in Coqui's formats and shapes, randomly initialised:

- ``vocab.json``: a BPE ``tokenizers`` model trained on the test sentences, with XTTS's
  special tokens ([STOP] = 0, [UNK] = 1, [SPACE] = 2, the language tags, [START]);
- ``dvae.pth``: every tensor of Coqui's ``DiscreteVAE`` as ``gpt_trainer.py`` builds it
  (80 mel channels, 2 stride-2 layers, 3 residual blocks, 512-wide codebook of 1024 codes),
  saved by ``torch.save``; its codebook is drawn around the encoder's outputs on the test
  speech, so that the speech uses many codes (a codebook of plain N(0, 1) vectors would give
  every frame the same code);
- ``mel_stats.pth``: 80 per-band normalisers;
- ``config.json`` (only when the folder has none): the ``model_args`` prepare reads.

Writing them needs torch (the test extra has it); reading them, pyxtts does not.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np

from coqui import require_coqui

ESPEAK = shutil.which("espeak-ng")

# English sentences with numbers, ordinals, money, abbreviations, symbols and punctuation
SENTENCES_EN = [
    "The quick brown fox jumps over the lazy dog.",
    "Mr. Smith paid $20.15 for 3 books on the 1st of May.",
    "Dr. Jones lives at 221 Baker St. with 2 cats & a dog.",
    "In 1984, about 45% of the voters stayed at home.",
    "She ran 5.5 kilometres in 27 minutes, a personal best!",
    "Is it really 10:30 already? We should leave now.",
    "The temperature dropped to 3° overnight.",
    "Capt. Miller and Sgt. Brown reported at 0600 hours.",
    "Please send an e-mail to support@example.com today.",
    "He owes me £50, not 5,000 pounds.",
    "Our 2nd attempt was better than the 3rd one.",
    "Three hundred and sixty-five days make a year.",
    "The meeting, however, was postponed until Friday.",
    "Why don't you ask the librarian; she knows everything.",
    "Rev. Green gave a short sermon on patience.",
    "A dozen eggs cost 2.99 euros at the market.",
    "Lt. Col. Harris wrote 12 letters in 2 days.",
    "The score was 21 to 17 at half time.",
    "Water boils at 100 degrees at sea level.",
    "My phone number ends with 4 4 7.",
    "The #1 rule is simple: never give up.",
    "They moved to the city in the summer of 2009.",
    "The recipe needs 250 grams of flour and 2 eggs.",
    "Gen. Grant's army crossed the river at dawn.",
    "Five hundred people attended the 40th anniversary.",
    "Quiet please, the baby is finally asleep.",
    "Jr. members pay half price: only $7.50.",
    "The train leaves from platform 9 at 8 o'clock.",
    "Wow, that was unexpected!",
    "The company, Acme Co., reported a loss of 1,200,000 dollars.",
    "Ft. Worth is a city in Texas.",
    "We counted 13 ducks, 7 geese and 1 swan.",
    "Hon. members, the session is now open.",
    "It rained for 40 days and 40 nights.",
    "Maj. Lee's report ran to 96 pages.",
    "The book has 3 chapters and 120 pages.",
    "Esq. is rarely written after a name nowadays.",
    "Ltd. companies must file their accounts every year.",
    "Nine out of 10 dentists agree.",
    "Good night, and thank you for listening.",
]

# sentences per language for the tokenizer's comparison with Coqui
SENTENCES = {
    "en": SENTENCES_EN,
    "es": ["Hola Sr. García, son las 10 de la mañana.", "La Dra. Martínez compró 3 libros por 20€.",
           "El 1er premio fue de $1.500.", "Había 50 soldados y un 25% estaba herido.",
           "Nos vemos @ la fiesta del 2º piso.", "Vivimos en el número 12,5 de la calle.",
           "¿Cuántos años tienes? ¡Tengo 33!", "El Sr. López & la Sra. Pérez llegaron a las 8."],
    "fr": ["Bonjour Mr. Dupont, il est 9 heures.", "Mme. Moreau a payé 20,15€ pour 2 livres.",
           "C'est le 1er jour du mois.", "Il y avait 50 soldats et 14% de pertes.",
           "La réunion est au 3e étage.", "Le Dr. Martin & son fils sont arrivés.",
           "J'ai 14° de fièvre, dit-il.", "Ce sera 100.000,5 euros."],
    "de": ["Frau Dr. Müller ist sehr klug.", "Das macht 20,15€, Herr Schmidt.",
           "Dies ist der 1. Test von 3.", "Es gab 50 Soldaten und 25% Verluste.",
           "St. Pauli spielt um 15 Uhr.", "Die Rechnung beträgt £ 20 & mehr.",
           "Wir fahren 120 km/h auf der Autobahn.", "Er wurde am 3. Mai 1990 geboren."],
    "it": ["Buongiorno, Sig. Rossi, sono le 8.", "Ti costerà 20,15€ signore.",
           "Questo è il 1° test della giornata.", "C'erano 50 soldati e il 10% era ferito.",
           "Il Dr. Bianchi & sua moglie.", "Abbiamo 3 gatti e 2 cani."],
    "pt": ["Olá Sr. Silva, são 10 horas.", "Isso custará 20,15€ senhor.",
           "Este é o 1º teste do dia.", "Havia 50 soldados e 25% estavam feridos.",
           "A Dra. Costa & o marido chegaram.", "O meu email é ana@gmail.com."],
    "pl": ["Dzień dobry, P. Kowalski, jest 9 rano.", "To będzie kosztować 20€ panie.",
           "Było 50 żołnierzy i 10% rannych.", "Dr. Nowak ma 3 koty & psa."],
    "tr": ["Merhaba B. Yılmaz, saat 9.", "Dr. Ayşe burada ve 50 asker vardı.",
           "Bu 1. test ve %14 dolu.", "İstanbul'da 3 gün kaldık."],
    "ru": ["Здравствуйте Г-н Иванов, сейчас 9 часов.", "Д-р Смирнов здесь, чтобы увидеть вас.",
           "Там было 50 солдат и 10% раненых.", "Это будет стоить 20€ господин."],
    "nl": ["Dhr. Jansen komt om 9 uur.", "Mevr. de Vries betaalde 20€.",
           "Er waren 50 soldaten en 14% was gewond.", "Ik zie je @ het feest."],
    "cs": ["Dr. Vojtěch přijde v 9 hodin.", "To bude stát 20€ pane.",
           "Bylo tam 50 vojáků a 14% zraněných.", "P. Novák má 3 kočky."],
    "ar": ["كان هناك 50 جنديًا.", "لدي 14% في البطارية.", "في الساعة 9 صباحا."],
    "hu": ["Dr. Szabó itt van 9 órakor.", "50 katona volt és 14% sebesült.", "Ez az 1. teszt."],
    "hi": ["मेरे पास 14% बैटरी है।", "50 सैनिक थे।", "यह 3 किताबें हैं।"],
    "ko": ["배터리 잔량이 14%입니다.", "50 명의 병사가 있었다.", "이것은 1 번째 테스트입니다."],
}


# languages whose cleaning needs more packages (zh: coqui-tts and pypinyin; ja: cutlet, fugashi, unidic-lite)
SENTENCES_CJK = {
    "ja": ["こんにちは、世界。", "今日は2024年5月3日です。", "東京タワーは333メートルです！", "この本は1500円でした。",
           "カタカナとひらがなと漢字。", "50%の確率で雨が降ります。", "ＡＢＣとabc、123。", "猫が3匹、犬が2匹います。"],
    "zh": ["在12.5秒内", "有50名士兵", "我的电量为 14%", "今天是2024年5月3日。", "你好，世界！", "价格是3.5元，打8折。",
           "第2名和第10名。", "他跑了100米，用了12.34秒。"],
}


def espeak(text: str, path: Path, voice: str = "en-us", speed: int = 160, pitch: int = 50) -> None:
    """Writes espeak-ng's speech of text to path (a 22,050 Hz 16-bit mono WAV)."""
    if ESPEAK is None:
        raise RuntimeError("espeak-ng is not installed (Debian: apt-get install espeak-ng)")
    subprocess.run([ESPEAK, "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", str(path), text],
                   check=True, capture_output=True, timeout=60)


def make_ljspeech(root: Path, sentences: list[str] = SENTENCES_EN) -> Path:
    """root/metadata.csv (id|text|text) and root/wavs/<id>.wav, voices, speeds and pitches
    varied from sentence to sentence; returns the metadata path."""
    wavs = root / "wavs"
    wavs.mkdir(parents=True, exist_ok=True)
    voices = ["en-us", "en-gb", "en-gb-scotland", "en-029"]
    lines = []
    for i, text in enumerate(sentences):
        key = f"LJ001-{i + 1:04d}"
        espeak(text, wavs / f"{key}.wav", voices[i % len(voices)], 130 + (i * 17) % 70, 35 + (i * 11) % 40)
        lines.append(f"{key}|{text}|{text}")
    meta = root / "metadata.csv"
    meta.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return meta


SPECIAL_TOKENS = ["[STOP]", "[UNK]", "[SPACE]", "[en]", "[es]", "[fr]", "[de]", "[it]", "[pt]", "[pl]", "[tr]",
                  "[ru]", "[nl]", "[cs]", "[ar]", "[zh-cn]", "[hu]", "[ko]", "[ja]", "[hi]", "[START]"]


def write_vocab(path: Path, texts: list[str], vocab_size: int = 600) -> None:
    """A BPE tokenizer in XTTS's vocab.json layout, trained on texts (already cleaned, as
    XTTS's was): whitespace pre-tokenisation, [UNK] for unknown characters, the special
    tokens first."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))


def _conv_init(rng: np.random.Generator, c_out: int, c_in: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """PyTorch's default Conv1d initialisation: uniform in +-1/sqrt(fan_in)."""
    bound = 1.0 / np.sqrt(c_in * k)
    return (rng.uniform(-bound, bound, (c_out, c_in, k)).astype(np.float32),
            rng.uniform(-bound, bound, c_out).astype(np.float32))


def dvae_state(rng: np.random.Generator, channels: int = 80, hidden: int = 512, codebook_dim: int = 512,
               num_tokens: int = 1024, resblocks: int = 3) -> dict[str, np.ndarray]:
    """Every tensor of Coqui's DiscreteVAE(channels, hidden_dim, codebook_dim, num_tokens,
    num_layers=2, num_resnet_blocks, kernel_size=3, positional_dims=1, no transposed convs)."""
    s: dict[str, np.ndarray] = {}

    def conv(name: str, c_out: int, c_in: int, k: int) -> None:
        s[f"{name}.weight"], s[f"{name}.bias"] = _conv_init(rng, c_out, c_in, k)

    def resblock(name: str, width: int) -> None:
        for j, k in ((0, 3), (2, 3), (4, 1)):
            conv(f"{name}.net.{j}", width, width, k)

    inner = hidden * 2
    conv("encoder.0.0", hidden, channels, 3)
    conv("encoder.1.0", inner, hidden, 3)
    for b in range(resblocks):
        resblock(f"encoder.{2 + b}", inner)
    conv(f"encoder.{2 + resblocks}", codebook_dim, inner, 1)
    conv("decoder.0", inner, codebook_dim, 1)
    for b in range(resblocks):
        resblock(f"decoder.{1 + b}", inner)
    conv(f"decoder.{1 + resblocks}.0.conv", inner, inner, 3)
    conv(f"decoder.{2 + resblocks}.0.conv", hidden, inner, 3)
    conv(f"decoder.{3 + resblocks}", channels, hidden, 1)
    embed = rng.standard_normal((codebook_dim, num_tokens)).astype(np.float32)
    s["codebook.embed"] = embed
    s["codebook.cluster_size"] = np.zeros(num_tokens, np.float32)
    s["codebook.embed_avg"] = embed.copy()
    s["discrete_loss.accumulator_index"] = np.zeros(1, np.int64)
    s["discrete_loss.accumulator_filled"] = np.zeros(1, np.int64)
    s["discrete_loss.accumulator"] = np.zeros((100, num_tokens), np.float32)
    return s


def torch_dvae_encode(state: dict, mel):
    """The encoder of Coqui's DiscreteVAE as gpt_trainer builds it, written out with torch's
    convolutions in the dtype of ``mel`` (a (1, 80, frames) tensor): (frames / 4, codebook_dim)."""
    import torch
    import torch.nn.functional as F

    def conv(h, name, stride=1):
        w = torch.as_tensor(np.asarray(state[f"{name}.weight"]), dtype=mel.dtype)
        b = torch.as_tensor(np.asarray(state[f"{name}.bias"]), dtype=mel.dtype)
        return F.conv1d(h, w, b, stride=stride, padding=(w.shape[2] - 1) // 2)

    h = F.relu(conv(mel, "encoder.0.0", 2))
    h = F.relu(conv(h, "encoder.1.0", 2))
    for i in (2, 3, 4):
        r = F.relu(conv(h, f"encoder.{i}.net.0"))
        r = F.relu(conv(r, f"encoder.{i}.net.2"))
        h = conv(r, f"encoder.{i}.net.4") + h
    return conv(h, "encoder.5")[0].T


def torch_save(obj, path: Path) -> None:
    import torch

    def conv(v):
        if isinstance(v, np.ndarray):
            return torch.from_numpy(np.ascontiguousarray(v))
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        return v
    torch.save(conv(obj), str(path))


FULL_DVAE = {"hidden": 512, "codebook_dim": 512, "num_tokens": 1024}  # XTTS v2's, as gpt_trainer builds it
TINY_DVAE = {"hidden": 16, "codebook_dim": 8, "num_tokens": 64}  # same layers, narrow: fast tests


def write_assets(folder: Path, wavs: list[Path], seed: int, texts: list[str], dvae: dict = FULL_DVAE,
                 max_text_tokens: int = 402, max_audio_tokens: int = 605, perceiver: bool = True) -> None:
    """vocab.json, dvae.pth, mel_stats.pth (and config.json if absent) in folder; the DVAE's
    codebook is centred on its encoder's outputs for the given recordings (a few suffice)."""
    from pyxtts.prepare import DVAE_MEL, DVAEEncoder, load_audio, mel_spectrogram

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    write_vocab(folder / "vocab.json", texts)
    stats = rng.uniform(-6.0, -2.0, 80).astype(np.float32)
    torch_save(stats, folder / "mel_stats.pth")
    state = dvae_state(rng, **dvae)
    torch_save(state, folder / "dvae.pth")
    enc = DVAEEncoder.load(folder / "dvae.pth")
    z = np.concatenate([enc.encode(mel_spectrogram(load_audio(w), stats, DVAE_MEL)) for w in wavs])  # (frames, 512)
    centres = z[rng.integers(0, z.shape[0], state["codebook.embed"].shape[1])]  # (1024, 512)
    spread = z.std(axis=0) * 0.5
    embed = (centres + rng.standard_normal(centres.shape) * spread).T.astype(np.float32)
    state["codebook.embed"] = embed
    state["codebook.embed_avg"] = embed.copy()
    torch_save(state, folder / "dvae.pth")
    if not (folder / "config.json").exists():
        cfg = {"model": "xtts", "audio": {"sample_rate": 22050, "dvae_sample_rate": 22050, "output_sample_rate": 24000},
               "model_args": {"gpt_max_text_tokens": max_text_tokens, "gpt_max_audio_tokens": max_audio_tokens,
                              "gpt_code_stride_len": 1024, "gpt_num_audio_tokens": dvae["num_tokens"] + 2,
                              "gpt_use_perceiver_resampler": perceiver, "gpt_use_masking_gt_prompt_approach": True}}
        (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")


def training_texts() -> list[str]:
    """The cleaned sentences of every language the tokenizer tests run (the vocab's corpus)."""
    from pyxtts.prepare.cleaners import clean_text

    out = []
    for lang, sentences in SENTENCES.items():
        for s in sentences:
            try:
                out.append(clean_text(s, lang))
            except Exception:  # noqa: BLE001 - a num2words gap: the raw sentence still adds its characters
                out.append(s.lower())
    return out


# ---- Coqui's own XTTS code on the same inputs (tests/coqui.py: skips when absent) ----------

def _coqui_wav(coqui, path: str | Path):
    """A 22,050 Hz file as Coqui's trainer holds it (mono float32; torchaudio.load of a
    16-bit PCM file gives the same values soundfile does)."""
    import soundfile as sf

    data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    assert rate == 22050, f"{path}: the Coqui references take 22,050 Hz files, got {rate}"
    mono = data.mean(axis=1, dtype=np.float32) if data.shape[1] > 1 else data[:, 0].copy()
    return coqui.torch.from_numpy(mono)


def coqui_tokens(vocab: Path, pairs: list[list[str]]) -> list:
    """``VoiceBpeTokenizer(vocab).encode(text, lang)`` for each [text, lang]; a failure is
    ``{"error": "ExceptionName: message"}`` (the result to compare with)."""
    coqui = require_coqui()
    tok = coqui.VoiceBpeTokenizer(str(vocab))
    out: list = []
    for text, lang in pairs:
        try:
            out.append(tok.encode(text, lang))
        except Exception as exc:  # noqa: BLE001 - the error is the result
            out.append({"error": f"{type(exc).__name__}: {exc}"})
    return out


def coqui_audio(xtts_dir: Path, wavs: list[Path], dtype: str = "float32") -> list[tuple[np.ndarray, np.ndarray]]:
    """(the DVAE's normalised mel, DiscreteVAE.get_codebook_indices) of each clip alone (a
    batch of one), with the DVAE gpt_trainer.py builds and the folder's dvae.pth, computed
    in ``dtype``: float32 as Coqui trains, or float64 (every buffer and weight)."""
    coqui = require_coqui()
    torch = coqui.torch
    cfg = json.loads((xtts_dir / "config.json").read_text())["model_args"]
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64 if dtype == "float64" else torch.float32)
    try:
        mel = coqui.TorchMelSpectrogram(mel_norm_file=str(xtts_dir / "mel_stats.pth"), sampling_rate=22050)
    finally:
        torch.set_default_dtype(before)
    state = torch.load(xtts_dir / "dvae.pth", map_location="cpu", weights_only=True)
    # gpt_trainer.py's DiscreteVAE has hidden_dim = codebook_dim = 512; the tests also use narrower ones
    dvae = coqui.DiscreteVAE(channels=80, normalization=None, positional_dims=1,
                             num_tokens=cfg["gpt_num_audio_tokens"] - 2,
                             codebook_dim=state["codebook.embed"].shape[0],
                             hidden_dim=state["encoder.0.0.weight"].shape[0], num_resnet_blocks=3, kernel_size=3,
                             num_layers=2, use_transposed_convs=False)
    missing, unexpected = dvae.load_state_dict(state, strict=False)
    assert not unexpected and not [k for k in missing if k.startswith(("encoder", "codebook"))], (missing, unexpected)
    dvae = dvae.to(getattr(torch, dtype)).eval()
    out = []
    with torch.no_grad():
        for w in wavs:
            m = mel(_coqui_wav(coqui, w).to(getattr(torch, dtype))[None, None, :])  # (1, 80, frames)
            assert m.dtype == getattr(torch, dtype)
            out.append((m[0].numpy(), dvae.get_codebook_indices(m)[0].numpy()))
    return out


def coqui_mels(mel_stats: Path, n_fft: int, hop: int, win: int, dtype: str,
               signals: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """TorchMelSpectrogram with those settings (the DVAE's: 1024 256 1024; the conditioning
    encoder's: 2048 256 1024, or 4096 1024 4096 without the perceiver) on each waveform,
    computed in ``dtype`` (float32 as Coqui trains, or float64)."""
    coqui = require_coqui()
    torch = coqui.torch
    # in float64, every buffer (window, filterbank) is built in float64 too
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64 if dtype == "float64" else torch.float32)
    try:
        m = coqui.TorchMelSpectrogram(filter_length=n_fft, hop_length=hop, win_length=win, normalize=False,
                                      sampling_rate=22050, mel_fmin=0, mel_fmax=8000, n_mel_channels=80,
                                      mel_norm_file=str(mel_stats))
    finally:
        torch.set_default_dtype(before)
    with torch.no_grad():
        return {k: m(torch.from_numpy(v.astype(dtype))[None, None, :])[0].numpy() for k, v in signals.items()}


def coqui_prompt_slice(wav: Path) -> tuple[np.ndarray, list[int]]:
    """Coqui's get_prompt_slice in evaluation mode: the slice and its [start, end]."""
    coqui = require_coqui()
    ds = coqui.xtts_dataset
    load = ds.load_audio
    ds.load_audio = lambda path, sr: _coqui_wav(coqui, path)[None, :]  # torchaudio's file loading is not needed
    try:
        clip, _length, idxs = ds.get_prompt_slice(str(wav), 132300, 66150, 22050, is_eval=True)
    finally:
        ds.load_audio = load
    return clip[0].numpy(), [int(i) for i in idxs]
