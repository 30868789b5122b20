"""The value codec between the HumanEval solution's process and the checker's: exact types, bounded, strict."""

from __future__ import annotations

import math

import pytest

from harmonyrl.tasks.plain_values import MAX_DEPTH, NotPlain, decode_text, encode, encode_text


def test_plain_values_round_trip_as_fresh_objects_of_the_same_types() -> None:
    value = [1, -(10**40), (2.5, "x", None, True), {"k": {3, frozenset({4})}}, b"\x00y", 1 - 2j, {(1, 2): []}, set()]
    back = decode_text(encode_text(value))
    assert back == value and back is not value and repr(back) == repr(value)
    assert [type(v) for v in back] == [type(v) for v in value]  # type: ignore[attr-defined]
    assert type(decode_text(encode_text(True))) is bool and type(decode_text(encode_text(1))) is int
    nan, inf, neg_zero = decode_text(encode_text([math.nan, -math.inf, -0.0]))  # type: ignore[misc]
    assert math.isnan(nan) and inf == -math.inf and math.copysign(1, neg_zero) == -1


def test_equal_sets_encode_to_the_same_text() -> None:
    assert encode_text({"b", "a", "c"}) == encode_text({"c", "a", "b"}) == '["s",["a","b","c"]]'


class Int(int):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = int.__hash__


class Faker:
    __class__ = int  # type: ignore[assignment]  # isinstance(Faker(), int) is True; type() is not fooled


@pytest.mark.parametrize("value", [Int(1), Faker(), [Int(1)], {"k": Faker()}, iter([1]), (i for i in [1]), object()])
def test_anything_but_exact_builtin_types_is_refused(value: object) -> None:
    with pytest.raises(NotPlain):
        encode(value)


def test_depth_and_size_are_bounded() -> None:
    deep: list[object] = []
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(NotPlain, match="nested deeper"):
        encode(deep)
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(NotPlain, match="nested deeper"):
        encode(loop)
    with pytest.raises(NotPlain, match="longer than"):
        encode(10**5000)
    with pytest.raises(NotPlain):
        decode_text("[" * 100_000 + "]" * 100_000)  # the JSON parser's recursion, or our depth bound


@pytest.mark.parametrize(
    "text",
    ["", "1", "1.5", "NaN", '{"a": 1}', '["i", "--5"]', '["i", "5", "6"]', '["i", 5]', '["f", "0x10"]',
     '["f", "1e5000000000000000000000000000000000000000000"]', '["b", "zz"]', '["s", [["l", []]]]',
     '["d", [[["l", []], 1]]]', '["d", [[1]]]', '["q", []]', '["l", "abc"]', "[1, 2]", '["c", "1"]'],
)  # fmt: skip
def test_malformed_text_is_refused(text: str) -> None:
    with pytest.raises(NotPlain):
        decode_text(text)
