
import pytest
from support.paths import REPO

from eyas.config import load_config, parse_config
from eyas.errors import ConfigError


def minimal(**over):
    raw = {"name": "t", "target": {"model": "m"}, "datasets": [{"name": "a", "source": "a.jsonl"}]}
    raw.update(over)
    return raw


def test_every_recipe_validates():
    recipes = sorted((REPO / "recipes").glob("*.yaml"))
    assert recipes, "no recipes"
    for path in recipes:
        cfg = load_config(path)
        assert cfg.datasets and cfg.source_dir == path.parent


def test_defaults_match_the_users_setup():
    cfg = parse_config(minimal())
    assert cfg.merge.max_seq_len == 8192
    assert cfg.train.max_len == 8192  # training follows the merge
    assert cfg.merged_datasets() == ["a"]
    assert cfg.datasets[0].regenerate is True


def test_field_errors_name_the_field_and_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: t\ntarget: {model: m}\ndatasets:\n  - {name: a, source: s, format: csv}\n")
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert str(bad) in str(err.value) and "datasets.0.format" in str(err.value)


def test_unknown_dataset_in_exclude_is_refused():
    with pytest.raises(ConfigError, match=r"merge.exclude names unknown datasets \['zz'\]"):
        parse_config(minimal(merge={"exclude": ["zz"]}))


def test_duplicate_names_and_unsafe_names_refused():
    with pytest.raises(ConfigError, match="repeated"):
        parse_config(minimal(datasets=[{"name": "a", "source": "x"}, {"name": "a", "source": "y"}]))
    with pytest.raises(ConfigError, match="safe folder name"):
        parse_config(minimal(datasets=[{"name": "../etc", "source": "x"}]))


def test_training_length_follows_the_merge_and_a_different_one_is_refused():
    assert parse_config(minimal(merge={"max_seq_len": 4096})).train.max_len == 4096
    assert parse_config(minimal(merge={"max_seq_len": 4096}, train={"max_len": 4096}))
    with pytest.raises(ConfigError, match=r"train.max_len \(2048\) differs from "
                                          r"merge.max_seq_len \(8192\)"):
        parse_config(minimal(train={"max_len": 2048}))


def test_typo_in_a_key_is_refused():
    with pytest.raises(ConfigError, match="max_seq_length"):
        parse_config(minimal(merge={"max_seq_length": 4096}))


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "x.yaml").write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "x.yaml")


def test_a_folder_given_as_the_config_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"is a folder; expected a pipeline YAML file"):
        load_config(tmp_path)


@pytest.mark.parametrize(("section", "yaml_text", "field"), [
    ("train", "steps: true", "train.steps"),
    ("train", "lr: .inf", "train.lr"),
    ("train", "lr: .nan", "train.lr"),
    ("extract", "shard_size: false", "extract.shard_size"),
    ("generation", "timeout_s: .inf", "generation.timeout_s"),
])
def test_numbers_are_strict_true_is_not_one_and_inf_is_not_a_number(tmp_path, section, yaml_text,
                                                                     field):
    """``steps: true`` (pydantic's lax mode reads 1) and ``lr: .inf`` are refused, naming
    the field, in every settings section."""
    path = tmp_path / "c.yaml"
    path.write_text("name: t\ntarget: {model: m}\ndatasets:\n  - {name: a, source: s}\n"
                    f"{section}:\n  {yaml_text}\n")
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(path)


def test_fields_carry_their_docstrings():
    from eyas.config import MergeConfig

    assert "training code" in MergeConfig.model_fields["max_seq_len"].description
