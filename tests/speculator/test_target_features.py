"""`TargetFeatures`, the buffer of an EAGLE-3 head's target features per request: positions in
order, rows looked up by position, trimmed once fed, and kept on the features' device."""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.speculator.target_features import TargetFeatures


def test_rows_are_looked_up_by_position_and_trimmed() -> None:
    buffer = TargetFeatures()
    assert buffer.add(0, torch.arange(8.0).view(4, 2)) == 0
    assert buffer.add(2, torch.arange(8.0, 14.0).view(3, 2)) == 4  # rows 2, 3 known already
    assert buffer.add(0, torch.zeros(2, 2)) is None
    out, known = buffer.at(3, 4)
    assert known.tolist() == [True, True, False, False]
    torch.testing.assert_close(out[:2], torch.tensor([[6.0, 7.0], [12.0, 13.0]]))
    assert out[2:].abs().sum() == 0
    buffer.trim(4)
    assert buffer.start == 4 and buffer.count == 5
    trimmed, known = buffer.at(0, 2)
    assert trimmed is None and not known.any()
    with pytest.raises(ValueError, match="only 5 arrived"):
        buffer.add(7, torch.zeros(1, 2))
    with pytest.raises(ValueError, match="width"):
        buffer.add(5, torch.zeros(1, 3))


def test_features_stay_on_their_device() -> None:
    """The rows come back on the buffer's device (a head speculator on a GPU gets CUDA features
    from the link); `meta` stands in for CUDA on a CPU-only machine (it fails the same way when
    the output is allocated on the CPU: the rows land on the wrong device)."""
    buffer = TargetFeatures()
    buffer.add(0, torch.zeros(4, 8, device="meta"))
    out, known = buffer.at(1, 5)
    assert out is not None and out.device.type == "meta" and out.shape == (5, 8)
    assert known.device.type == "cpu" and known.tolist() == [True, True, True, False, False]
