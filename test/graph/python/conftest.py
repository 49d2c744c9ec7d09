# Makes vessel/torch and the shared test models importable; gives every test a clean recorder.
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(ROOT, "vessel", "torch"))
sys.path.insert(0, os.path.join(ROOT, "test", "record", "python"))


@pytest.fixture(autouse=True)
def clean_recorder():
    import crucible_native as crucible
    crucible.disable()
    crucible.clear()
    yield
    crucible.disable()
    crucible.clear()
