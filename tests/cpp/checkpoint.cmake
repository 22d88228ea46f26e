# Tests of the checkpoint area: opening and validating checkpoints, loading them into
# pinned host memory and onto the sim device (includes a 1 GiB tensor: ~2 GB of disk and
# memory at peak).
pinstage_sim_gtest(test_checkpoint LABELS tensor checkpoint)

# Tensor-parallel loading: plans, slices against a reference for tp 1..8, refusals.
pinstage_sim_gtest(test_load_tp LABELS tensor checkpoint)
