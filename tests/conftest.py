import json
import pathlib

import pytest
import torch

GOLDEN = pathlib.Path(__file__).parent / "golden"


def load_golden(name: str):
    return json.loads((GOLDEN / name).read_text())


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield
