#!/bin/sh
# Installs coqui-tts 0.28.0, the reference the Coqui comparison tests run against
# (tests/coqui.py), into the Python environment of `python` (or $PYTHON).
#
# coqui-tts declares no torch dependency and runs on the CPU torch 2.13.0 the test
# extra installs. It imports torchaudio, whose PyPI 2.11.0 wheel is a CUDA build: its
# native libraries cannot load beside the CPU torch, so torchaudio and torchcodec come
# without dependencies and their compiled libraries are removed, leaving the
# pure-Python paths the XTTS GPT modules use. transformers >= 5 imports torchaudio at
# module level in a way that breaks, 4.57 does not; six is needed and undeclared.
set -eu
PY=${PYTHON:-python}
"$PY" -m pip install -q "torch==2.13.0" "coqui-tts==0.28.0" "transformers==4.57.*"
"$PY" -m pip install -q --no-deps "torchaudio==2.11.0" "torchcodec==0.17.0" six
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -f "$site"/torchaudio/lib/*.so
"$PY" -c 'from TTS.tts.layers.xtts.gpt import GPT; from TTS.tts.models.xtts import Xtts'
echo "coqui-tts 0.28.0 installed for $("$PY" -c 'import sys; print(sys.executable)')"
