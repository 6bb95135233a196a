"""The benchmark parameter sets keep their published sizes (so tables stay comparable)."""

import argparse

import pytest

from benchmarks import shapes

# (tensor count, total floats): GPT-2 small is the 124M model (124,439,808 with
# the tied wte counted once), GPT-2 XL the 1.5B one.
EXPECTED = {
    "gpt2_small": (148, 124_439_808),
    "gpt2_xl": (580, 1_557_611_200),
    "one_tensor": (1, 268_435_456),
    "many_small": (2000, 8_192_000),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_set_sizes(name):
    got = shapes.SETS[name]()
    assert (len(got), shapes.numel(got)) == EXPECTED[name]
    assert all(isinstance(s, tuple) and all(isinstance(d, int) for d in s) for s in got)


def test_registry_is_exactly_the_four_sets():
    assert set(shapes.SETS) == set(EXPECTED)


def test_gpt2_small_layout():
    got = shapes.gpt2_small()
    assert got[:2] == [(50257, 768), (1024, 768)]
    assert got[2:14] == [
        (768,), (768,), (768, 2304), (2304,), (768, 768), (768,),
        (768,), (768,), (768, 3072), (3072,), (3072, 768), (768,),
    ]  # fmt: skip
    assert got[-2:] == [(768,), (768,)]


def test_parse_sets():
    assert shapes.parse_sets("gpt2_small, many_small") == ["gpt2_small", "many_small"]
    with pytest.raises(argparse.ArgumentTypeError, match="gpt3"):
        shapes.parse_sets("gpt2_small,gpt3")
