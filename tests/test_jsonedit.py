"""The format-preserving JSON editor: only the changed line(s) differ, and the result is what was meant."""

from __future__ import annotations

import difflib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gemma_doctor.jsonedit import set_member
from tests.builders import example_file


def _changed_lines(a: str, b: str) -> list[str]:
    return [l for l in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0)
            if l[:1] in "+-" and not l.startswith(("+++", "---"))]


def test_hub_gemma3_config_gains_the_key_in_sorted_position_with_a_two_line_diff():
    before = example_file("config.json").decode()
    after = set_member(before, ("text_config", "use_cache"), False)
    assert json.loads(after)["text_config"]["use_cache"] is False
    assert _changed_lines(before, after) == ['-    "sliding_window": 1024', '+    "sliding_window": 1024,', '+    "use_cache": false']
    assert after.endswith("}\n")


def test_existing_true_is_replaced_on_its_own_line():
    before = json.dumps({"a": 1, "use_cache": True, "z": [1, 2]}, indent=2) + "\n"
    after = set_member(before, ("use_cache",), False)
    assert _changed_lines(before, after) == ['-  "use_cache": true,', '+  "use_cache": false,']


def test_insertion_keeps_sorted_order_in_the_middle():
    before = '{\n    "a": 1,\n    "z": 2\n}'
    after = set_member(before, ("use_cache",), False)
    assert after == '{\n    "a": 1,\n    "use_cache": false,\n    "z": 2\n}'


def test_unsorted_objects_get_the_key_appended():
    assert set_member('{\n  "b": 1,\n  "a": 2\n}\n', ("use_cache",), False) == '{\n  "b": 1,\n  "a": 2,\n  "use_cache": false\n}\n'


def test_compact_single_line_files_stay_single_line():
    assert set_member('{"model_type": "gemma2", "use_cache": true}', ("use_cache",), False) == '{"model_type": "gemma2", "use_cache": false}'
    assert set_member('{"a": 1}', ("use_cache",), False) == '{"a": 1, "use_cache": false}'


def test_missing_or_null_text_config_becomes_an_object():
    out = set_member('{\n  "model_type": "gemma3",\n  "vision_config": {}\n}\n', ("text_config", "use_cache"), False)
    assert out == '{\n  "model_type": "gemma3",\n  "text_config": {\n    "use_cache": false\n  },\n  "vision_config": {}\n}\n'
    out = set_member('{\n  "text_config": null\n}', ("text_config", "use_cache"), False)
    assert json.loads(out) == {"text_config": {"use_cache": False}}


def test_crlf_files_keep_crlf():
    before = '{\r\n  "a": 1,\r\n  "z": 2\r\n}\r\n'
    after = set_member(before, ("use_cache",), False)
    assert after == '{\r\n  "a": 1,\r\n  "use_cache": false,\r\n  "z": 2\r\n}\r\n'


def test_strings_with_braces_and_escapes_do_not_confuse_the_scanner():
    before = json.dumps({"a": "}{\\\"", "text_config": {"b": "\u00e9\n", "use_cache": True}}, indent=2)
    after = set_member(before, ("text_config", "use_cache"), False)
    assert json.loads(after) == {"a": "}{\\\"", "text_config": {"b": "\u00e9\n", "use_cache": False}}


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False),
                     st.text(max_size=8))
_values = st.recursive(_scalars, lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=6), c, max_size=3)),
                       max_leaves=12)
_objects = st.dictionaries(st.text(max_size=10), _values, max_size=8)


@settings(max_examples=300, deadline=None)
@given(doc=_objects, text_config=st.one_of(st.none(), _objects), indent=st.sampled_from([None, 1, 2, 4, "\t"]),
       sort=st.booleans(), nested=st.booleans())
def test_any_document_any_layout_edits_to_exactly_the_intended_document(doc, text_config, indent, sort, nested):
    if nested:
        doc = {**doc, "text_config": text_config}
    text = json.dumps(doc, indent=indent, sort_keys=sort, ensure_ascii=False)
    path = ("text_config", "use_cache") if nested else ("use_cache",)
    after = set_member(text, path, False)
    expected = json.loads(text)
    target = expected
    if nested:
        if not isinstance(target.get("text_config"), dict):
            target["text_config"] = {}
        target = target["text_config"]
    target["use_cache"] = False
    assert json.loads(after) == expected
    if indent is not None:
        # Multi-line layouts: the edit touches at most the neighbouring line and adds at most a few.
        assert len(_changed_lines(text, after)) <= 6
