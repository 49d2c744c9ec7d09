# Makes vessel/torch importable and gives every test a clean recorder.
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "vessel", "torch"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session", autouse=True)
def kernel_cache(tmp_path_factory):
    """Mimic's disk cache of generated kernels (crucible.compile(backend="cpu")) in a directory
    of the test session's, never the user's."""
    os.environ["CRUCIBLE_CACHE_DIR"] = str(tmp_path_factory.mktemp("kernel-cache"))
    yield


@pytest.fixture(autouse=True)
def clean_recorder():
    import crucible_native as crucible
    crucible.disable()
    crucible.clear()
    yield
    crucible.disable()
    crucible.clear()


@pytest.fixture
def threads():
    """ATen's thread count, given back after a test that sets it (torch.set_num_threads)."""
    import torch
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)
