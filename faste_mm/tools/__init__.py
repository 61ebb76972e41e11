"""faste_mm.tools: what measures and tunes the core: FastE threshold calibration, the speed
benchmark and its inputs, and the real checkpoints' shapes with random weights (`shapes`)."""
