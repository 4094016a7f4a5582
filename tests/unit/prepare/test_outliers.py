"""Outlier flags: the numbers, the thresholds, and that flagging never excludes."""

from __future__ import annotations

from eyas.config import MergeConfig
from eyas.prepare.outliers import DatasetProfile, find_outliers, selected_datasets


def _users_like() -> dict[str, DatasetProfile]:
    # A1: 2,800 samples of 16,025 tokens on average, beside nine ordinary datasets
    profiles = {"A1_deepswekimi": DatasetProfile(2_800, 2_800 * 16_025, 30_000_000, 131_072)}
    for i in range(9):
        profiles[f"B{i}"] = DatasetProfile(4_100, 4_100 * (2_000 + 100 * i), 5_000_000, 8_000)
    return profiles


def test_a1_like_dataset_is_flagged_by_both_checks_with_numbers() -> None:
    (out,) = find_outliers(_users_like(), MergeConfig())
    assert out.dataset == "A1_deepswekimi"
    assert out.checks == ["token_share", "mean_len"]
    assert round(out.sample_share, 3) == round(2_800 / (2_800 + 9 * 4_100), 3)
    assert out.share_ratio > 2.5 and out.mean_len_ratio > 3
    assert out.others_median_mean_len == 2_400
    assert out.excluded is False
    assert "outlier_token_share_ratio=2.5" in out.reasons[0]
    assert "16,025" in out.reasons[1]


def test_excluded_flag_reports_the_config_and_nothing_is_dropped_by_flagging() -> None:
    profiles = _users_like()
    cfg = MergeConfig(exclude=["A1_deepswekimi"])
    assert find_outliers(profiles, cfg)[0].excluded is True
    assert find_outliers(profiles, MergeConfig(include=["B1", "B2"]))[0].excluded is True
    assert selected_datasets(list(profiles), MergeConfig()) == list(profiles)


def test_thresholds_are_respected_and_balanced_datasets_are_not_flagged() -> None:
    balanced = {f"D{i}": DatasetProfile(1_000, 1_000 * (1_500 + 300 * i), 1, 9_000) for i in range(5)}
    assert find_outliers(balanced, MergeConfig()) == []
    lax = MergeConfig(outlier_token_share_ratio=10, outlier_mean_len_ratio=10)
    assert find_outliers(_users_like(), lax) == []
    only_len = MergeConfig(outlier_token_share_ratio=10)
    assert find_outliers(_users_like(), only_len)[0].checks == ["mean_len"]


def test_fewer_than_two_non_empty_datasets_flag_nothing() -> None:
    one = {"A": DatasetProfile(10, 100_000, 5, 20_000), "B": DatasetProfile(0, 0, 0, 0)}
    assert find_outliers(one, MergeConfig()) == []
