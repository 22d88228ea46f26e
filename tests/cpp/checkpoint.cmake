# Tests of the checkpoint area: opening and validating checkpoints, loading them into
# pinned host memory and onto the sim device (includes a 1 GiB tensor: ~2 GB of disk and
# memory at peak).
pinstage_sim_gtest(test_checkpoint LABELS tensor checkpoint)

# Tensor-parallel loading: plans, slices against a reference for tp 1..8, refusals.
pinstage_sim_gtest(test_load_tp LABELS tensor checkpoint)

# Issue 41's library defects: a plan regex on a million-character name, a stale hash
# sidecar, a shard directory missing a shard, negative thread counts.
pinstage_sim_gtest(test_defects41 LABELS tensor checkpoint)

# Segment sources (issue 39): map mode (a checkpoint's page cache pinned in place through
# host_register), the pin budget's one verdict, the pool's give-back before a refusal.
pinstage_sim_gtest(test_segment_sources LABELS runtime checkpoint)

# Issue 49: the phase callback, map mode's folio census (internal to libpinstage, so its
# source is compiled in: src/checkpoint/folios.cpp), the first-touch split of a sim device
# load's alloc_s.
pinstage_sim_gtest(test_newcomer49 ${PROJECT_SOURCE_DIR}/src/checkpoint/folios.cpp
                   LABELS checkpoint)

# Issue 47 in the library: read-only memory (a map-mode load's page cache) refused as an
# OUT or INOUT argument.
pinstage_sim_gtest(test_readonly47 LABELS tensor checkpoint)

# Issue 50: the restart cache (WeightCache): the directory's checks, atomic fills, hit /
# miss / stale, two fillers, a filler killed mid-fill, a full tmpfs (mounted when allowed),
# ls / rm / prune, and a second user (setpriv) who can neither read nor plant an entry; the
# mountinfo parser (internal, so its source is compiled in).
pinstage_sim_gtest(test_cache ${PROJECT_SOURCE_DIR}/src/checkpoint/cache_mount.cpp
                   LABELS checkpoint)
target_compile_definitions(test_cache PRIVATE PINSTAGE_CLI_PATH="$<TARGET_FILE:pinstage_cli>")
add_dependencies(test_cache pinstage_cli)
