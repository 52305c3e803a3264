"""Text cleaning of XTTS v2's tokenizer, language by language: the text Coqui's
``VoiceBpeTokenizer.preprocess_text`` (``TTS/tts/layers/xtts/tokenizer.py``, coqui-tts 0.28.0)
hands to the BPE model, so that the ids are the ones XTTS v2 was trained with.

For the multilingual languages the steps are, in this order: drop double quotes (Turkish
also folds İ, Ö, Ü), lowercase, expand numbers (thousands separators, currencies, decimals,
ordinals, integers, all through ``num2words``), expand abbreviations, spell out symbols,
collapse whitespace. Chinese runs Coqui's own Chinese number normaliser and pypinyin
(coqui-tts and pypinyin must be installed), Korean is then romanised (ko-speech-tools),
Japanese is romanised by cutlet and lowercased instead. Where Coqui's rules have quirks
(an unescaped ``.`` that matches any character, currency expansion abandoned at the first
failure, the Russian abbreviations without their dots), they are kept: the point is the
same ids, not better text.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

from pyxtts.prepare._deps import require

__all__ = ["LANGUAGES", "clean_text"]

LANGUAGES = ("en", "es", "fr", "de", "it", "pt", "pl", "tr", "ru", "nl", "cs", "ar", "zh", "hu", "ko", "ja", "hi")
_MULTILINGUAL = frozenset(LANGUAGES) - {"ja"}

# abbreviation -> expansion; matched as a word followed by a dot ("mr." -> "mister"),
# in this order, case-insensitively
_ABBREVIATIONS: dict[str, list[tuple[str, str]]] = {
    "en": [("mrs", "misess"), ("mr", "mister"), ("dr", "doctor"), ("st", "saint"), ("co", "company"),
           ("jr", "junior"), ("maj", "major"), ("gen", "general"), ("drs", "doctors"), ("rev", "reverend"),
           ("lt", "lieutenant"), ("hon", "honorable"), ("sgt", "sergeant"), ("capt", "captain"),
           ("esq", "esquire"), ("ltd", "limited"), ("col", "colonel"), ("ft", "fort")],
    "es": [("sra", "señora"), ("sr", "señor"), ("dr", "doctor"), ("dra", "doctora"), ("st", "santo"),
           ("co", "compañía"), ("jr", "junior"), ("ltd", "limitada")],
    "fr": [("mme", "madame"), ("mr", "monsieur"), ("dr", "docteur"), ("st", "saint"), ("co", "compagnie"),
           ("jr", "junior"), ("ltd", "limitée")],
    "de": [("fr", "frau"), ("dr", "doktor"), ("st", "sankt"), ("co", "firma"), ("jr", "junior")],
    "pt": [("sra", "senhora"), ("sr", "senhor"), ("dr", "doutor"), ("dra", "doutora"), ("st", "santo"),
           ("co", "companhia"), ("jr", "júnior"), ("ltd", "limitada")],
    "it": [("sig", "signore"), ("dr", "dottore"), ("st", "santo"), ("co", "compagnia"), ("jr", "junior"),
           ("ltd", "limitata")],
    "pl": [("p", "pani"), ("m", "pan"), ("dr", "doktor"), ("sw", "święty"), ("jr", "junior")],
    "cs": [("dr", "doktor"), ("ing", "inženýr"), ("p", "pan")],
    "ru": [("г-жа", "госпожа"), ("г-н", "господин"), ("д-р", "доктор")],
    "nl": [("dhr", "de heer"), ("mevr", "mevrouw"), ("dr", "dokter"), ("jhr", "jonkheer")],
    "tr": [("b", "bay"), ("byk", "büyük"), ("dr", "doktor")],
    "hu": [("dr", "doktor"), ("b", "bácsi"), ("nőv", "nővér")],
    "ar": [], "zh": [], "ko": [], "hi": [],
}
_NO_DOT = frozenset({"ru"})  # Russian's abbreviations match as whole words, without a dot

# & @ % # $ £ ° spelled out, in that order
_SYMBOL_CHARS = "&@%#$£°"
_SYMBOL_WORDS: dict[str, tuple[str, ...]] = {
    "en": ("and", "at", "percent", "hash", "dollar", "pound", "degree"),
    "es": ("y", "arroba", "por ciento", "numeral", "dolar", "libra", "grados"),
    "fr": ("et", "arobase", "pour cent", "dièse", "dollar", "livre", "degrés"),
    "de": ("und", "at", "prozent", "raute", "dollar", "pfund", "grad"),
    "pt": ("e", "arroba", "por cento", "cardinal", "dólar", "libra", "graus"),
    "it": ("e", "chiocciola", "per cento", "cancelletto", "dollaro", "sterlina", "gradi"),
    "pl": ("i", "małpa", "procent", "krzyżyk", "dolar", "funt", "stopnie"),
    "ar": ("و", "على", "في المئة", "رقم", "دولار", "جنيه", "درجة"),
    "zh": ("和", "在", "百分之", "号", "美元", "英镑", "度"),
    "cs": ("a", "na", "procento", "křížek", "dolar", "libra", "stupně"),
    "ru": ("и", "собака", "процентов", "номер", "доллар", "фунт", "градус"),
    "nl": ("en", "bij", "procent", "hekje", "dollar", "pond", "graden"),
    "tr": ("ve", "at", "yüzde", "diyez", "dolar", "sterlin", "derece"),
    "hu": ("és", "kukac", "százalék", "kettőskereszt", "dollár", "font", "fok"),
    "ko": ("그리고", "에", "퍼센트", "번호", "달러", "파운드", "도"),
    "hi": ("और", "ऐट दी रेट", "प्रतिशत", "हैश", "डॉलर", "पाउंड", "डिग्री"),
}

# an ordinal: the number, then the language's ordinal suffix
_ORDINAL_SUFFIX = {
    "en": r"(st|nd|rd|th)", "es": r"(º|ª|er|o|a|os|as)", "fr": r"(º|ª|er|re|e|ème)",
    "de": r"(st|nd|rd|th|º|ª|\.(?=\s|$))", "pt": r"(º|ª|o|a|os|as)", "it": r"(º|°|ª|o|a|i|e)",
    "pl": r"(º|ª|st|nd|rd|th)", "ar": r"(ون|ين|ث|ر|ى)", "cs": r"\.(?=\s|$)",
    "ru": r"(-й|-я|-е|-ое|-ье|-го)", "nl": r"(de|ste|e)", "tr": r"(\.|inci|nci|uncu|üncü|\.)",
    "hu": r"(\.|adik|edik|odik|edik|ödik|ödike|ik)", "ko": r"(번째|번|차|째)", "hi": r"(st|nd|rd|th)",
}
_ORDINAL_RE = {lang: re.compile(r"([0-9]+)" + suffix) for lang, suffix in _ORDINAL_SUFFIX.items()}

# what num2words puts between the units and the cents of an amount; cut when there are none
_CURRENCY_JOINER = {"en": ", ", "es": " con ", "fr": " et ", "de": " und ", "pt": " e ", "it": " e ",
                    "pl": ", ", "cs": ", ", "ru": ", ", "nl": ", ", "ar": ", ", "tr": ", ", "hu": ", ",
                    "ko": ", ", "hi": ", "}
# checked in this order: pounds, dollars, euros; the sign before or after the amount
_CURRENCIES = [(code, re.compile(rf"(({sign}[0-9\.\,]*[0-9]+)|([0-9\.\,]*[0-9]+{sign}))"))
               for code, sign in (("GBP", "£"), ("USD", r"\$"), ("EUR", "€"))]

_THOUSANDS_COMMA_RE = re.compile(r"\b\d{1,3}(,\d{3})*(\.\d+)?\b")  # 1,000,000.5 (en, ru)
_THOUSANDS_DOT_RE = re.compile(r"\b\d{1,3}(.\d{3})*(\,\d+)?\b")  # 1.000.000,5 ("." as Coqui has it: any char)
_DECIMAL_RE = re.compile(r"([0-9]+[.,][0-9]+)")
_INTEGER_RE = re.compile(r"[0-9]+")
_WHITESPACE_RE = re.compile(r"\s+")


@lru_cache(maxsize=None)
def _abbreviation_rules(lang: str) -> list[tuple[re.Pattern, str]]:
    end = r"\b" if lang in _NO_DOT else r"\."
    return [(re.compile(rf"\b{abbr}{end}", re.IGNORECASE), full) for abbr, full in _ABBREVIATIONS[lang]]


@lru_cache(maxsize=None)
def _symbol_rules(lang: str) -> list[tuple[re.Pattern, str]]:
    return [(re.compile(re.escape(ch), re.IGNORECASE), f" {word} ")
            for ch, word in zip(_SYMBOL_CHARS, _SYMBOL_WORDS[lang])]


def _num2words() -> Callable:
    return require("num2words", "expanding numbers in text").num2words


def _strip_separator(sep: str) -> Callable[[re.Match], str]:
    return lambda m: m.group(0).replace(sep, "")


def _currency(lang: str, code: str, n2w: Callable) -> Callable[[re.Match], str]:
    def spell(m: re.Match) -> str:
        amount = float(re.sub(r"[^\d.]", "", m.group(0).replace(",", ".")))
        words = n2w(amount, to="currency", currency=code, lang=lang)
        if amount.is_integer():  # "twenty dollars, zero cents" -> "twenty dollars"
            cut = words.rfind(_CURRENCY_JOINER[lang])
            if cut != -1:
                words = words[:cut]
        return words
    return spell


def _expand_numbers(text: str, lang: str) -> str:
    n2w = _num2words()
    if lang in ("en", "ru"):
        text = _THOUSANDS_COMMA_RE.sub(_strip_separator(","), text)
    else:
        text = _THOUSANDS_DOT_RE.sub(_strip_separator("."), text)
    try:  # num2words lacks some currencies in some languages: the first failure ends this step
        for code, pattern in _CURRENCIES:
            text = pattern.sub(_currency(lang, code, n2w), text)
    except Exception:  # noqa: BLE001 - Coqui swallows every error here too
        pass
    if lang != "tr":
        text = _DECIMAL_RE.sub(lambda m: n2w(float(m.group(1).replace(",", ".")), lang=lang), text)
    text = _ORDINAL_RE[lang].sub(lambda m: n2w(int(m.group(1)), ordinal=True, lang=lang), text)
    return _INTEGER_RE.sub(lambda m: n2w(int(m.group(0)), lang=lang), text)


def _chinese_numbers(text: str) -> str:
    try:
        from TTS.tts.layers.xtts.zh_num2words import TextNorm
    except ImportError as exc:
        raise ImportError("Chinese (zh) text needs Coqui's Chinese number normaliser: pip install coqui-tts "
                          f"pypinyin ({exc})") from exc
    return TextNorm()(text)


def _pinyin(text: str) -> str:
    pypinyin = require("pypinyin", "Chinese (zh) text", "pip install pypinyin")
    syllables = pypinyin.pinyin(text, style=pypinyin.Style.TONE3, heteronym=False, neutral_tone_with_five=True)
    return "".join(s[0] for s in syllables)


def _hangul_romanize(text: str) -> str:
    ko = require("ko_speech_tools", "Korean (ko) text", "pip install ko-speech-tools")
    return ko.hangul_romanize(text)


@lru_cache(maxsize=1)
def _katsu():
    cutlet = require("cutlet", "Japanese (ja) text", "pip install cutlet fugashi unidic-lite")
    return cutlet.Cutlet()


def _multilingual(text: str, lang: str) -> str:
    text = text.replace('"', "")
    if lang == "tr":
        text = text.replace("İ", "i").replace("Ö", "ö").replace("Ü", "ü")
    text = text.lower()
    text = _chinese_numbers(text) if lang == "zh" else _expand_numbers(text, lang)
    for pattern, full in _abbreviation_rules(lang):
        text = pattern.sub(full, text)
    for pattern, words in _symbol_rules(lang):
        text = pattern.sub(words, text).replace("  ", " ")
    text = text.strip()
    return _WHITESPACE_RE.sub(" ", text).strip()


def clean_text(text: str, lang: str) -> str:
    """The cleaned text XTTS v2's BPE model reads, for a language code without region
    ("en", "zh", ...). Raises ValueError for a language XTTS v2 does not know, ImportError
    naming the package a language needs when it is missing; errors of num2words (a number it
    cannot spell in that language) propagate, as in Coqui."""
    if not isinstance(text, str):
        raise TypeError(f"text: expected a str, got {type(text).__name__}")
    if lang == "ja":
        return _katsu().romaji(text).lower()
    if lang not in _MULTILINGUAL:
        raise ValueError(f"language: expected one of {', '.join(LANGUAGES)}, got {lang!r}")
    text = _multilingual(text, lang)
    if lang == "zh":
        text = _pinyin(text)
    elif lang == "ko":
        text = _hangul_romanize(text)
    return text


# ---- a language XTTS v2 does not speak ---------------------------------------------------

# typographic punctuation -> the ASCII XTTS v2's vocabulary was trained on
_PUNCTUATION = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
                              "\u201c": "", "\u201d": "", "\u201e": "", "\u00ab": "", "\u00bb": "", '"': "",
                              "\u2013": "-", "\u2014": "-", "\u2012": "-", "\u2212": "-", "\u00a0": " ",
                              "\u2026": "...", "\u3002": ".", "\uff0c": ",", "\uff01": "!", "\uff1f": "?"})
_DIGIT_RE = re.compile(r"\d")
_LANGUAGE_CODE_RE = re.compile(r"[a-z]{2,3}")
# languages num2words spells, XTTS v2 does not speak, that group thousands with a dot and
# write decimals with a comma (CLDR): 10.000 is ten thousand there, 3,5 three and a half
DOT_THOUSANDS = frozenset({"az", "ca", "da", "id", "is", "ro", "sl", "sr", "vi"})
# dot-grouped thousands: 1-3 digits, then groups of exactly three (a decimal comma may follow)
_DOT_GROUPS_RE = re.compile(r"(?<![\d.,])\d{1,3}(?:\.\d{3})+(?!\d|\.\d)")


def check_language_code(language: str, argument: str = "language") -> str:
    """The code of a language as a ``[code]`` token: two or three lowercase ASCII letters (ISO
    639-1 or 639-3), after a region suffix is cut ("vi-VN" -> "vi"); ValueError otherwise."""
    if not isinstance(language, str):
        raise TypeError(f"{argument}: expected a str such as 'vi', got {type(language).__name__}")
    code = language.split("-")[0]
    if not _LANGUAGE_CODE_RE.fullmatch(code):
        raise ValueError(f"{argument}: expected an ISO 639 code of 2 or 3 lowercase letters such as 'vi' or "
                         f"'swa' (a region suffix such as '-VN' is ignored), got {language!r}")
    return code


def num2words_knows(lang: str) -> bool:
    """Whether num2words can spell numbers in ``lang`` (so digits are expanded)."""
    return lang in _num2words_languages()


@lru_cache(maxsize=1)
def _num2words_languages() -> frozenset[str]:
    return frozenset(require("num2words", "expanding numbers in text").CONVERTER_CLASSES)


def clean_new_language(text: str, lang: str) -> str:
    """The cleaning of a language XTTS v2 does not speak (``prepare --new-language``), the same
    at training and at inference (``pyxtts.coqui.enable_language``): Unicode NFC; typographic
    quotes, dashes and ellipses to ASCII (double quotes dropped, as XTTS v2 drops them);
    lowercase (a no-op for scripts without case); decimals, ordinals-free integers and
    thousands spelled by num2words when it knows ``lang``, digits left as they are otherwise
    (``has_digits`` finds them); whitespace collapsed. Thousands: in the languages of
    ``DOT_THOUSANDS`` (Vietnamese among them) a dot followed by exactly three digits groups
    them and the comma is the decimal mark (``1.500.000,5``); elsewhere the comma groups
    them and the dot is the decimal mark (``1,500,000.5``)."""
    import unicodedata

    if not isinstance(text, str):
        raise TypeError(f"text: expected a str, got {type(text).__name__}")
    text = unicodedata.normalize("NFC", text).translate(_PUNCTUATION).lower()
    if num2words_knows(lang) and _DIGIT_RE.search(text):
        n2w = _num2words()
        if lang in DOT_THOUSANDS:
            text = _DOT_GROUPS_RE.sub(_strip_separator("."), text)
        else:
            text = _THOUSANDS_COMMA_RE.sub(_strip_separator(","), text)
        text = _DECIMAL_RE.sub(lambda m: " " + n2w(float(m.group(1).replace(",", ".")), lang=lang) + " ", text)
        text = _INTEGER_RE.sub(lambda m: " " + n2w(int(m.group(0)), lang=lang) + " ", text)
    text = _WHITESPACE_RE.sub(" ", text).strip()
    return re.sub(r" ([.,!?;:])", r"\1", text)  # "mười ." -> "mười." after a spelled number


def has_digits(text: str) -> bool:
    return _DIGIT_RE.search(text) is not None
