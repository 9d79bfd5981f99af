import pytest

from genshift.errors import NotFoundError
from genshift.registry import Registry
from genshift.suites import SuiteSpec, get_suite, imagenet_star_shifts, list_suites


def test_registry_is_strict():
    reg = Registry("thing")
    reg.register("alpha", 1)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("alpha", 2)
    with pytest.raises(NotFoundError, match="Did you mean 'alpha'"):
        reg.get("alpah")
    reg.freeze()
    with pytest.raises(RuntimeError, match="frozen"):
        reg.register("beta", 3)
    assert reg.names("a*") == ["alpha"]


def test_registered_suites():
    assert list_suites() == ["imagenet-star", "imagenet-star-upstream", "in-g-rn", "in-g-vit", "lance-hardimagenet"]
    star = get_suite("imagenet-star")
    assert len(star.configs) == 24 and star.configs[0] == "base" and star.reference_config == "base"
    assert set(star.configs) == {s.key for s in imagenet_star_shifts()}
    assert "at_dusk" in star.configs and "at_dusk_simple" not in star.configs
    lance = get_suite("lance-hardimagenet")
    assert lance.label_subset is not None and 837 in lance.label_subset and 836 not in lance.label_subset
    assert len(get_suite("in-g-rn").label_subset) == 200
    with pytest.raises(NotFoundError, match="Did you mean 'imagenet-star'"):
        get_suite("imagenet-sta")


def test_spec_validates_revision():
    with pytest.raises(ValueError, match="40-character commit sha"):
        SuiteSpec(id="x", title="x", repo_id="a/b", revision="main", configs=("a",), metric_family="accuracy")


def test_cli_suites(capsys):
    from genshift.cli import main
    assert main(["suites", "in-g-*"]) == 0
    out = capsys.readouterr().out
    assert "in-g-rn" in out and "in-g-vit" in out and "imagenet-star" not in out
    assert "in-g-fig4" in out and "lance-table2" not in out  # only the populations that score a listed suite
    assert main(["suites", "--json"]) == 0
    import json
    data = json.loads(capsys.readouterr().out)
    assert {d["id"] for d in data} >= {"imagenet-star", "lance-hardimagenet"}
    assert main(["suites", "nothing*"]) == 1
