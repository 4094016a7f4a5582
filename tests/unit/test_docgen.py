
from support.paths import REPO

from eyas.docgen import render


def test_configuration_reference_is_current():
    doc = (REPO / "docs" / "configuration.md").read_text()
    assert doc == render(), "run: python -m eyas.docgen > docs/configuration.md"


def test_reference_lists_every_field():
    from eyas.config import MergeConfig

    text = render()
    for name in MergeConfig.model_fields:
        assert f"`{name}`" in text
