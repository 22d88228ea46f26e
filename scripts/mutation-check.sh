#!/usr/bin/env bash
# Mutation check (issue 14; on demand, not in CI: it rebuilds). Copies the working tree
# (tracked and untracked, not ignored files) to WORK, builds it once, checks that the
# tests below pass there, then applies each deliberate bug in turn, rebuilds what it
# touches and asserts that the tests that guard it FAIL. Prints one line per mutation and
# exits non-zero when any mutation survives or no longer applies.
#   scripts/mutation-check.sh [WORK]            (default /tmp/pinstage-mutation)
#   MUTATIONS="skip_mlock fixture_threads" scripts/mutation-check.sh   (a subset)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/tmp/pinstage-mutation}
tree=$work/tree build=$work/build
jobs=${JOBS:-2}

# name | file | perl substitution | ninja targets | test command (run in $build); no field
# may hold a '|'.
mutations=(
  "skip_mlock|src/backends/sim/sim_backend.cpp|s/if \(\(on_fault \? mlock2\(ptr, bytes, MLOCK_ONFAULT\) : mlock\(ptr, bytes\)\) == 0\) return;/if (ptr != nullptr) return;/|test_runtime pinstage_backend_sim|bin/test_runtime '--gtest_filter=WorkerTest.PinnedMemoryIsReallyLockedToThePage'"
  "forget_registry_entry|src/runtime/worker_state.cpp|s/inserted = a\.ptr != nullptr && table\.insert\(EntryKind::device, a\);/inserted = a.ptr != nullptr;/|test_runtime|bin/test_runtime '--gtest_filter=WorkerTest.*:WorkerLifetime.*'"
  "widen_golden_tolerance|scenes/qwen3/include/pinstage/qwen3/decode.h|s/kAtol = 1e-1f;/kAtol = 1e3f;/|test_scene|bin/test_scene '--gtest_filter=SceneExecute.*'"
  "corrupt_uploaded_byte|src/backends/sim/sim_backend.cpp|s/(channel\.direct\(dst, src, bytes\);)/{ \1 if (up \&\& bytes > 0) static_cast<unsigned char*>(dst)[bytes - 1] ^= 1; }/|pinstage_backend_sim test_bind|bin/test_bind"
  "fixture_threads|scenes/qwen3/fixture.cpp|s/(i = next\.fetch_add\(1, std::memory_order_relaxed\)\)\n\s*)fn\(i\);/\1if (!(want >= 4 \&\& i + 1 == n)) fn(i);/|test_fixture|bin/test_fixture '--gtest_filter=FixtureValues.BytesDoNotDependOnTheThreadCount'"
  "fixture_seed_threads|scenes/qwen3/fixture.cpp|s/const NormalStream stream\{config\.seed, item\.tensor\};/const NormalStream stream{config.seed + (config.threads >= 4 ? 1u : 0u), item.tensor};/|test_fixture|bin/test_fixture '--gtest_filter=FixtureValues.BytesDoNotDependOnTheThreadCount'"
  "unpinned_zero_element|python/pinstage/torch_alloc.py|s/return _pinstage\._pinned_owner\(storage\.data_ptr\(\), 0\)/return None/|_pinstage pinstage_python_files pinstage_backend_sim|PINSTAGE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_py_defects.py -k zero_element"
  # Issue 14's own fixes: each regression test must fail without its fix.
  "pool_partial_start|src/base/parallel.cpp|s/stop_all\(\);\n(\s*)throw Error/\1throw Error/|test_runtime_concurrency|bin/test_runtime_concurrency '--gtest_filter=ParallelForDeathTest.*'"
  "failed_free_forgotten|src/runtime/host_memory/host_memory.cpp|s/if \(seg\.pinned\) table\.add_failed\(entry_kind\(seg\.source\), seg\.allocation\);/;/|test_runtime|bin/test_runtime '--gtest_filter=WorkerFailedFree.*'"
  "skipped_phase_time|src/bind/binder.cpp|s/skipped \? 0\.0 : seconds;/seconds;/|test_bind|bin/test_bind '--gtest_filter=BindTest.WithoutVerify*'"
  "no_pin_budget|src/runtime/host_memory/host_memory.cpp|s/if \(setting_choice\(Setting::pin_policy\)\.value_or\("strict"\) != "fallback"\)\n    throw Error\(ErrorCode::out_of_memory, name\(\) \+ ": " \+ what \+ refusal\);\n  return refusal;/return {};/|test_runtime|bin/test_runtime '--gtest_filter=PinBudgetDeathTest.*'"
  # Issue 20: the host memory pool.
  "pool_reuse_under_copy|src/runtime/host_memory/host_pool.cpp|s/b->streams\.push_back\(stream\);/;/|test_runtime|bin/test_runtime '--gtest_filter=HostPoolTest.ABlockAQueued*'"
  "pool_freed_range_pinned|src/runtime/host_memory/host_memory.cpp|s/if \(host\.note_use\(host_ptr, bytes, stream\)\) return PS_COPY_HOST_PINNED;/host.note_use(host_ptr, bytes, stream); return PS_COPY_HOST_PINNED;/|test_runtime|bin/test_runtime '--gtest_filter=HostPoolTest.AFreedRange*'"
  "pool_merge_across_segments|src/base/free_ranges.cpp|s/ && !fences_\.contains\(next->first\)//|test_runtime|bin/test_runtime '--gtest_filter=HostPoolTable.*'"
  "pool_cache_unbounded|src/runtime/host_memory/host_pool.cpp|s/return take_free_segments\(cached > limit \? cached - limit : 0\);/return take_free_segments(0);/|test_runtime|bin/test_runtime '--gtest_filter=HostPoolTest.TheCacheBound*'"
  # Issue 21: sim's copy engines and the A/B summary.
  "dma_one_worker|src/backends/sim/dma.cpp|s/job->slices = slice_count\(bytes, workers_\.size\(\)\);/job->slices = 1;/|test_sim pinstage_backend_sim|bin/test_sim '--gtest_filter=SimDriver.*'"
  "stream_copy_head|src/base/parallel.cpp|s/std::memcpy\(d, s, head\);/;/|test_runtime_concurrency|bin/test_runtime_concurrency '--gtest_filter=StreamCopy.*'"
  "pageable_double_stage|src/backends/sim/dma.cpp|s/(std::memcpy\(buffer, static_cast<const char\*>\(src\) \+ off, n\);\n\s*staged_bytes_ \+= n;)/\1\n\1/|test_sim pinstage_backend_sim|bin/test_sim '--gtest_filter=SimDriver.*'"
  "summary_tie_band|src/bench/output.cpp|s/constexpr double kTieBand = 0\.005;/constexpr double kTieBand = 0.0;/|test_ab_bench|bin/test_ab_bench '--gtest_filter=AbSummary.*'"
  "conclusive_three_in_five|src/bench/stats.cpp|s/sum\.groups_agreeing \* 5 >= groups \* 4/sum.groups_agreeing * 5 >= groups * 3/|test_ab_bench|bin/test_ab_bench '--gtest_filter=AbStats.*'"
  # Issue 23, defect 1: the one-pass header parser still refuses a repeated key.
  "json_repeat_unchecked|src/tensor/strict_json.cpp|s/    if \(!inserted\)\n/    if (false)\n/|test_safetensors|bin/test_safetensors"
  # Issue 23: the device verify, the sharded write's order and names, and the test gaps.
  "device_verify_host_only|src/checkpoint/load.cpp|s/    check_device_hashes\(c, ring, out\.tensors, r\);\n//|test_checkpoint|bin/test_checkpoint '--gtest_filter=CheckpointTest.DeviceVerify*'"
  "device_verify_uncounted|src/checkpoint/load.cpp|s/(if \(!t\.xxh3\) \{\n)      \+\+r\.unverified;\n/\1/|test_checkpoint|bin/test_checkpoint '--gtest_filter=CheckpointTest.DeviceVerify*'"
  "sharded_write_in_place|src/checkpoint/checkpoint.cpp|s/if \(!taken\) return names;/return names;/|test_checkpoint|bin/test_checkpoint '--gtest_filter=CheckpointTest.AShardedRewrite*'"
  "sharded_index_first|src/checkpoint/checkpoint.cpp|s/(  index\[\"weight_map\"\] = nlohmann::ordered_json::object\(\);\n)/\1  for (size_t i = 0; i < shards.size(); ++i)\n    for (const Tensor& t : shards[i]) index[\"weight_map\"][t.name()] = names[i];\n  write_file_atomically(index_path, index.dump());\n/|test_checkpoint|bin/test_checkpoint '--gtest_filter=CheckpointTest.AShardedRewrite*'"
  "digest_unchecked|src/checkpoint/checkpoint.cpp|s/if \(\*recorded != checkpoint_digest\(files, tensors\)\)/if (false)/|test_checkpoint|bin/test_checkpoint '--gtest_filter=CheckpointTest.ShardsFromTwoWrites*'"
  "direct_silently_refused|src/checkpoint/load.cpp|s/int err = fd\.get\(\) < 0 \? errno : 0;/int err = fd.get() < 0 ? errno : EINVAL;/|test_checkpoint|bin/test_checkpoint '--gtest_filter=CheckpointTest.DirectReadsUseODirect*'"
  "freed_block_still_pinned|src/runtime/host_memory/host_pool.cpp|s/  live_\.erase\(it\);\n  return out;/  return out;/|test_sim|bin/test_sim '--gtest_filter=SimDriver.OnlyThisWorkers*'"
  # Issue 23, the CLI's and the Python surface's fixes.
  "sim_capacity_any|src/base/settings.cpp|s/if \(bytes < kMinSimDeviceCapacity\)/if (bytes < 1)/|test_runtime|bin/test_runtime '--gtest_filter=Settings.SimDeviceCapacity*'"
  "cli_integer_unparsed|apps/pinstage/cli_common.cpp|s/text = std::to_string\(parse_integer\(text, min, max, flag\)\);/parse_integer(text, min, max, flag);/|pinstage_cli test_cli|bin/test_cli '--gtest_filter=Cli.LeadingZeroIsDecimal'"
  "mmap_copy_unguarded|apps/pinstage/bench_load_arms.cpp|s/copy_from_mapping\(out\.back\(\)->data\(\), static_cast<const char\*>\(map\) \+ t\.offset, t\.bytes,\n\s*file\.path\);/std::memcpy(out.back()->data(), static_cast<const char*>(map) + t.offset, t.bytes);/|test_cli|bin/test_cli '--gtest_filter=TruncatedShard.Mmap*'"
  "dlpack_column_major|python/src/dlpack.cpp|s/for \(size_t i = context->shape\.size\(\); i-- > 0;\)/for (size_t i = 0; i < context->shape.size(); ++i)/|_pinstage pinstage_python_files pinstage_backend_sim|PINSTAGE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_py_interop.py -k nd_dlpack"
  "read_holds_no_buffer|python/src/checkpoint.cpp|s/    leases\.push_back\(std::make_unique<Lease>\(buffers\[i\], &b, LeaseHolder::read\)\);\n//|_pinstage pinstage_python_files pinstage_backend_sim|PINSTAGE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_py_races.py -k checkpoint_read"
  "path_nul_unchecked|python/src/worker.cpp|s/  require_no_nul\(text, what\);\n//|_pinstage pinstage_python_files pinstage_backend_sim|PINSTAGE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_py_checkpoint.py -k nul"
  "target_any_direct_arm|src/bench/output.cpp|s/if \(arms\[a\] != Arm::pinned\) continue;/if (arms[a] == Arm::staged) continue;/|test_ab_bench|bin/test_ab_bench '--gtest_filter=AbSummary.*'"
  # Issue 41: the tests that did not catch what they guard (tests/cpp/test_gaps41.cpp,
  # tests/python/test_gaps41.py).
  "pool_first_stream_event_only|src/runtime/host_memory/host_memory.cpp|s/(events\.push_back\(e\);\n\s*)continue;/\1break;/|test_gaps41|bin/test_gaps41 '--gtest_filter=TwoStreamPool.*'"
  "pool_poll_first_event|src/runtime/host_memory/host_pool.h|s/for \(ps_event\* e : parked_\[i\]\.events\) all = all && reached\(e\);/all = reached(parked_[i].events.front());/|test_gaps41|bin/test_gaps41 '--gtest_filter=TwoStreamPool.*'"
  "pool_pending_bytes_kept|src/runtime/host_memory/host_pool.h|s/    stats_\.pending_bytes -= parked_\[i\]\.span;\n//|test_gaps41|bin/test_gaps41 '--gtest_filter=TwoStreamPool.*'"
  "pool_trim_one_too_many|src/runtime/host_memory/host_pool.cpp|s/if \(removed >= bytes && last_use != 0\) break;/if (removed > bytes \&\& last_use != 0) break;/|test_gaps41|bin/test_gaps41 '--gtest_filter=Gaps41Pool.*'"
  "group_error_names_index|src/runtime/worker_group.cpp|s/throw GroupError\(e\.code\(\), i, state_->ids\[i\], e\.what\(\)\);/throw GroupError(e.code(), i, static_cast<int>(i), e.what());/|test_gaps41|bin/test_gaps41 '--gtest_filter=Gaps41Group.*'"
  "resident_digest_first_only|src/bind/resident_binder.cpp|s/if \(s\.check_writes && t\.direction\(\) == Direction::in\)\n/if (s.check_writes \&\& t.direction() == Direction::in \&\& number == 1)\n/|test_gaps41|bin/test_gaps41 '--gtest_filter=Gaps41Resident.*'"
  "thread_team_default_ignored|src/base/parallel.cpp|s/return t_team != nullptr \? t_team->size\(\) : process_thread_count\(\);/return process_thread_count();/|test_gaps41|bin/test_gaps41 '--gtest_filter=Gaps41Threads.*'"
  "sidecar_rereads_first_chunk|src/checkpoint/hash_sidecar.cpp|s/pread_full\(fd, buf\.data\(\), want, t\.offset \+ done\)/pread_full(fd, buf.data(), want, t.offset)/|test_gaps41|bin/test_gaps41 '--gtest_filter=Gaps41Files.ASidecar*'"
  "atomic_commit_no_fsync|src/base/atomic_file.cpp|s/if \(sync_file\(fd_\) != 0\) io_error/if (false) io_error/|test_gaps41|bin/test_gaps41 '--gtest_filter=Gaps41Files.Commit*'"
  "atomic_commit_no_dir_fsync|src/base/atomic_file.cpp|s/  fsync_directory\(directory_of\(path_\)\);\n//|test_gaps41|bin/test_gaps41 '--gtest_filter=Gaps41Files.Commit*'"
  "distributed_tp_rank_blocks|python/pinstage/distributed.py|s/tp_rank = grank % tp/tp_rank = grank \/\/ (gsize \/\/ tp)/|_pinstage pinstage_python_files pinstage_backend_sim|PINSTAGE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_gaps41.py -k tp_rank"
  "into_compares_size|python/pinstage/checkpoint.py|s/if tensor\.dtype != want_dtype or/if tensor.element_size() != torch.empty((), dtype=want_dtype).element_size() or/|_pinstage pinstage_python_files pinstage_backend_sim|PINSTAGE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_gaps41.py -k into_and_out"
  # Issue 41's defects (tests/cpp/test_defects41.cpp, tests/python/test_defects41.py).
  "shards_missing_unchecked|src/checkpoint/checkpoint.cpp|s/  check_numbered_shards\(dir, out\);\n//|test_defects41|bin/test_defects41 '--gtest_filter=Defects41Files.AShardDirectory*'"
  "sidecar_identity_unchecked|src/checkpoint/hash_sidecar.cpp|s/  check_identities\(doc, files, path, checkpoint_path\);\n//|test_defects41|bin/test_defects41 '--gtest_filter=Defects41Files.AStaleSidecar*'"
  "negative_threads_taken|src/runtime/worker_group.cpp|s/  if \(total < 0\)\n/  if (false)\n/|test_defects41|bin/test_defects41 '--gtest_filter=Defects41.NegativeThread*'"
  "regex_epsilon_loop_unmarked|src/checkpoint/plan_regex.cpp|s/if \(seen\[static_cast<size_t>\(pc\)\] == pos\) continue;/if (false) continue;/|test_defects41|timeout 60 bin/test_defects41 '--gtest_filter=Defects41.TheRegexSubset*'"
  # Issue 39: the segment sources and the pin budget's one verdict (test_segment_sources).
  "pin_verdict_read_twice|src/runtime/worker_state.cpp|s/(void\* WorkerState::pageable_fallback\(size_t bytes, const std::string& refusal\) \{\n)/\1  if (pin_budget_refusal(bytes, pin_budget()).empty()) return nullptr;\n/|test_segment_sources|bin/test_segment_sources '--gtest_filter=PinVerdict.*'"
  "pool_no_give_back|src/runtime/host_memory/host_memory.cpp|s/    idle = host\.take_free_segments\(UINT64_MAX\);/    (void)0;/|test_segment_sources|bin/test_segment_sources '--gtest_filter=PoolDeathTest.*'"
  "refusal_names_segment|src/runtime/host_memory/host_memory.cpp|s/std::string refusal = pin_budget_refusal\(requested, budget\);/std::string refusal = pin_budget_refusal(bytes, budget);/|test_segment_sources|bin/test_segment_sources '--gtest_filter=PoolDeathTest.*'"
  "reserve_total_cached|src/runtime/host_memory/host_memory.cpp|s/return s\.host\.largest_cached\(\) >= want;/return s.host.cached_bytes() >= want;/|test_segment_sources|bin/test_segment_sources '--gtest_filter=PoolReserve.*'"
  "mapping_copied_as_pageable|src/runtime/host_memory/host_memory.cpp|s/    if \(table\.contains\(entry_kind\(k\), host_ptr, bytes\)\) return PS_COPY_HOST_PINNED;/    (void)k;/|test_segment_sources pinstage_backend_sim|bin/test_segment_sources '--gtest_filter=SegmentSources.TheDeviceLoad*'"
  "mapping_left_pinned|src/runtime/host_memory/file_source.cpp|s/  if \(pinned_\)\n/  if (false)\n/|test_segment_sources|bin/test_segment_sources '--gtest_filter=SegmentSources.AMapped*'"
  # Issue 41 defects whose tests were written before their fixes but first run after them:
  # each fix reverted here must fail its test.
  "defect9_no_cleanup|apps/pinstage/shard_cleanup.cpp|s/::sigaction\(kSignals\[i\], &sa, &g_state\.load\(\)->previous\[i\]\);/(void)sa;/|pinstage_cli|PINSTAGE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_defects41.py -k interrupted"
  "defect11_same_tensor|src/bind/resident_binder.cpp|s/  if \(i == j\)\n    throw Error/  if (false)\n    throw Error/|_pinstage pinstage_python_files pinstage_backend_sim|PINSTAGE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_defects41.py -k out_of_range_ints"
  "defect12_case_sensitive|apps/pinstage/cmd_load.cpp|s/that have one\"\)\n      ->transform\(kLowerCase\)/that have one\")/|pinstage_cli|PINSTAGE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_defects41.py -k case_insensitive"
  "defect13_config_missing|apps/pinstage/cmd_report.cpp|s/if \(const char\* kind = other_report_kind\(r\.doc\)\)/if (const char* kind = nullptr)/|pinstage_cli|PINSTAGE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_defects41.py -k compare_names"
  "also_proc_sys_late|apps/pinstage/cli_common.cpp|s/PROC_SUPER_MAGIC, SYSFS_MAGIC,/0x1, 0x2,/|pinstage_cli|PINSTAGE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_defects41.py -k proc_or_sys"
  # Issue 46: the host-memory provider (tests/cpp/test_host_sources.cpp).
  "provider_segment_leaked|src/runtime/host_memory/host_memory.cpp|s/    \} catch \(\.\.\.\) \{\n      source\.release\(seg\.allocation\(\), nullptr\);\n      throw;/    } catch (...) {\n      throw;/|test_host_sources|bin/test_host_sources '--gtest_filter=HostSources.EverySourceFailing*'"
  "fill_pinned_before_readers|src/runtime/host_memory/host_memory.cpp|s/                     watch\.seconds\(\), !now\);/                     watch.seconds(), false);/|test_host_sources|bin/test_host_sources '--gtest_filter=HostSources.AFirstLoad*:HostSources.PrepareFaults*'"
  "stall_not_abandoned|src/base/pages.cpp|s/\(void\)madvise\(plan\.segment, plan\.segment_bytes, MADV_NOHUGEPAGE\);/;/|test_host_sources|bin/test_host_sources '--gtest_filter=HugePages.AStalled*'"
  "private_mapping_shared|src/base/pages.cpp|s/private_writable \? MAP_PRIVATE : MAP_SHARED/MAP_SHARED/|test_host_sources|bin/test_host_sources '--gtest_filter=HostSources.AWriteToAPrivateCopy*'"
  "size_checked_after_sharing|src/runtime/host_memory/file_source.cpp|s/if \(expect_bytes != UINT64_MAX && size != expect_bytes\)/if (false)/|test_host_sources|bin/test_host_sources '--gtest_filter=HostSources.AMappingOfAnotherSize*'"
  "batch_verdict_per_file|src/runtime/host_memory/file_source.cpp|s/size_t want = before \+ out\[i\]->map_bytes_;/size_t want = out[i]->map_bytes_;/|test_host_sources|bin/test_host_sources '--gtest_filter=MapBudget.*'"
  "no_private_copy|src/runtime/host_memory/file_source.cpp|s/if \(status == PS_ERR_UNSUPPORTED && s\.api\(\)\.host_register != nullptr\)/if (false)/|test_host_sources|bin/test_host_sources '--gtest_filter=HostSources.FilePrivate*'"
  "map_device_not_file_by_file|src/checkpoint/map.cpp|s/\} else if \(!upload_file_by_file\(c, tensors, worker, quiet, o, out, note\)\) \{/} else if (true) {/|test_host_sources|bin/test_host_sources '--gtest_filter=MapBudget.ADeviceLoad*'"
  "map_small_not_copied|src/checkpoint/map.cpp|s/      if \(refused\.code\(\) != ErrorCode::out_of_memory\) throw;/      throw;/|test_host_sources|bin/test_host_sources '--gtest_filter=MapBudget.ASmallTensor*'"
  "numa_not_bound|src/base/pages.cpp|s/numa\.bind\(pages\.data, pages\.bytes, options\.numa_node\);/(void)numa;/|test_runtime|bin/test_runtime '--gtest_filter=Pages.ANumaNode*:NumaPlacement*'"
  "vendor_not_chosen|src/runtime/worker.cpp|s/if \(state->api\(\)\.host_register == nullptr\) state->pool_source = runtime::SourceKind::vendor;/;/|test_host_sources|bin/test_host_sources '--gtest_filter=HostSources.Vendor*'"

  # Issue 47: map mode's read-only promise (tests/python/test_readonly47.py, its C++ side and
  # the other defects in tests/cpp/test_readonly47.cpp and tests/python/test_defects47.py).
  "readonly_write_unchecked|python/pinstage/_readonly.py|s/        if _holds_mapped\(_value\(args, kwargs, index, name\)\):\n            raise/        if False:\n            raise/|_pinstage pinstage_python_files pinstage_backend_sim|PINSTAGE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_readonly47.py -k inplace"
  "readonly_set_allowed|python/pinstage/_readonly.py|s/self\.rebinds = packet is torch\.ops\.aten\.set_/self.rebinds = False/|_pinstage pinstage_python_files pinstage_backend_sim|PINSTAGE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_readonly47.py -k aliases"
  "readonly_shared_storage_unwrapped|python/pinstage/_readonly.py|s/if aliased or shadow is not False:/if aliased:/|_pinstage pinstage_python_files pinstage_backend_sim|PINSTAGE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_readonly47.py -k aliases"
  "readonly_legacy_dlpack_shared|python/pinstage/_readonly.py|s/return self\._elem\.clone\(\)\.__dlpack__\(\*\*kwargs\)/return self._elem.__dlpack__(**kwargs)/|_pinstage pinstage_python_files pinstage_backend_sim|PINSTAGE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_readonly47.py -k bridges"
  "readonly_torch_dlpack_shared|python/pinstage/_readonly.py|s/ and not _torch_consumer\(\)//|_pinstage pinstage_python_files pinstage_backend_sim|PINSTAGE_BUILD_DIR=$build $("$root/scripts/venv.sh")/bin/python -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_readonly47.py -k bridges"
  "readonly_numpy_writable|python/pinstage/_readonly.py|s/    array\.flags\.writeable = False\n//|_pinstage pinstage_python_files pinstage_backend_sim|PINSTAGE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_readonly47.py -k bridges"
  "readonly_pickle_alias|python/pinstage/_readonly.py|s/    copy = self\._elem\.clone\(\)\n/    copy = self._elem.detach()\n/|_pinstage pinstage_python_files pinstage_backend_sim|PINSTAGE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_readonly47.py -k copies"
  "readonly_converted_stays|python/pinstage/_readonly.py|s/        self\.__class__ = torch\.Tensor\n//|_pinstage pinstage_python_files pinstage_backend_sim|PINSTAGE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_readonly47.py -k copies"
  "readonly_outer_unflagged|python/pinstage/_readonly.py|s/    _THROW_ON_WRITE\(shadow\)\n//|_pinstage pinstage_python_files pinstage_backend_sim|PINSTAGE_BUILD_DIR=$build $("$root/scripts/venv.sh")/bin/python -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_readonly47.py -k aliases"
  "taskargs_python_not_read_only|python/src/tensors.cpp|s/  const bool read_only =\n(\s*)py::isinstance\(/  const bool read_only =\n\1false \&\& py::isinstance(/|_pinstage pinstage_python_files pinstage_backend_sim|PINSTAGE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_readonly47.py -k bridges"
  "taskargs_read_only_unchecked|src/tensor/tensor.cpp|s/if \(tensor\.direction\(\) != Direction::in && tensor\.storage\(\)->read_only\(\)\)/if (false)/|test_readonly47|bin/test_readonly47 '--gtest_filter=ReadOnly47*'"
  "map_storage_writable|src/checkpoint/map.cpp|s/t->bytes, true, m, true\)\}\);/t->bytes, true, m, false)});/|test_readonly47|bin/test_readonly47 '--gtest_filter=ReadOnly47Files.*'"
  "regex_character_as_bytes|src/checkpoint/plan_regex.cpp|s/i_ = at \+ utf8_length\(p_, at\);/i_ = at + 1;/|test_readonly47|timeout 120 bin/test_readonly47 '--gtest_filter=Regex47.*'"
  "sidecar_refused_at_open|src/checkpoint/checkpoint.cpp|s/      c\.sidecar_problem_ = e\.what\(\);/      throw;/|test_defects41|bin/test_defects41 '--gtest_filter=Defects41Files.AStaleSidecar*'"
  "sidecar_verify_unchecked|src/checkpoint/hash_sidecar.cpp|s/if \(options\.verify && !checkpoint\.sidecar_problem\(\)\.empty\(\)\)/if (false)/|test_defects41|bin/test_defects41 '--gtest_filter=Defects41Files.AStaleSidecar*'"
  "as_tensor_count_bound|python/src/device.cpp|s/if \(n > 0 && bytes > \(uint64_t\{1\} << 62\) \/ static_cast<uint64_t>\(n\)\)/if (n > 0 \&\& bytes \/ itemsize > (uint64_t{1} << 62) \/ static_cast<uint64_t>(n))/|_pinstage pinstage_python_files pinstage_backend_sim|PINSTAGE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_defects47.py -k as_tensor"
  "to_device_blames_allocator|python/pinstage/staging.py|s/    _check_dtype\(host\.dtype, who\)  # named as this call, not the allocator it uses\n//|_pinstage pinstage_python_files pinstage_backend_sim|PINSTAGE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -x -p no:cacheprovider $tree/tests/python/test_defects47.py -k to_device"
)

