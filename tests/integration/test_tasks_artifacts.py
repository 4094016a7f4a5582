"""tasks.artifacts: artifact keys Prefect accepts (lowercase letters, digits, dashes)."""

from tasks.artifacts import artifact_key


def test_keys_are_lowercase_dashed_and_bounded():
    assert artifact_key("train", "Tiny Demo") == "train-tiny-demo"
    assert artifact_key("extract", "kimi_k2.5 (100k)", "eval") == "extract-kimi-k2-5-100k-eval"
    assert len(artifact_key("x" * 100)) == 60
