"""Installed versions come from package metadata (dist-info folder names), agree with importlib.metadata,
and never import the libraries."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

from gemma_doctor.readers.versions import PACKAGES, installed


def test_versions_agree_with_importlib_metadata():
    found = installed()
    for name in PACKAGES:
        try:
            expected = metadata.version(name)
        except metadata.PackageNotFoundError:
            expected = None
        assert found.get(name) == expected, name


def test_reading_versions_imports_none_of_the_libraries():
    code = ("import sys; from gemma_doctor.readers.versions import installed; v = installed(); "
            "assert v.get('torch'); print(sorted(m for m in ('torch', 'transformers', 'peft', 'accelerate') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
