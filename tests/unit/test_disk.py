"""Sizes on disk (eyas.disk): one table of dtype sizes, one way to print sizes, one refusal."""

from __future__ import annotations

import pytest

from eyas.disk import DiskSpaceError, dtype_bytes, human_bytes, require_free


def test_dtype_bytes_by_name_and_alias():
    assert [dtype_bytes(d) for d in ("bfloat16", "bf16", "float16", "fp32", "fp8")] == [2, 2, 2, 4, 1]
    with pytest.raises(ValueError, match="expected one of"):
        dtype_bytes("int4")


def test_human_bytes_in_powers_of_1000():
    assert human_bytes(999) == "999 B"
    assert human_bytes(1500) == "1.5 kB"
    assert human_bytes(924_000_000_000) == "924.0 GB"
    assert human_bytes(5.03e12) == "5.0 TB"
    assert human_bytes(3.2e15) == "3.2 PB"


def test_refusal_names_place_figures_and_remedy():
    assert require_free(100, 110, margin=0.10, where="h", what="x", advice="a") == 110
    with pytest.raises(DiskSpaceError) as info:
        require_free(1_000_000_000, 1_050_000_000, margin=0.10, reserve_bytes=2_000_000,
                     where="gpu:/data/run", what="extraction", advice="Delete something.")
    assert str(info.value) == ("gpu:/data/run: extraction needs 1.0 GB + 10% margin + 2.0 MB "
                               "reserve = 1.1 GB, but only 1.1 GB is free. Delete something.")
