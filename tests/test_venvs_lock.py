"""A locked venv is installed without resolving (tests/venvs.py): its lock must satisfy every package it is asked for."""

from __future__ import annotations

import pytest

from tests import venvs

VENVS = [venvs.LEGACY, venvs.V4_LATE, venvs.V5_EARLY, venvs.V4_PRE_LAYOUT, venvs.ACCEL_FSDP2_TIED]


def _pins(packages: tuple[str, ...]) -> list[str]:
    text = venvs.lock_file(packages).read_text()
    return [line for line in text.splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize("packages", VENVS, ids=lambda p: p[0])
def test_each_committed_lock_satisfies_its_venvs_pins_and_the_light_dependencies(packages):
    venvs._lock_covers(_pins(packages), (*packages, *venvs.LIGHT), venvs.lock_file(packages))


def test_a_lock_that_misses_a_package_or_pins_another_version_is_refused():
    pins = _pins(venvs.LEGACY)
    path = venvs.lock_file(venvs.LEGACY)
    with pytest.raises(RuntimeError, match="does not satisfy peft==0.11.1"):
        venvs._lock_covers([p for p in pins if not p.startswith("peft==")], venvs.LEGACY, path)
    with pytest.raises(RuntimeError, match=r"does not satisfy huggingface_hub<1.0 \(it has 1.0.0"):
        venvs._lock_covers([("huggingface_hub==1.0.0" if p.startswith("huggingface") else p) for p in pins],
                           venvs.LEGACY, path)
    with pytest.raises(RuntimeError, match="does not satisfy a-new-light-dependency"):
        venvs._lock_covers(pins, (*venvs.LEGACY, "a-new-light-dependency"), path)


def test_a_lock_line_and_an_installed_distribution_compare_by_normalised_name_and_version():
    assert venvs._pin("typing_extensions==4.16.0") == venvs._pin("Typing-Extensions==4.16.0")
    assert venvs._pin("torch==2.13.0+cpu") == ("torch", "2.13.0")
