"""What a newcomer reads when something goes wrong: the dead letter of an operator that raised
names the user's line, not the library's."""

from __future__ import annotations

import json

from fissure import Pipeline
from fissure.worker.graph_local import run_local
from fissure.worker.records import describe_error, is_user_frame


def parse_payload(record):
    return json.loads(record["payload"])  # the user's line a dead letter must name


PARSE_LINE = parse_payload.__code__.co_firstlineno + 1


def test_an_operator_error_raised_in_the_standard_library_names_the_users_line():
    pipeline = Pipeline("p").map("parse", parse_payload, schema={"n": int})
    results = run_local(pipeline, [{"payload": '{"n": 1}'}, {"payload": "{not json"}])
    assert results["sink"] == [{"n": 1}]
    (letter,) = results.dead_letters
    assert letter.error.startswith("JSONDecodeError: Expecting property name enclosed in double quotes: line 1 "
                                   "column 2 (char 1)")
    assert f"(at {__file__}:{PARSE_LINE} in parse_payload; raised in decoder.py:" in letter.error


def test_without_a_user_frame_the_innermost_frame_is_named():
    try:
        json.loads("[")
    except json.JSONDecodeError as error:
        error.__traceback__ = error.__traceback__.tb_next  # drop this test's own frame
        assert error.__traceback__ is not None
        text = describe_error(error)
    assert text.startswith("JSONDecodeError: Expecting value") and "decoder.py:" in text and "raised in" not in text


def test_user_frames_are_neither_the_standard_library_nor_packages_nor_fissure():
    import fissure.worker.fused
    import pyarrow

    assert is_user_frame(__file__)
    assert not is_user_frame(json.decoder.__file__)
    assert not is_user_frame(pyarrow.__file__)
    assert not is_user_frame(fissure.worker.fused.__file__)
    assert not is_user_frame("<frozen importlib._bootstrap>")
