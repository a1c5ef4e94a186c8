"""The steps that launch other steps (`mlflow run` of this checkout) find the checkout's MLproject."""
from gradshare.steps import emulated, study

from tests.conftest import REPO


def test_the_launching_steps_point_at_the_checkout_with_its_mlproject():
    for module in (study, emulated):
        assert module.REPO == REPO and (module.REPO / "MLproject").is_file(), module.__name__
