"""The runner's look-ahead (`runner.reads_ahead`): each checked layer is queued before the host
reads FastE's alignment, and thrown away at the one layer that fires. Forced on the CPU here, it
makes the same decisions and vectors as the host read before each layer and as the naive
per-sample reference; the order of the calls and the one wasted layer are counted. On a GPU the
same comparison runs on CUDA (the quick GPU step runs this file)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3VLModel

from faste_mm import Embedder, FastEConfig
from faste_mm.model.ablations import AlignmentProbe, Full, policy_for
from faste_mm.model.batching import BatchingConfig
from faste_mm.model.faste import AlignmentReading, FastE
from faste_mm.model.items import expand_items
from faste_mm.model.runner import reads_ahead, run_decoder

from tests.helpers.reference import init_vl_sample, naive_embed, serialized_items


def first_batch(embedder, inputs):
    items, _, _ = expand_items(inputs)
    batch = next(iter(embedder.prepare_batches(items, list(range(len(items))))))
    return batch.to(embedder.backbone.device)


def policy(embedder, config: FastEConfig | None, record_alignment: bool = False):
    return policy_for(embedder.resolve_fast_e(config), embedder.backbone.shape.num_layers, record_alignment)


def probe_curve(embedder, batch) -> list[float]:
    _, trace = run_decoder(embedder.backbone, batch, AlignmentProbe(), look_ahead=False)
    return [value for _, value in trace.alignment]


def threshold_at(curve: list[float], warmup: int, target: int) -> float:
    """A theta whose first crossing at or after `warmup` is exactly layer `target`."""
    before = max(curve[warmup:target], default=-1.0)
    assert curve[target] > before + 1e-3, f"tiny model's alignment curve cannot isolate layer {target}: {curve}"
    return (before + curve[target]) / 2


def assert_same_run(embedder, batch, config, record_alignment=False):
    """look-ahead on and off: bit-identical vectors, the same trigger, alignments and shapes."""
    runs = [run_decoder(embedder.backbone, batch, policy(embedder, config, record_alignment), look_ahead=ahead)
            for ahead in (False, True)]
    (sync_vectors, sync), (ahead_vectors, ahead) = runs
    assert torch.equal(sync_vectors, ahead_vectors)
    assert (ahead.trigger_layer, ahead.alignment, ahead.padded_lengths, ahead.kept_prefix_tokens) == (
        sync.trigger_layer, sync.alignment, sync.padded_lengths, sync.kept_prefix_tokens)
    return ahead


@pytest.fixture(scope="module")
def vl_batch(vl_embedder, mixed_items):
    """The mixed items' one batch and a theta that fires first before layer 3 from l_w = 1."""
    batch = first_batch(vl_embedder, mixed_items)
    return batch, threshold_at(probe_curve(vl_embedder, batch), 1, 3)


def test_look_ahead_makes_the_same_decisions_and_vectors_as_the_sync_read_and_the_naive_reference(
        vl_embedder, vl_batch, model_dirs, mixed_items):
    batch, theta = vl_batch
    last = vl_embedder.backbone.shape.num_layers - 1
    fired = assert_same_run(vl_embedder, batch, FastEConfig(r_max=0.5, warmup_layer=1, threshold=theta))
    assert fired.trigger_layer == 3 and [layer for layer, _ in fired.alignment] == [1, 2, 3]
    never = assert_same_run(vl_embedder, batch, FastEConfig(r_max=0.5, warmup_layer=1, threshold=1.0))
    assert never.trigger_layer == last and len(never.alignment) == last
    assert assert_same_run(vl_embedder, batch, FastEConfig(r_max=0.5, trigger_layer=2)).trigger_layer == 2
    probed = assert_same_run(vl_embedder, batch, None, record_alignment=True)  # calibration's curve
    assert probed.trigger_layer is None and len(probed.alignment) == last + 1

    config = FastEConfig(r_max=0.5, warmup_layer=1, threshold=theta)
    vectors, _ = run_decoder(vl_embedder.backbone, batch, policy(vl_embedder, config), look_ahead=True)
    model = Qwen3VLModel.from_pretrained(str(model_dirs["qwen3_vl"])).eval()
    with torch.no_grad():
        samples = [init_vl_sample(model, s) for s in serialized_items(vl_embedder, mixed_items)]
        expected, trigger, _ = naive_embed(list(model.language_model.layers), model.language_model.norm, samples,
                                           r_max=0.5, warmup=1, theta=theta)
    assert trigger == 3
    torch.testing.assert_close(vectors, expected[torch.tensor(batch.rows)], atol=2e-5, rtol=0)


