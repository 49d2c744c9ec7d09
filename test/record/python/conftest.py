# Makes vessel/torch importable and gives every test a clean recorder.
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "vessel", "torch"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def clean_recorder():
    import crucible_native as crucible
    crucible.disable()
    crucible.clear()
    yield
    crucible.disable()
    crucible.clear()
