"""faste_mm.model.cpu: the CPU-tuning wing, what the embedding core asks about the machine it runs
on. One line per module, what it decides and who asks:

- `machine`: the CPU's flags and model name (/proc/cpuinfo) and a device in words, without torch;
  asked by `backbones.loading` (`choose_dtype`), the decoder layer and the vision tower, every
  bench result (`bench.schema`), `faste-mm plan` and the CLI's --device/--dtype words.
- `machine_plan`: threads and batches for the machine (usable cores, torch's intra-op and inter-op
  threads, preprocessing threads, a batch's token budget; the alignment check's one thread); asked
  by `batching.BatchingConfig`, the `Embedder`, the `Reranker`, the runner and `bench threads`.
- `kernel_choice`: which kernel wins on this CPU for a shape bucket, settled by a mirrored trial on
  the real tensors and cached on disk by CPU model, flags and torch; asked by the vision tower
  (attention dtype, GELU post-op), `decoder_kernels` and `int8`.
- `decoder_kernels`: the decoder layer's MLP block and residual as three fused oneDNN calls or
  transformers' own; asked by the decoder layer (`backbones.base`).
- `int8`: whether int8 linear layers pay on this CPU (`int8_trial`) and the layers themselves
  (`Int8Linear`, `quantize_model`); asked by `backbones.loading` for `--dtype int8`, `faste-mm plan`
  and the roofline bench.

It is the floor under the core: it imports nothing of faste_mm but `errors` and itself (torch and
transformers only where a module computes), and the core's modules ask it, never the reverse
(tests/test_architecture.py). Nothing is re-exported here: `import faste_mm.model.cpu.machine`
loads no torch."""
