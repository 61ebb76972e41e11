"""The FastE alignment check's cheap CPU path (`faste.batch_alignment`: whole-row sums less the
readout and padding, on one thread) equals the masked float64 reference on padded 16-bit batches
whatever the padding holds, leaves torch's thread count as it was, and the bench's check line
measures it."""

from __future__ import annotations

import pytest
import torch

from faste_mm.model.decoder_state import DecoderState
from faste_mm.model.faste import batch_alignment


def padded_state(seed: int, lengths: list[int], width: int, dtype: torch.dtype) -> DecoderState:
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(len(lengths), width, 64, generator=generator) + 0.3  # a shared offset: cosines far from 0
    for row, length in enumerate(lengths):
        hidden[row, length:] = 1e3 * torch.randn(width - length, 64, generator=generator)  # large garbage padding
    lengths_t = torch.tensor(lengths)
    valid = torch.arange(width)[None, :] < lengths_t[:, None]
    return DecoderState(hidden.to(dtype), None, None, valid, lengths_t, torch.arange(len(lengths)))


def reference(state: DecoderState) -> float:
    """Literally: mean prefix state (slots before the readout) in float64, cosine, batch mean."""
    values = []
    for row, length in enumerate(state.lengths.tolist()):
        h = state.hidden[row].double()
        prefix = h[: length - 1].mean(0) if length > 1 else torch.zeros_like(h[0])
        values.append(torch.nn.functional.cosine_similarity(h[length - 1], prefix, dim=0))
    return float(torch.stack(values).mean())


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("lengths, width", [([7], 7), ([9, 4, 6, 2], 9), ([1, 5], 5), ([30, 29, 3], 31)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_alignment_equals_the_masked_float64_reference(seed, lengths, width, dtype):
    state = padded_state(seed, lengths, width, dtype)
    got = float(batch_alignment(state))
    assert got == pytest.approx(reference(state), abs=2e-5)


def test_check_restores_the_thread_count():
    before = torch.get_num_threads()
    batch_alignment(padded_state(0, [5, 3], 5, torch.bfloat16))
    assert torch.get_num_threads() == before


def test_bench_check_line_times_the_check_against_a_layer(vl_embedder):
    from faste_mm.tools.check_cost import measure_check_cost

    cost = measure_check_cost(vl_embedder, ["a red bicycle leaning on a wall", "a gray cat"], rounds=3)
    assert cost.layer == min(vl_embedder.family.warmup_layer, len(vl_embedder.backbone.layers) - 1)
    assert cost.check_s > 0 and cost.layer_s > 0 and cost.share == cost.check_s / cost.layer_s
    assert cost.tokens > 0 and cost.to_dict()["share"] == cost.share
