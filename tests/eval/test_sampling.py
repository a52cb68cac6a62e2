"""eval.sampling: one `Sampling` for server requests and offline verifies."""

from __future__ import annotations

from eval.sampling import Sampling


def test_greedy_and_names() -> None:
    assert Sampling().greedy and Sampling.of(0.0).greedy and Sampling(top_k=1).greedy
    assert Sampling.of(0.0) == Sampling(temperature=0.0, top_k=1)
    assert Sampling.of(1e-7).greedy  # SGLang's _SAMPLING_EPS
    assert Sampling.of(0.7) == Sampling(temperature=0.7)
    assert (Sampling.of(0.0).name, Sampling.of(0.7).name) == ("greedy", "t0.7")
    assert Sampling.of(0.7, max_new_tokens=8).max_new_tokens == 8


def test_trace_fields_round_trip() -> None:
    """A trace file stores `verify_params()` and is read back with `Sampling(**...)`."""
    for s in (Sampling.of(0.0), Sampling.of(0.7)):
        params = s.verify_params()
        assert list(params) == ["temperature", "top_k", "top_p"]
        assert Sampling(**params) == s


def test_sglang_params_and_seed_per_request() -> None:
    sampled = Sampling(max_new_tokens=8, temperature=0.7, top_p=0.95, seed=10, ignore_eos=True)
    assert sampled.to_sglang(3) == {
        "max_new_tokens": 8, "temperature": 0.7, "top_p": 0.95, "top_k": -1,
        "ignore_eos": True, "sampling_seed": 13,
    }  # fmt: skip
    assert "sampling_seed" not in Sampling(seed=10).to_sglang()  # greedy needs none
    shaped = Sampling.of(0.0, options='{"frequency_penalty": 0.5, "regex": "[a-z]+"}')
    assert shaped.to_sglang()["frequency_penalty"] == 0.5 and shaped.to_sglang()["regex"]
    assert shaped.name == "greedy" and "options" not in Sampling().to_sglang()


def test_verify_batch() -> None:
    batch = Sampling.of(0.7).batch(3)
    assert batch.temperature.shape == (3,) and abs(float(batch.temperature[0]) - 0.7) < 1e-6
    assert batch.top_k.tolist() == [-1] * 3 and batch.top_p.tolist() == [1.0] * 3
