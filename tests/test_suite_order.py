"""The suite's own order (tests/conftest.py): the known-long modules start first, every module stays whole."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.conftest import LONGEST_FIRST, pytest_collection_modifyitems

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Item:
    """What the hook reads of a collected test."""

    nodeid: str


def test_every_module_named_longest_first_exists_once():
    # A module renamed or split would silently fall back to the short modules' place, at the end of the run.
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    assert [m for m in LONGEST_FIRST if not (ROOT / m).is_file()] == []


def test_long_modules_come_first_in_their_order_then_the_rest_by_number_of_tests_each_whole():
    first, second = LONGEST_FIRST[0], LONGEST_FIRST[1]
    ids = ["tests/test_a.py::x", "tests/test_b.py::x", "tests/test_b.py::y[1]", f"{second}::p", f"{first}::q",
           "tests/test_b.py::y[0]", f"{second}::o", "tests/test_c.py::x"]
    items = [Item(i) for i in ids]
    pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == [
        f"{first}::q", f"{second}::p", f"{second}::o",
        "tests/test_b.py::x", "tests/test_b.py::y[1]", "tests/test_b.py::y[0]",
        "tests/test_a.py::x", "tests/test_c.py::x"]
