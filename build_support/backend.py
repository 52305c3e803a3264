"""PEP 517 backend: setuptools, plus the cuBLAS wheel as a build requirement
when the CUDA backend will be built and no cuBLAS is installed: neither in the
toolkit nor as the nvidia-cublas wheel of the environment being installed into."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

from setuptools import build_meta as _meta  # noqa: E402
from setuptools.build_meta import *  # noqa: E402,F401,F403

import cudafind  # noqa: E402


def _extra() -> list[str]:
    cuda = cudafind.find()
    if cuda is None or cuda.cublas_include is not None:
        return []
    return [cudafind.cublas_wheel_requirement(cuda.version[0])]


def get_requires_for_build_wheel(config_settings=None):
    return _meta.get_requires_for_build_wheel(config_settings) + _extra()


def get_requires_for_build_editable(config_settings=None):
    return _meta.get_requires_for_build_editable(config_settings) + _extra()
