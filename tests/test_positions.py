"""posenc.functional.positions_from_mask."""

import pytest
import torch

from posenc.functional import positions_from_mask


def test_left_and_right_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    assert positions_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 0, 0], [0, 1, 2, 3, 4]]


def test_left_padded_row_gets_the_positions_of_its_unpadded_run():
    mask = torch.tensor([[False, False, False, True, True, True, True]])
    pos = positions_from_mask(mask)
    assert torch.equal(pos[0, 3:], torch.arange(4))


def test_offsets_shift_real_tokens_only():
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    assert positions_from_mask(mask, offset=10).tolist() == [[0, 10, 11], [10, 11, 12]]
    assert positions_from_mask(mask, offset=torch.tensor([5, 7])).tolist() == [[0, 5, 6], [7, 8, 9]]


def test_gaps_inside_a_row_do_not_shift_later_tokens_twice():
    assert positions_from_mask(torch.tensor([[1, 0, 1, 0, 1]])).tolist() == [[0, 0, 1, 0, 2]]


@pytest.mark.parametrize(
    "mask, kwargs, err, match",
    [
        (torch.ones(4, dtype=torch.bool), {}, ValueError, r"mask must have shape \(B, S\)"),
        (torch.ones(2, 3), {}, TypeError, "mask must be bool or integer"),
        ([[1, 1]], {}, TypeError, "mask must be a torch.Tensor"),
        (torch.ones(2, 3, dtype=torch.bool), {"offset": 1.5}, TypeError, "offset must be an int"),
        (torch.ones(2, 3, dtype=torch.bool), {"offset": torch.tensor([1, 2, 3])}, ValueError, "offset must be"),
    ],
)
def test_bad_input(mask, kwargs, err, match):
    with pytest.raises(err, match=match):
        positions_from_mask(mask, **kwargs)