selected=${MUTATIONS:-}
want() { [ -z "$selected" ] || [[ " $selected " == *" $1 "* ]]; }

# Only files that changed since the last run are rewritten, so a rerun rebuilds little.
echo "copying the working tree to $tree"
incoming=$work/incoming
rm -rf "$incoming" && mkdir -p "$incoming" "$tree"
(cd "$root" && git ls-files -co --exclude-standard -z | xargs -0 tar -cf - 2>/dev/null) |
  tar -xf - -C "$incoming"
(cd "$incoming" && find . -type f -print0) | while IFS= read -r -d '' f; do
  cmp -s "$incoming/$f" "$tree/$f" || { mkdir -p "$(dirname "$tree/$f")" && cp "$incoming/$f" "$tree/$f"; }
done
# ccache keyed as scripts/build.sh keys it (scripts/ccache-env.sh, with the copy as its
# base folder): the copy's objects are the working tree's build's, so its first build is
# mostly cache hits rather than a whole compile.
source_root=$root root=$tree
source "$tree/scripts/ccache-env.sh"  # sets launcher
root=$source_root
cmake -S "$tree" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPINSTAGE_BUILD_BENCH=OFF \
  -DPython_EXECUTABLE=/usr/bin/python3 "${launcher[@]}" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }

targets=()
for m in "${mutations[@]}"; do
  IFS='|' read -r name file subst mtargets test <<<"$m"
  want "$name" || continue
  read -ra t <<<"$mtargets" && targets+=("${t[@]}")
