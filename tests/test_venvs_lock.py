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


def test_the_tied_embedding_venv_is_the_test_stack_but_for_accelerate():
    """tests/test_distributed.py runs GD662's accelerate 1.14.0 as this interpreter with ACCEL_FSDP2_TIED_PACKAGES first
    on its path instead of building the ACCEL_FSDP2_TIED venv: the same run only while that venv's lock holds the test
    stack's version of every package but accelerate, and accelerate at the folder's version."""
    from packaging.utils import canonicalize_name

    def pins(lines: list[str]) -> dict[str, str]:
        return dict(venvs._pin(line) for line in (line.split("#", 1)[0].strip() for line in lines) if "==" in line)

    lock = pins(_pins(venvs.ACCEL_FSDP2_TIED))
    stack = pins(venvs.CONSTRAINTS.read_text().splitlines())
    [(name, version)] = (spec.split("==") for spec in venvs.ACCEL_FSDP2_TIED_PACKAGES)
    assert canonicalize_name(name) == "accelerate" and lock["accelerate"] == version != stack["accelerate"]
    assert {k: v for k, v in lock.items() if k != "accelerate"} == {k: stack[k] for k in lock if k != "accelerate"}