class CountingBackbone:
    """The backbone, counting the decoder layers it runs (the runner's calls, nothing replaced)."""

    def __init__(self, backbone) -> None:
        self.backbone = backbone
        self.layers_run = 0

    def __getattr__(self, name):
        return getattr(self.backbone, name)

    def run_layer(self, *args):
        self.layers_run += 1
        return self.backbone.run_layer(*args)


class RecordingFastE(FastE):
    """FastE noting how many layers had run when each decision was read."""

    def __init__(self, fast_e: FastE, counter: CountingBackbone) -> None:
        super().__init__(fast_e.config, fast_e.num_layers, fast_e.scorer)
        self.counter = counter
        self.read_after: dict[int, int] = {}

    def decide(self, layer, state, backbone, reading):
        if reading is not None:
            self.read_after[layer] = self.counter.layers_run
        return super().decide(layer, state, backbone, reading)


@pytest.mark.parametrize("ahead", [False, True])
def test_look_ahead_queues_the_layer_before_the_read_and_wastes_only_the_firing_one(vl_embedder, vl_batch, ahead):
    batch, theta = vl_batch
    layers = vl_embedder.backbone.shape.num_layers
    for threshold, trigger in ((theta, 3), (1.0, layers - 1)):
        counter = CountingBackbone(vl_embedder.backbone)
        recording = RecordingFastE(policy(vl_embedder, FastEConfig(r_max=0.5, warmup_layer=1, threshold=threshold)), counter)
        _, trace = run_decoder(counter, batch, recording, look_ahead=ahead)
        assert trace.trigger_layer == trigger
        # ahead, layer l is already queued when its check is read; never the last layer (it always fires)
        assert recording.read_after == {l: l + (ahead and l < layers - 1) for l in range(1, trigger + 1)}
        assert counter.layers_run == layers + (ahead and trigger < layers - 1)


def test_look_ahead_is_the_cuda_default_for_policies_that_measure():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    faste = FastE(FastEConfig(r_max=0.5, warmup_layer=1, threshold=0.5), 4)
    assert (reads_ahead(faste, cpu, None), reads_ahead(faste, cuda, None)) == (False, True)
    assert reads_ahead(faste, cpu, True) and not reads_ahead(faste, cuda, False)
    assert not reads_ahead(Full(), cuda, True)  # nothing to read: the plain loop
    assert reads_ahead(AlignmentProbe(), cuda, None)


def test_bench_check_line_times_the_whole_decoder_each_way_of_reading(vl_embedder):
    from faste_mm.tools.check_cost import READS, measure_check_cost

    cost = measure_check_cost(vl_embedder, ["a red bicycle leaning on a wall", "a gray cat"], rounds=1, whole_decoder=True)
    assert set(cost.decoder_s) == {"full", *READS} and set(cost.per_layer_s) == set(READS)
    layers = len(vl_embedder.backbone.layers)
    for name in READS:
        assert cost.per_layer_s[name] == pytest.approx((cost.decoder_s[name] - cost.decoder_s["full"]) / layers)
    assert cost.check_s == cost.alone_s > 0  # a CPU: the check alone is its cost


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA read-ahead; run on a GPU machine")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_look_ahead_on_cuda_makes_the_same_decisions_and_vectors(model_dirs, mixed_items, dtype):
    embedder = Embedder.from_pretrained(str(model_dirs["qwen3_vl"]), device="cuda", dtype=dtype,
                                        batching=BatchingConfig(batch_tokens=1 << 20))
    batch = first_batch(embedder, mixed_items)
    value = torch.tensor(0.625, device="cuda") * 1.5
    assert AlignmentReading.of(value).value() == float(value)
    curve = probe_curve(embedder, batch)
    target = max(range(2, 5), key=lambda l: curve[l] - max(curve[1:l]))
    fired = assert_same_run(embedder, batch, FastEConfig(r_max=0.5, warmup_layer=1, threshold=threshold_at(curve, 1, target)))
    assert fired.trigger_layer == target
    assert assert_same_run(embedder, batch, FastEConfig(r_max=0.5, warmup_layer=1, threshold=1.0)).trigger_layer == len(curve) - 1
    assert_same_run(embedder, batch, None, record_alignment=True)