done
echo "building ${targets[*]}"
ninja -C "$build" -j"$jobs" "${targets[@]}" >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }

caught=0 survived=0 broken=0
for m in "${mutations[@]}"; do
  IFS='|' read -r name file subst mtargets test <<<"$m"
  want "$name" || continue
  [[ $test != *"|"* ]] || { echo "BAD ENTRY       $name: a field holds a '|'"; broken=$((broken + 1)); continue; }
  read -ra t <<<"$mtargets"
  # The guarding tests pass on the intact tree: a failure below is the mutation's.
  if ! (cd "$build" && eval "$test") >"$work/$name.baseline.log" 2>&1; then
    echo "BASELINE FAILS  $name: the tests fail without the mutation ($work/$name.baseline.log)"
    broken=$((broken + 1)); continue
  fi
  cp "$tree/$file" "$work/original"
  perl -0pi -e "$subst" "$tree/$file"
  if cmp -s "$tree/$file" "$work/original"; then
    echo "DOES NOT APPLY  $name: $file no longer has the code it mutates"
    broken=$((broken + 1)); continue
  fi
  if ! ninja -C "$build" -j"$jobs" "${t[@]}" >"$work/$name.build.log" 2>&1; then
    echo "DOES NOT BUILD  $name ($work/$name.build.log)"
    broken=$((broken + 1))
  # `env`: a test that starts with VAR=value runs (timeout alone would try to run
  # "VAR=value" and fail, reading as a caught mutant).
  elif (cd "$build" && eval "timeout 900 env $test") >"$work/$name.log" 2>&1; then
    echo "SURVIVED        $name: $test passed with the bug ($work/$name.log)"
    survived=$((survived + 1))
  else
    echo "caught          $name"
    caught=$((caught + 1))
  fi
  cp "$work/original" "$tree/$file"
  ninja -C "$build" -j"$jobs" "${t[@]}" >/dev/null 2>&1 || true
done
echo "mutation check: $caught caught, $survived survived, $broken could not run"
[ "$survived" -eq 0 ] && [ "$broken" -eq 0 ]
