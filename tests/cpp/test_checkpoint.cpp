// Checkpoints: the three layouts open and list every tensor; every validation error is its
// own test naming the file and the tensor; loads into host memory and onto the (sim)
// device give back the bytes written, for every dtype, thread count and chunk size; faults
// during read and upload leave nothing allocated or locked; xxh3 catches a flipped byte.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lock_test_util.h"
#include "pinstage/checkpoint.h"
#include "pinstage/safetensors.h"
#include "pinstage/worker.h"
#include "temp_dir_test_util.h"
#include "tensor_test_util.h"

namespace pinstage {
namespace {

using test::CountingAllocator;
using test::error_of;
namespace fs = std::filesystem;

uint64_t locked_kib() { return test::vmlck_bytes() / 1024; }

// VmLck less what the worker's pool keeps cached on purpose (locked, for reuse): a failed
// load must leave nothing else locked. Where mlock is a no-op nothing is subtracted.
uint64_t locked_beyond_cache_kib(const Worker& worker) {
  const uint64_t cached = test::kVmLckTracksMlock ? worker.host_memory_stats().reserved_bytes : 0;
  return locked_kib() - cached / 1024;
}

// A raw tensor for hand-built files: any safetensors dtype.
struct Raw {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

uint64_t raw_bytes(const Raw& r) {
  uint64_t n = safetensors_dtype_size(r.dtype);
  for (int64_t d : r.shape) n *= static_cast<uint64_t>(d);
  return n;
}

// Byte `i` of tensor number `k`: differs between tensors and positions.
unsigned char byte_at(size_t k, uint64_t i) {
  return static_cast<unsigned char>((i * 2654435761u + k * 97 + (i >> 13)) >> 5);
}

std::string file_of(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i, n >>= 8) out[i] = static_cast<char>(n & 0xff);
  return out + header + data;
}

void write_bytes(const std::string& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Writes tensors `raws` (numbered from `first` for their bytes) as one safetensors file,
// with their xxh3 recorded unless `hashes` is false.
void write_raw(const std::string& path, const std::vector<Raw>& raws, size_t first = 0,
               bool hashes = true) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  std::string data;
  for (size_t k = 0; k < raws.size(); ++k) {
    const uint64_t n = raw_bytes(raws[k]);
    std::string bytes(n, '\0');
    for (uint64_t i = 0; i < n; ++i) bytes[i] = static_cast<char>(byte_at(first + k, i));
    h[raws[k].name] = {{"dtype", raws[k].dtype},
                       {"shape", raws[k].shape},
                       {"data_offsets", {data.size(), data.size() + n}}};
    if (hashes)
      h["__metadata__"][kSafetensorsXxh3Key + raws[k].name] = xxh3_hex(xxh3_64(bytes.data(), n));
    data += bytes;
  }
  write_bytes(path, file_of(h.dump(), data));
}

// Every loaded byte is the one written (tensors numbered in checkpoint order).
void expect_bytes(const std::vector<HostTensor>& tensors, size_t first = 0) {
  for (size_t k = 0; k < tensors.size(); ++k) {
    const auto* p = static_cast<const unsigned char*>(tensors[k].storage->data());
    ASSERT_EQ(tensors[k].storage->bytes(), tensors[k].info.bytes) << tensors[k].info.name;
    for (uint64_t i = 0; i < tensors[k].info.bytes; ++i)
      if (p[i] != byte_at(first + k, i)) {
        ADD_FAILURE() << tensors[k].info.name << " byte " << i;
        return;
      }
  }
}

std::vector<Raw> every_dtype() {
  return {{"bool", "BOOL", {3}},    {"u8", "U8", {5}},         {"i8", "I8", {2, 3}},
          {"i16", "I16", {7}},      {"i32", "I32", {3, 1}},    {"i64", "I64", {2}},
          {"f16", "F16", {9}},      {"bf16", "BF16", {1, 5}},  {"f32", "F32", {3}},
          {"f64", "F64", {2, 2}},   {"e4m3", "F8_E4M3", {11}}, {"e5m2", "F8_E5M2", {13}},
          {"empty", "F32", {0, 7}}, {"scalar", "F64", {}},     {"u16", "U16", {3}},
          {"u32", "U32", {2, 2}},   {"u64", "U64", {3}}};
}

class CheckpointTest : public test::TempDirTest {
 protected:
  CheckpointTest() : TempDirTest("ckpt") {}

  // Three shards of every_dtype() with an index, which `edit` may change before it is
  // written (a test of a bad index).
  std::string indexed(const std::function<void(nlohmann::ordered_json&)>& edit = {}) {
    const std::string d = path("model");
    fs::create_directories(d);
    const auto all = every_dtype();
    nlohmann::ordered_json index = {{"metadata", {{"total_size", 0}}},
                                    {"weight_map", nlohmann::ordered_json::object()}};
    for (size_t s = 0; s < 3; ++s) {
      std::vector<Raw> part;
      for (size_t k = s * 6; k < std::min(all.size(), s * 6 + 6); ++k) part.push_back(all[k]);
      const std::string shard = "model-0000" + std::to_string(s + 1) + "-of-00003.safetensors";
      write_raw(d + "/" + shard, part, s * 6);
      for (const Raw& r : part) index["weight_map"][r.name] = shard;
    }
    if (edit) edit(index);
    write_bytes(d + "/" + kCheckpointIndexName, index.dump());
    return d;
  }

  // m.safetensors of `count` U8 tensors w0, w1, ... of `bytes` each, opened.
  Checkpoint u8_file(int count, int64_t bytes) {
    std::vector<Raw> raws;
    for (int i = 0; i < count; ++i) raws.push_back({"w" + std::to_string(i), "U8", {bytes}});
    write_raw(path("m.safetensors"), raws);
    return Checkpoint::open(path("m.safetensors"));
  }
};

// The message names every given word.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& words,
                  ErrorCode code = ErrorCode::io) {
  const Error e = error_of(fn);
  EXPECT_EQ(e.code(), code) << e.what();
  for (const std::string& w : words)
    EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << "'" << w << "' in: " << e.what();
}

// Opening `file`, written as `header` and `data_bytes` zero bytes, is an Error(io) naming
// the file and every given word.
void expect_header_refused(const std::string& file, const std::string& header, size_t data_bytes,
                           std::vector<std::string> words) {
  write_bytes(file, file_of(header, std::string(data_bytes, '\0')));
  words.insert(words.begin(), fs::path(file).filename().string());
  expect_error([&] { Checkpoint::open(file); }, words);
}

TEST_F(CheckpointTest, SingleFileListsEveryTensorAndTheMetadata) {
  write_raw(path("m.safetensors"), every_dtype());
  const Checkpoint c = Checkpoint::open(path("m.safetensors"));
  EXPECT_EQ(c.layout(), CheckpointLayout::single_file);
  ASSERT_EQ(c.tensors().size(), every_dtype().size());
  const CheckpointTensor& e4 = c.get("e4m3");
  EXPECT_EQ(e4.dtype, "F8_E4M3");
  EXPECT_EQ(e4.bytes, 11u);
  EXPECT_TRUE(e4.xxh3.has_value());
  EXPECT_EQ(c.get("f64").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(c.files().size(), 1u);
  EXPECT_EQ(c.files()[0].size, fs::file_size(path("m.safetensors")));
  // Byte ranges: each tensor where its data_offsets say, in file order.
  uint64_t next = c.files()[0].data_start;
  for (const CheckpointTensor& t : c.tensors()) {
    EXPECT_EQ(t.offset, next) << t.name;
    next += t.bytes;
  }
  EXPECT_EQ(next, c.files()[0].size);
  EXPECT_EQ(c.metadata().size(), every_dtype().size());
  EXPECT_EQ(error_of([&] { c.get("nope"); }).code(), ErrorCode::not_found);
}

TEST_F(CheckpointTest, IndexedDirectoryAndPlainShardDirectoryLoadEveryDtype) {
  const std::string d = indexed();
  const Checkpoint c = Checkpoint::open(d);
  EXPECT_EQ(c.layout(), CheckpointLayout::indexed_directory);
  EXPECT_EQ(c.files().size(), 3u);
  EXPECT_EQ(c.tensors().size(), every_dtype().size());
  CheckpointLoadOptions o;
  o.verify = true;
  PageableAllocator pageable;
  const HostLoad load = load_to_host(c, pageable, o);
  expect_bytes(load.tensors);
  EXPECT_TRUE(load.report.verified);
  EXPECT_EQ(load.report.bytes, c.total_bytes());
  // The same shards without the index: a directory of *.safetensors.
  fs::remove(d + "/" + kCheckpointIndexName);
  const Checkpoint plain = Checkpoint::open(d);
  EXPECT_EQ(plain.layout(), CheckpointLayout::shard_directory);
  expect_bytes(load_to_host(plain, pageable, o).tensors);
}

TEST_F(CheckpointTest, RoundTripThroughTheShardedWriterIntoPinnedMemory) {
  PageableAllocator pageable;
  TaskArgs args;
  for (int i = 0; i < 7; ++i) {
    args.add(Tensor::empty("t" + std::to_string(i), i % 2 ? DType::bf16 : DType::f32, {i * 333 + 1},
                           Direction::in, pageable));
    auto* p = static_cast<unsigned char*>(args.at(i).data());
    for (uint64_t b = 0; b < args.at(i).nbytes(); ++b) p[b] = byte_at(i, b);
  }
  args.add(Tensor::empty("zero", DType::i32, {0}, Direction::in, pageable));
  const size_t shards = save_sharded_checkpoint(args, path("sharded"), 4000);
  EXPECT_GT(shards, 2u);
  const auto index =
      nlohmann::json::parse(read_bytes(path("sharded") + "/" + kCheckpointIndexName));
  EXPECT_EQ(index["metadata"]["total_size"], args.total_bytes());
  const Checkpoint c = Checkpoint::open(path("sharded"));
  EXPECT_EQ(c.files().size(), shards);

  Worker worker;
  worker.init("sim");
  const uint64_t locked_before = locked_kib();
  PinnedAllocator pinned(worker);
  CheckpointLoadOptions o;
  o.verify = true;
  HostLoad load = load_to_host(c, pinned, o);
  EXPECT_TRUE(load.report.verified) << "pinstage's writer records every tensor's xxh3";
  // Exactly the bytes needed are pinned: one allocation per non-empty tensor, its size.
  EXPECT_EQ(worker.stats().pinned_bytes, args.total_bytes());
  EXPECT_EQ(worker.stats().pinned_count, 7u);
  if (test::kVmLckTracksMlock)  // a sanitizer's mlock is a no-op
    EXPECT_GE(locked_kib(), locked_before + args.total_bytes() / 1024) << "really locked";
  const TaskArgs back = to_task_args(load);
  for (const Tensor& t : args) {
    const Tensor& b = back.get(t.name());
    ASSERT_EQ(b.nbytes(), t.nbytes());
    EXPECT_EQ(b.dtype(), t.dtype());
    if (t.nbytes() > 0) {
      EXPECT_EQ(std::memcmp(b.data(), t.data(), t.nbytes()), 0) << t.name();
      EXPECT_TRUE(b.pinned());
    }
  }
}

// Seven tensors numbered from `first` (their bytes tell the writes apart).
TaskArgs seven_tensors(PageableAllocator& pageable, size_t first) {
  TaskArgs args;
  for (int i = 0; i < 7; ++i) {
    args.add(Tensor::empty("t" + std::to_string(i), DType::f32, {1000}, Direction::in, pageable));
    auto* p = static_cast<unsigned char*>(args.at(i).data());
    for (uint64_t b = 0; b < args.at(i).nbytes(); ++b) p[b] = byte_at(first + i, b);
  }
  return args;
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// A rewrite over a checkpoint never touches the shards its index names until the new
// index is in: killed (SIGKILL, no cleanup) after two of seven new shards, the directory
// still opens as the old checkpoint and every byte verifies.
TEST_F(CheckpointTest, AShardedRewriteKilledMidWayLeavesTheOldCheckpointWhole) {
  PageableAllocator pageable;
  const std::string d = path("ckpt");
  ASSERT_EQ(save_sharded_checkpoint(seven_tensors(pageable, 0), d, 4000), 7u);
  const std::vector<std::string> old_names = names_in(d);
  EXPECT_EQ(old_names.front(), "model-00001-of-00007.safetensors") << "plain names when free";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    PageableAllocator mine;
    save_sharded_checkpoint(seven_tensors(mine, 100), d, 4000, [](size_t done, size_t) {
      if (done == 2) ::raise(SIGKILL);
    });
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  const Checkpoint c = Checkpoint::open(d);
  CheckpointLoadOptions o;
  o.verify = true;
  const HostLoad load = load_to_host(c, pageable, o);
  EXPECT_TRUE(load.report.verified);
  expect_bytes(load.tensors, 0);
  // A finished rewrite: new tagged names, the old shards gone, the new bytes.
  ASSERT_EQ(save_sharded_checkpoint(seven_tensors(pageable, 200), d, 4000), 7u);
  const Checkpoint n = Checkpoint::open(d);
  for (const CheckpointFile& f : n.files())
    EXPECT_EQ(std::count(old_names.begin(), old_names.end(), fs::path(f.path).filename()), 0)
        << f.path;
  for (const std::string& old : old_names)
    if (old != kCheckpointIndexName) EXPECT_FALSE(fs::exists(d + "/" + old)) << old;
  expect_bytes(load_to_host(n, pageable, o).tensors, 200);
}

// Shards from two writes, each matching its own hashes, are refused by the index's digest.
TEST_F(CheckpointTest, ShardsFromTwoWritesAreRefusedByTheIndexDigest) {
  PageableAllocator pageable;
  save_sharded_checkpoint(seven_tensors(pageable, 0), path("a"), 4000);
  save_sharded_checkpoint(seven_tensors(pageable, 300), path("b"), 4000);
  const std::string shard = "/model-00003-of-00007.safetensors";
  fs::copy_file(path("b") + shard, path("a") + shard, fs::copy_options::overwrite_existing);
  expect_error([&] { Checkpoint::open(path("a")); },
               {kCheckpointIndexName, kCheckpointDigestKey, "mix of two writes"});
  EXPECT_NO_THROW(Checkpoint::open(path("b")));
}

TEST_F(CheckpointTest, EveryThreadCountAndChunkSizeAroundTensorBoundaries) {
  // Odd sizes: 1, 3, 5, ... bytes and one of 4099 (one past a page).
  std::vector<Raw> raws;
  for (int i = 0; i < 9; ++i) raws.push_back({"u" + std::to_string(i), "U8", {2 * i + 1}});
  raws.push_back({"page_plus", "I8", {4099}});
  raws.push_back({"none", "I16", {0}});
  write_raw(path("odd.safetensors"), raws);
  const Checkpoint c = Checkpoint::open(path("odd.safetensors"));
  PageableAllocator pageable;
  for (int threads = 1; threads <= 8; ++threads) {
    for (uint64_t chunk : {1, 2, 3, 4, 5, 16, 4098, 4099, 4100, 1 << 20}) {
      SCOPED_TRACE(std::to_string(threads) + " threads, chunk " + std::to_string(chunk));
      CheckpointLoadOptions o;
      o.threads = threads;
      o.chunk_bytes = chunk;
      o.verify = true;
      const HostLoad load = load_to_host(c, pageable, o);
      expect_bytes(load.tensors);
      EXPECT_EQ(load.report.threads, threads);
      EXPECT_TRUE(load.report.verified);
    }
  }
}

TEST_F(CheckpointTest, TenThousandTinyTensorsOnHostAndDevice) {
  std::vector<Raw> raws;
  for (int i = 0; i < 10000; ++i)
    raws.push_back({"layer." + std::to_string(i) + ".w", i % 3 ? "BF16" : "U8", {i % 7}});
  write_raw(path("tiny.safetensors"), raws);
  const Checkpoint c = Checkpoint::open(path("tiny.safetensors"));
  ASSERT_EQ(c.tensors().size(), 10000u);
  PageableAllocator pageable;
  CheckpointLoadOptions o;
  o.verify = true;
  expect_bytes(load_to_host(c, pageable, o).tensors);

  Worker worker;
  worker.init("sim");
  o.ring_bytes = 4096;  // many tensors per ring buffer, and ring wrap-arounds
  const DeviceLoad dev = load_to_device(c, worker, o);
  EXPECT_TRUE(dev.report.verified);
  for (size_t k = 0; k < dev.tensors.size(); ++k) {
    const uint64_t n = dev.tensors[k].info.bytes;
    if (n == 0) continue;
    std::vector<unsigned char> back(n);
    worker.copy_to_host(back.data(), dev.tensors[k].buffer, 0, n);
    for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(back[i], byte_at(k, i)) << k;
  }
}

// load_to_device of a selection (Python's names=): only those tensors, every byte as
// written, though the tensors between them leave gaps in the file that no ring piece may
// span; a name the checkpoint lacks or one given twice is refused before anything is taken.
TEST_F(CheckpointTest, ASelectionLoadsOnlyItsTensorsAcrossGaps) {
  std::vector<Raw> raws;
  for (int i = 0; i < 60; ++i) raws.push_back({"t." + std::to_string(i), "U8", {i % 9 + 1}});
  write_raw(path("sel.safetensors"), raws);
  const Checkpoint c = Checkpoint::open(path("sel.safetensors"));
  Worker worker;
  worker.init("sim");
  CheckpointLoadOptions o;
  o.ring_bytes = 64;  // pieces of 16 bytes: several tensors each, and wrap-arounds
  o.verify = true;
  std::vector<std::string> names;
  for (int i = 59; i >= 0; i -= 3) names.push_back("t." + std::to_string(i));  // any order
  names.push_back("t.1");
  const DeviceLoad dev = load_to_device(c, worker, o, names);
  ASSERT_EQ(dev.tensors.size(), names.size());
  EXPECT_EQ(dev.report.tensors, names.size());
  EXPECT_TRUE(dev.report.verified);
  uint64_t bytes = 0;
  for (const DeviceTensor& t : dev.tensors) {
    const auto k = static_cast<size_t>(c.find(t.info.name) - c.tensors().data());
    EXPECT_TRUE(k % 3 == 2 || k == 1) << t.info.name;
    std::vector<unsigned char> back(t.info.bytes);
    worker.copy_to_host(back.data(), t.buffer, 0, t.info.bytes);
    for (uint64_t i = 0; i < t.info.bytes; ++i) ASSERT_EQ(back[i], byte_at(k, i)) << k;
    bytes += t.info.bytes;
  }
  EXPECT_EQ(dev.report.bytes, bytes);
  for (size_t k = 1; k < dev.tensors.size(); ++k)  // checkpoint order
    EXPECT_LT(dev.tensors[k - 1].info.offset, dev.tensors[k].info.offset);
  const uint64_t device_before = worker.stats().device_count;
  expect_error(
      [&] {
        load_to_device(c, worker, o, {"t.1", "nope"});
      },
      {"no tensor", "nope"}, ErrorCode::not_found);
  expect_error(
      [&] {
        load_to_device(c, worker, o, {"t.1", "t.2", "t.1"});
      },
      {"'t.1' is named twice"}, ErrorCode::invalid_argument);
  EXPECT_EQ(worker.stats().device_count, device_before);
  EXPECT_EQ(load_to_device(c, worker, o, {}).tensors.size(), 0u);
}

// Today's checkpoint sizes (issue 23, defects 1 and 2): 100,000 tensors, as many as an MoE
// checkpoint lists, open (the header parse is linear, not quadratic) and load into pinned
// memory (the pool's few mappings, not one each against vm.max_map_count) and onto the
// device, every byte as written.
TEST_F(CheckpointTest, AHundredThousandTensorsLoadIntoPinnedMemoryAndOntoTheDevice) {
  constexpr size_t kTensors = 100'000;
  std::string header = "{", data;
  for (size_t k = 0; k < kTensors; ++k) {
    const uint64_t n = k % 5;  // 0..4 bytes: zero-byte tensors too
    header.append(k ? ",\"t." : "\"t.").append(std::to_string(k));
    header.append(R"(":{"dtype":"U8","shape":[)").append(std::to_string(n));
    header.append(R"(],"data_offsets":[)").append(std::to_string(data.size())).append(",");
    header.append(std::to_string(data.size() + n)).append("]}");
    for (uint64_t i = 0; i < n; ++i) data += static_cast<char>(byte_at(k, i));
  }
  write_bytes(path("many.safetensors"), file_of(header + "}", data));
  const Checkpoint c = Checkpoint::open(path("many.safetensors"));
  ASSERT_EQ(c.tensors().size(), kTensors);

  Worker worker;
  worker.init("sim");
  PinnedAllocator pinned(worker);
  const HostLoad host = load_to_host(c, pinned, {});
  expect_bytes(host.tensors);
  for (const HostTensor& t : host.tensors)
    ASSERT_TRUE(t.info.bytes == 0 || worker.is_pinned_host(t.storage->data(), t.info.bytes))
        << t.info.name;

  CheckpointLoadOptions o;
  o.ring_bytes = 1 << 16;  // many tensors per ring buffer
  const DeviceLoad dev = load_to_device(c, worker, o);
  ASSERT_EQ(dev.tensors.size(), kTensors);
  std::vector<unsigned char> back(8);
  for (size_t k = 0; k < dev.tensors.size(); ++k) {
    const uint64_t n = dev.tensors[k].info.bytes;
    if (n == 0) continue;
    worker.copy_to_host(back.data(), dev.tensors[k].buffer, 0, n);
    for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(back[i], byte_at(k, i)) << k;
  }
}

// Word i of the big tensor: a distinct value every 64 KiB, zero between (a sparse file,
// so the test writes 128 KiB, not 1 GiB, and still sees any byte that lands elsewhere).
constexpr uint64_t kMarkEvery = 8192;  // words
uint64_t word_at(uint64_t i) { return i % kMarkEvery == 0 ? (i + 1) * 0x9E3779B97F4A7C15ull : 0; }

// Writes a safetensors file of one U8 tensor of `n` bytes (a multiple of 64 KiB) made of
// word_at(0), word_at(1), ...
void write_big(const std::string& p, uint64_t n) {
  nlohmann::ordered_json h = {{"big", {{"dtype", "U8"}, {"shape", {n}}, {"data_offsets", {0, n}}}}};
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  write_bytes(p, file_of(header, ""));
  const uint64_t start = 8 + header.size();
  ASSERT_EQ(::truncate(p.c_str(), static_cast<off_t>(start + n)), 0);
  const int fd = ::open(p.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  for (uint64_t i = 0; i < n / 8; i += kMarkEvery) {
    const uint64_t w = word_at(i);
    ASSERT_EQ(::pwrite(fd, &w, 8, static_cast<off_t>(start + i * 8)), 8);
  }
  ::close(fd);
}

TEST_F(CheckpointTest, OneGigabyteTensor) {
  const uint64_t n = uint64_t{1} << 30;
  write_big(path("big.safetensors"), n);
  const Checkpoint c = Checkpoint::open(path("big.safetensors"));
  ASSERT_EQ(c.total_bytes(), n);
  PageableAllocator pageable;
  CheckpointLoadOptions o;
  o.threads = 8;
  o.chunk_bytes = (uint64_t{8} << 20) + 1;  // chunks that do not divide the tensor
  const HostLoad load = load_to_host(c, pageable, o);
  // Every word in its place (the storage is page aligned, so words are aligned).
  const auto* p = static_cast<const uint64_t*>(load.tensors[0].storage->data());
  uint64_t wrong = 0;
  for (uint64_t i = 0; i < n / 8; ++i) wrong += p[i] != word_at(i);
  EXPECT_EQ(wrong, 0u);
}

TEST_F(CheckpointTest, DeviceLoadIsBoundedByTheRingAndOverlaps) {
  std::vector<Raw> raws;
  for (int i = 0; i < 6; ++i) raws.push_back({"w" + std::to_string(i), "F32", {300000 + i}});
  write_raw(path("m.safetensors"), raws);  // about 7 MB
  const Checkpoint c = Checkpoint::open(path("m.safetensors"));
  Worker worker;
  worker.init("sim");
  CheckpointLoadOptions o;
  o.ring_bytes = 1 << 20;  // 1 MiB for a 7 MB checkpoint
  o.verify = true;
  uint64_t peak = 0;
  o.progress = [&](uint64_t, uint64_t) { peak = std::max(peak, worker.stats().pinned_bytes); };
  const DeviceLoad dev = load_to_device(c, worker, o);
  EXPECT_EQ(dev.report.ring_pinned_bytes, uint64_t{1} << 20);
  EXPECT_LE(peak, uint64_t{1} << 20) << "pinned memory never exceeds the ring";
  EXPECT_GT(peak, 0u);
  EXPECT_EQ(dev.report.bytes, c.total_bytes());
  EXPECT_TRUE(dev.report.verified);
  // How much read time overlapped copies is timing (benchmarks measure it,
  // docs/benchmarks.md); only its range is a property of the code.
  EXPECT_GE(dev.report.overlap, 0.0);
  EXPECT_LE(dev.report.overlap, 1.0);
  EXPECT_EQ(worker.stats().pinned_count, 0u) << "the ring is gone after the load";
  EXPECT_EQ(worker.stats().device_count, raws.size());
  for (size_t k = 0; k < dev.tensors.size(); ++k) {
    std::vector<unsigned char> back(dev.tensors[k].info.bytes);
    worker.copy_to_host(back.data(), dev.tensors[k].buffer, 0, back.size());
    for (uint64_t i = 0; i < back.size(); ++i) ASSERT_EQ(back[i], byte_at(k, i)) << k << " " << i;
  }
}

TEST_F(CheckpointTest, DeviceLoadDefaultRingIs64MiB) {
  write_raw(path("m.safetensors"), every_dtype());
  Worker worker;
  worker.init("sim");
  const DeviceLoad dev = load_to_device(Checkpoint::open(path("m.safetensors")), worker);
  EXPECT_EQ(dev.report.ring_pinned_bytes, uint64_t{64} << 20);
  EXPECT_EQ(dev.report.peak_pinned_bytes, uint64_t{64} << 20);
}

// A fault while reading: the shard is truncated after the checkpoint was validated.
// The progress callback (Python's progress=): with many readers its calls still see
// `done` increase to the total; an exception it throws stops the load as a failed read
// does, with no further call and nothing left allocated.
TEST_F(CheckpointTest, ProgressIsMonotonicAndItsExceptionStopsTheLoad) {
  const Checkpoint c = u8_file(8, 1 << 16);
  Worker worker;
  worker.init("sim");
  PinnedAllocator pinned(worker);
  CheckpointLoadOptions o;
  o.threads = 8;
  o.chunk_bytes = 4096;
  std::vector<uint64_t> seen;  // calls are one at a time: no lock needed
  o.progress = [&](uint64_t done, uint64_t total) {
    EXPECT_EQ(total, c.total_bytes());
    seen.push_back(done);
  };
  expect_bytes(load_to_host(c, pinned, o).tensors);
  ASSERT_EQ(seen.size(), c.total_bytes() / 4096);
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  EXPECT_EQ(seen.back(), c.total_bytes());
  struct Stop {};
  seen.clear();
  o.progress = [&](uint64_t done, uint64_t) {
    seen.push_back(done);
    if (seen.size() == 3) throw Stop{};
  };
  EXPECT_THROW(load_to_host(c, pinned, o), Stop);
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_EQ(worker.stats().pinned_count, 0u);
  seen.clear();
  o.ring_bytes = 1 << 14;
  EXPECT_THROW(load_to_device(c, worker, o), Stop);
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_EQ(worker.stats().pinned_count, 0u);
  EXPECT_EQ(worker.stats().device_count, 0u);
}

TEST_F(CheckpointTest, ReadFaultLeavesNothingAllocatedOrLocked) {
  const Checkpoint c = u8_file(4, 1 << 20);
  ASSERT_EQ(::truncate(path("m.safetensors").c_str(), static_cast<off_t>(c.files()[0].size - 10)),
            0);
  Worker worker;
  worker.init("sim");
  const uint64_t locked = locked_kib();
  CheckpointLoadOptions o;
  o.ring_bytes = 1 << 20;
  expect_error([&] { load_to_device(c, worker, o); }, {"m.safetensors", "size changed"});
  // The same fault mid-read: the file shrinks between open and the last chunk.
  ASSERT_EQ(::truncate(path("m.safetensors").c_str(), static_cast<off_t>(c.files()[0].size)), 0);
  o.progress = [&](uint64_t done, uint64_t) {
    if (done > (2u << 20)) ::truncate(path("m.safetensors").c_str(), 100);
  };
  expect_error([&] { load_to_device(c, worker, o); }, {"m.safetensors", "ended"});
  EXPECT_EQ(worker.stats().pinned_count, 0u);
  EXPECT_EQ(worker.stats().device_count, 0u);
  EXPECT_EQ(locked_beyond_cache_kib(worker), locked);
  // Into pinned host memory: nothing stays pinned either.
  ASSERT_EQ(::truncate(path("m.safetensors").c_str(), static_cast<off_t>(c.files()[0].size)), 0);
  PinnedAllocator pinned(worker);
  o.threads = 1;
  o.chunk_bytes = 1 << 18;
  expect_error([&] { load_to_host(c, pinned, o); }, {"m.safetensors", "ended"});
  EXPECT_EQ(worker.stats().pinned_count, 0u);
  EXPECT_EQ(locked_beyond_cache_kib(worker), locked);
}

TEST_F(CheckpointTest, UploadFaultLeavesNothingAllocatedOrLocked) {
  const Checkpoint c = u8_file(4, 1 << 20);
  Worker worker;
  worker.init("sim");
  const uint64_t locked = locked_kib();
  CheckpointLoadOptions o;
  o.ring_bytes = 1 << 20;
  for (uint64_t nth : {1, 3, 6}) {
    SCOPED_TRACE(nth);
    worker.inject_fault(FaultKind::copy_h2d, nth);
    EXPECT_NE(error_of([&] { load_to_device(c, worker, o); }).code(), ErrorCode::io);
    EXPECT_EQ(worker.stats().pinned_count, 0u);
    EXPECT_EQ(worker.stats().device_count, 0u);
    EXPECT_EQ(locked_beyond_cache_kib(worker), locked);
  }
  worker.inject_fault(FaultKind::copy_h2d, 0);
  worker.inject_fault(FaultKind::device_malloc, 3);
  EXPECT_NE(error_of([&] { load_to_device(c, worker, o); }).code(), ErrorCode::io);
  EXPECT_EQ(worker.stats().device_count, 0u);
  worker.inject_fault(FaultKind::device_malloc, 0);
  EXPECT_EQ(load_to_device(c, worker, o).tensors.size(), 4u) << "the next load succeeds";
}

TEST_F(CheckpointTest, ChecksumCatchesOneFlippedByteAndNamesTheTensor) {
  write_raw(path("m.safetensors"), every_dtype());
  const Checkpoint c = Checkpoint::open(path("m.safetensors"));
  std::string bytes = read_bytes(path("m.safetensors"));
  const CheckpointTensor& t = c.get("f64");
  bytes[t.offset + 17] ^= 0x01;
  write_bytes(path("m.safetensors"), bytes);
  PageableAllocator pageable;
  CheckpointLoadOptions o;
  EXPECT_NO_THROW(load_to_host(c, pageable, o)) << "no check unless asked";
  o.verify = true;
  expect_error([&] { load_to_host(c, pageable, o); }, {"'f64'", "m.safetensors", "integrity"});
  Worker worker;
  worker.init("sim");
  expect_error([&] { load_to_device(c, worker, o); }, {"'f64'", "integrity"});
  EXPECT_EQ(worker.stats().device_count, 0u);
}

TEST_F(CheckpointTest, VerifyWithoutRecordedHashesIsRefusedBeforeAnyReadUnlessIfPresent) {
  write_raw(path("m.safetensors"), every_dtype(), 0, false);
  const Checkpoint c = Checkpoint::open(path("m.safetensors"));
  Worker worker;
  worker.init("sim");
  PinnedAllocator pinned(worker);
  CheckpointLoadOptions o;
  o.verify = true;
  const std::string n = std::to_string(every_dtype().size());
  const std::vector<std::string> words = {"m.safetensors",       n + " of " + n,
                                          "no recorded xxh3-64", "'bool'",
                                          "verify_if_present",   "--verify=if-present"};
  expect_error([&] { load_to_host(c, pinned, o); }, words, ErrorCode::invalid_argument);
  EXPECT_EQ(worker.host_memory_stats().num_host_alloc, 0u) << "refused before any memory was taken";
  expect_error([&] { load_to_device(c, worker, o); }, words, ErrorCode::invalid_argument);
  EXPECT_EQ(worker.stats().device_count, 0u);
  o.verify_if_present = true;
  const HostLoad load = load_to_host(c, pinned, o);
  EXPECT_FALSE(load.report.verified);
  EXPECT_EQ(load.report.unverified, every_dtype().size());
  expect_bytes(load.tensors);
}

// A shard directory: one shard with hashes, one without. The device load checks the first
// (on the device, by read-back) and counts the second.
TEST_F(CheckpointTest, DeviceVerifyReadsBackWhatItChecksAndCountsTheRest) {
  const std::string d = path("model");
  fs::create_directories(d);
  const std::vector<Raw> all = every_dtype();
  const std::vector<Raw> hashed(all.begin(), all.begin() + 6), bare(all.begin() + 6, all.end());
  write_raw(d + "/a.safetensors", hashed, 0, true);
  write_raw(d + "/b.safetensors", bare, 6, false);
  const Checkpoint c = Checkpoint::open(d);
  uint64_t hashed_bytes = 0;
  for (const Raw& r : hashed) hashed_bytes += raw_bytes(r);
  Worker worker;
  worker.init("sim");
  CheckpointLoadOptions o;
  o.verify = true;
  o.verify_if_present = true;
  o.ring_bytes = 4096;
  const DeviceLoad load = load_to_device(c, worker, o);
  EXPECT_EQ(load.report.unverified, bare.size());
  EXPECT_FALSE(load.report.verified);
  EXPECT_EQ(load.report.verify_readback_bytes, hashed_bytes);
  o.verify_if_present = false;
  expect_error([&] { load_to_device(c, worker, o); },
               {std::to_string(bare.size()) + " of " + std::to_string(all.size()), "'f16'"},
               ErrorCode::invalid_argument);
}

// The nth upload flips a byte on the device after the host side hashed clean: only a
// check of what arrived sees it.
TEST_F(CheckpointTest, DeviceVerifyCatchesACopyThatDamagedBytesOnTheDevice) {
  const Checkpoint c = u8_file(3, 64 << 10);
  Worker worker;
  worker.init("sim");
  CheckpointLoadOptions o;
  o.ring_bytes = 128 << 10;  // two buffers of one tensor each
  o.ring_buffers = 2;
  worker.inject_fault(FaultKind::corrupt_h2d, 2);
  {
    const DeviceLoad load = load_to_device(c, worker, o);  // no check: the damage is silent
    std::string back(64 << 10, '\0');
    worker.copy_to_host(back.data(), load.tensors[1].buffer, 0, back.size());
    EXPECT_NE(xxh3_64(back.data(), back.size()), *c.tensors()[1].xxh3) << "the fault took effect";
  }
  worker.inject_fault(FaultKind::corrupt_h2d, 2);
  o.verify = true;
  expect_error([&] { load_to_device(c, worker, o); },
               {"'w1'", "arrived damaged on the device", "read back"});
  EXPECT_EQ(worker.stats().device_count, 0u) << "released on the error";
  worker.inject_fault(FaultKind::corrupt_h2d, 0);
  EXPECT_TRUE(load_to_device(c, worker, o).report.verified);
}

// Every open descriptor of this process.
size_t open_fds() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// A shard that changed size fails the reads that need it, without leaking a descriptor,
// and does not fail reads of the other shards.
TEST_F(CheckpointTest, AShardThatChangedSizeFailsOnlyItsOwnReadsAndLeaksNoDescriptor) {
  const std::string d = indexed();
  const Checkpoint c = Checkpoint::open(d);
  const std::string third = d + "/model-00003-of-00003.safetensors";
  ASSERT_EQ(::truncate(third.c_str(), static_cast<off_t>(c.files()[2].size + 1)), 0);
  PageableAllocator pageable;
  const CheckpointTensor& first = c.get("bool");   // in shard 1
  const CheckpointTensor& last = c.get("scalar");  // in shard 3
  std::string a(first.bytes, '\0'), b(last.bytes, '\0');
  EXPECT_NO_THROW(read_checkpoint(c, {{&first, a.data()}}));
  EXPECT_EQ(static_cast<unsigned char>(a[1]), byte_at(0, 1));
  const size_t fds = open_fds();
  for (int round = 0; round < 3; ++round)
    expect_error(
        [&] {
          read_checkpoint(c, {{&first, a.data()}, {&last, b.data()}});
        },
        {"model-00003-of-00003.safetensors", "size changed"});
  EXPECT_EQ(open_fds(), fds) << "every descriptor opened before the failure was closed";
}

TEST_F(CheckpointTest, DirectReadsWorkOrFallBackWithAMessage) {
  std::vector<Raw> raws = every_dtype();
  raws.push_back({"big", "U8", {3 << 20}});
  write_raw(path("m.safetensors"), raws);
  const Checkpoint c = Checkpoint::open(path("m.safetensors"));
  PageableAllocator pageable;
  CheckpointLoadOptions o;
  o.direct = true;
  o.verify = true;
  o.chunk_bytes = 1 << 20;
  const HostLoad load = load_to_host(c, pageable, o);
  expect_bytes(load.tensors);
  if (load.report.direct) {
    EXPECT_TRUE(load.report.direct_note.empty());
  } else {
    EXPECT_NE(load.report.direct_note.find("O_DIRECT"), std::string::npos);
  }
  std::printf("O_DIRECT here: %s %s\n", load.report.direct ? "used" : "refused",
              load.report.direct_note.c_str());
  Worker worker;
  worker.init("sim");
  o.ring_bytes = 1 << 20;
  EXPECT_TRUE(load_to_device(c, worker, o).report.verified);
}

// The O_DIRECT flag of the open descriptors of `file`, read from /proc/self/fdinfo while
// a load runs: what the kernel was asked for, not what the report claims.
bool some_fd_of_file_is_direct(const std::string& file) {
  const std::string want = fs::canonical(file).string();
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (fs::read_symlink(e.path(), ec).string() != want) continue;
    std::ifstream info("/proc/self/fdinfo/" + e.path().filename().string());
    std::string key;
    unsigned long flags = 0;
    while (info >> key)
      if (key == "flags:") info >> std::oct >> flags;
    if ((flags & O_DIRECT) != 0) return true;
  }
  return false;
}

// Whether this file system takes O_DIRECT reads of `file` (the test's own probe).
bool file_system_takes_o_direct(const std::string& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) return false;
  void* probe = std::aligned_alloc(4096, 4096);
  const bool ok = ::pread(fd, probe, 4096, 0) >= 0;
  std::free(probe);
  ::close(fd);
  return ok;
}

TEST_F(CheckpointTest, DirectReadsUseODirectWhereTheFileSystemTakesIt) {
  write_raw(path("m.safetensors"), {{"big", "U8", {3 << 20}}});
  const Checkpoint c = Checkpoint::open(path("m.safetensors"));
  PageableAllocator pageable;
  CheckpointLoadOptions o;
  o.direct = true;
  o.threads = 1;
  o.chunk_bytes = 1 << 20;
  bool seen_direct = false;
  o.progress = [&](uint64_t, uint64_t) {
    seen_direct = seen_direct || some_fd_of_file_is_direct(path("m.safetensors"));
  };
  const HostLoad load = load_to_host(c, pageable, o);
  expect_bytes(load.tensors);
  EXPECT_EQ(load.report.direct, file_system_takes_o_direct(path("m.safetensors")))
      << load.report.direct_note;
  EXPECT_EQ(seen_direct, load.report.direct) << "the descriptor really is O_DIRECT";
}

// The O_DIRECT bounce buffers belong to the load: none stays allocated after it.
TEST_F(CheckpointTest, DirectReadsKeepNoBounceBufferAfterTheLoad) {
  write_raw(path("m.safetensors"), {{"big", "U8", {16 << 20}}});
  const Checkpoint c = Checkpoint::open(path("m.safetensors"));
  Worker worker;
  worker.init("sim");
  PinnedAllocator pinned(worker);  // the tensor's own bytes are not malloc's
  CheckpointLoadOptions o;
  o.direct = true;
  o.threads = 1;  // the caller's own thread reads
  o.chunk_bytes = 8 << 20;
  const auto in_use = [] {  // bytes malloc has handed out, from its heap and mmapped blocks
    const struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
  };
#if defined(PINSTAGE_TEST_SANITIZED)
  GTEST_SKIP() << "a sanitizer's allocator: glibc's malloc statistics do not see it";
#endif
  const size_t before = in_use();
  size_t during = 0;
  o.progress = [&](uint64_t, uint64_t) { during = std::max(during, in_use()); };
  const HostLoad load = load_to_host(c, pinned, o);
  if (!load.report.direct) GTEST_SKIP() << load.report.direct_note;
  EXPECT_GE(during, before + (4u << 20)) << "the bounce buffer was seen during the load";
  EXPECT_LT(in_use(), before + (1u << 20)) << "and is freed after it";
}

// A FIFO where a shard or the index should be fails at once; reading it would block.
TEST_F(CheckpointTest, AFifoListedAsAShardOrIndexIsRefusedWithoutBlocking) {
  const std::string d = indexed();
  const std::string shard = d + "/model-00002-of-00003.safetensors";
  fs::remove(shard);
  ASSERT_EQ(::mkfifo(shard.c_str(), 0600), 0);
  expect_error([&] { Checkpoint::open(d); }, {"model-00002-of-00003.safetensors", "a FIFO"});
  const std::string index = d + "/" + kCheckpointIndexName;
  fs::remove(index);
  ASSERT_EQ(::mkfifo(index.c_str(), 0600), 0);
  expect_error([&] { Checkpoint::open(d); }, {kCheckpointIndexName, "a FIFO"});
  expect_error([&] { read_safetensors_layout(shard); }, {"a FIFO"});
}

TEST_F(CheckpointTest, AnIndexOverItsLimitIsRefusedBeforeItIsRead) {
  const std::string d = indexed();
  const std::string index = d + "/" + kCheckpointIndexName;
  // Sparse: the size alone refuses it, so the 64 MiB + 1 are never allocated or read.
  ASSERT_EQ(::truncate(index.c_str(), static_cast<off_t>(kCheckpointMaxIndexBytes + 1)), 0);
  expect_error([&] { Checkpoint::open(d); },
               {kCheckpointIndexName,
                "cannot read the index: it is 67108865 bytes, over the "
                "67108864-byte limit"});
}

TEST_F(CheckpointTest, BadOptionsAreRefusedBeforeAnyWork) {
  write_raw(path("m.safetensors"), every_dtype());
  const Checkpoint c = Checkpoint::open(path("m.safetensors"));
  CountingAllocator alloc;
  for (auto set : std::vector<std::function<void(CheckpointLoadOptions&)>>{
           [](auto& o) { o.threads = -1; }, [](auto& o) { o.threads = 100000; },
           [](auto& o) { o.chunk_bytes = 0; }}) {
    CheckpointLoadOptions o;
    set(o);
    EXPECT_EQ(error_of([&] { load_to_host(c, alloc, o); }).code(), ErrorCode::invalid_argument);
  }
  EXPECT_EQ(alloc.calls(), 0);
  Worker worker;
  worker.init("sim");
  CheckpointLoadOptions o;
  o.ring_buffers = 1;
  expect_error([&] { load_to_device(c, worker, o); }, {"2 buffers"}, ErrorCode::invalid_argument);
  EXPECT_EQ(worker.stats().device_count, 0u);
}

// ---- validation: each error its own test, naming the file and the tensor ----

TEST_F(CheckpointTest, MissingShard) {
  const std::string d = indexed();
  fs::remove(d + "/model-00002-of-00003.safetensors");
  expect_error([&] { Checkpoint::open(d); }, {"model-00002-of-00003.safetensors", "missing"});
}

TEST_F(CheckpointTest, TruncatedShard) {
  const std::string d = indexed();
  const std::string shard = d + "/model-00003-of-00003.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 3);
  expect_error([&] { Checkpoint::open(d); }, {"model-00003-of-00003.safetensors", "truncated"});
}

TEST_F(CheckpointTest, IndexPutsATensorInTheWrongShard) {
  const std::string d =
      indexed([](auto& index) { index["weight_map"]["u8"] = "model-00002-of-00003.safetensors"; });
  expect_error([&] { Checkpoint::open(d); },
               {"model-00001-of-00003.safetensors", "'u8'", "model-00002-of-00003"});
}

TEST_F(CheckpointTest, ShardHoldsATensorTheIndexDoesNotList) {
  const std::string d = indexed([](auto& index) { index["weight_map"].erase("i16"); });
  expect_error([&] { Checkpoint::open(d); }, {"'i16'", "does not match the index"});
}

TEST_F(CheckpointTest, IndexListsATensorNoShardHolds) {
  const std::string d = indexed(
      [](auto& index) { index["weight_map"]["ghost"] = "model-00001-of-00003.safetensors"; });
  expect_error([&] { Checkpoint::open(d); }, {"'ghost'", "model-00001-of-00003", "does not hold"});
}

TEST_F(CheckpointTest, TensorListedTwiceInTheIndex) {
  const std::string d = indexed();
  std::string text = read_bytes(d + "/" + kCheckpointIndexName);
  text.replace(text.find("\"weight_map\":{") + 14, 0,
               "\"u8\":\"model-00001-of-00003.safetensors\",");
  write_bytes(d + "/" + kCheckpointIndexName, text);
  expect_error([&] { Checkpoint::open(d); }, {kCheckpointIndexName, "repeats", "'u8'"});
}

TEST_F(CheckpointTest, TensorListedTwiceInTwoShards) {
  write_raw(path("a.safetensors"), {{"x", "F32", {2}}, {"y", "F32", {1}}});
  write_raw(path("b.safetensors"), {{"y", "F32", {1}}});
  expect_error([&] { Checkpoint::open(dir_.string()); },
               {"'y'", "listed twice", "a.safetensors", "b.safetensors"});
}

// find is the name index built at open: every name finds its own record (also in a copy,
// whose records are its own), a missing name finds nothing, and a name given twice is
// still refused at open, in one file (the strict header parser) or in two.
TEST_F(CheckpointTest, FindReturnsEveryTensorByItsNameAndNothingForAMissingOne) {
  const Checkpoint c = Checkpoint::open(indexed());
  ASSERT_EQ(c.tensors().size(), every_dtype().size());
  for (const CheckpointTensor& t : c.tensors()) {
    EXPECT_EQ(c.find(t.name), &t) << t.name;
    EXPECT_EQ(&c.get(t.name), &t) << t.name;
  }
  using std::string_view_literals::operator""sv;
  for (const std::string_view missing : {"nope"sv, ""sv, "f"sv, "f32 "sv, "F32"sv, "u8\0"sv})
    EXPECT_EQ(c.find(missing), nullptr) << missing;
  EXPECT_EQ(error_of([&] { c.get("nope"); }).code(), ErrorCode::not_found);
  const Checkpoint copy = c;
  for (size_t i = 0; i < copy.tensors().size(); ++i)
    EXPECT_EQ(copy.find(copy.tensors()[i].name), &copy.tensors()[i]);

  const Checkpoint many = u8_file(5000, 1);
  for (size_t i = 0; i < many.tensors().size(); ++i)
    ASSERT_EQ(many.find("w" + std::to_string(i))->name, "w" + std::to_string(i));
  EXPECT_EQ(many.find("w5000"), nullptr);

  expect_header_refused(path("m.safetensors"),
                        R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                        R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                        8, {"repeats the key", "'a'"});
}

TEST_F(CheckpointTest, OverlappingData) {
  expect_header_refused(path("m.safetensors"),
                        R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                        8, {"'b'", "overlap"});
}

TEST_F(CheckpointTest, OutOfRangeData) {
  expect_header_refused(path("m.safetensors"),
                        R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8,
                        {"'a'", "past the end"});
}

TEST_F(CheckpointTest, UnknownDtype) {
  expect_header_refused(path("m.safetensors"),
                        R"({"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16,
                        {"'a'", "unknown dtype 'F128'"});
}

TEST_F(CheckpointTest, HeaderTooLarge) {
  ASSERT_TRUE(test::write_claimed_header(path("m.safetensors"), uint64_t{101} << 20));
  expect_error([&] { Checkpoint::open(path("m.safetensors")); }, {"m.safetensors", "100 MiB"});
}

TEST_F(CheckpointTest, HeaderNestedTooDeeply) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  write_bytes(path("m.safetensors"),
              file_of(R"({"a":{"dtype":"F32","shape":)" + deep + R"(,"data_offsets":[0,0]}})", ""));
  const Error e = error_of([&] { Checkpoint::open(path("m.safetensors")); });
  EXPECT_NE(std::string(e.what()).find("nests deeper than 32"), std::string::npos) << e.what();
  EXPECT_LT(std::string(e.what()).size(), 400u);
}

TEST_F(CheckpointTest, IndexNestedTooDeeply) {
  const std::string d = indexed();
  write_bytes(d + "/" + kCheckpointIndexName,
              R"({"metadata":{"x":)" + std::string(100000, '[') + std::string(100000, ']') + "}}");
  expect_error([&] { Checkpoint::open(d); }, {kCheckpointIndexName, "nests deeper"});
}

TEST_F(CheckpointTest, IndexShardOutsideTheDirectory) {
  const std::string d = indexed();
  write_bytes(d + "/" + kCheckpointIndexName,
              R"({"weight_map":{"u8":"../model-00001-of-00003.safetensors"}})");
  expect_error([&] { Checkpoint::open(d); }, {"'u8'", "not a plain"});
}

TEST_F(CheckpointTest, ConflictingMetadataBetweenShards) {
  write_raw(path("a.safetensors"), {{"x", "F32", {2}}}, 0, false);
  write_raw(path("b.safetensors"), {{"y", "F32", {1}}}, 0, false);
  // Rewrite both with a "format" that differs.
  for (const char* f : {"a", "b"}) {
    std::string bytes = read_bytes(path(std::string(f) + ".safetensors"));
    const std::string header = bytes.substr(8, bytes.size() - 8 - (f[0] == 'a' ? 8 : 4));
    auto h = nlohmann::ordered_json::parse(header);
    h["__metadata__"] = {{"format", f[0] == 'a' ? "pt" : "np"}};
    write_bytes(path(std::string(f) + ".safetensors"),
                file_of(h.dump(), bytes.substr(8 + header.size())));
  }
  expect_error([&] { Checkpoint::open(dir_.string()); },
               {"'format'", "a.safetensors", "b.safetensors"});
}

TEST_F(CheckpointTest, EmptyDirectoryAndMissingPath) {
  expect_error([&] { Checkpoint::open(dir_.string()); }, {"neither", kCheckpointIndexName});
  expect_error([&] { Checkpoint::open(path("nope")); }, {"nope", "no such"});
}

TEST_F(CheckpointTest, IndexParserRefusesUnknownKeysAndBadValues) {
  expect_error([] { parse_checkpoint_index(R"({"weight_map":{},"x":1})", "i"); },
               {"unknown key 'x'"});
  expect_error([] { parse_checkpoint_index(R"({"metadata":{}})", "i"); }, {"no \"weight_map\""});
  expect_error([] { parse_checkpoint_index(R"({"weight_map":{"a":3}})", "i"); }, {"'a'"});
  expect_error(
      [] { parse_checkpoint_index(R"({"weight_map":{"a\u0000b":"x.safetensors"}})", "i"); },
      {"NUL"});
  expect_error([] { parse_checkpoint_index("\xEF\xBB\xBF{\"weight_map\":{}}", "i"); },
               {"byte-order mark"});
  // A raw NUL ends nlohmann's input: what follows it must not be ignored.
  using namespace std::string_view_literals;
  expect_error([] { parse_checkpoint_index("{\"weight_map\":{}}\0junk"sv, "i"); },
               {"NUL byte at offset 17"});
  expect_error([] { parse_safetensors_header("{}\0{\"a\":1}"sv, 0, "h"); },
               {"NUL byte at offset 2"});
  expect_error([] { parse_checkpoint_index(R"({"metadata":{"n":null},"weight_map":{}})", "i"); },
               {"metadata 'n'", "null"});
  const CheckpointIndex ok = parse_checkpoint_index(
      R"({"metadata":{"total_size":12,"n":"x"},"weight_map":{"a":"s.safetensors"}})", "i");
  EXPECT_NE(std::find(ok.metadata.begin(), ok.metadata.end(),
                      std::pair<std::string, std::string>{"total_size", "12"}),
            ok.metadata.end());
  EXPECT_EQ(ok.weight_map[0].second, "s.safetensors");
}

// ---- The hash sidecar (pinstage hash) ----

TEST_F(CheckpointTest, AHashSidecarMakesAnUnhashedCheckpointVerifiable) {
  const std::string f = path("hf.safetensors");
  write_raw(f, {{"a", "F32", {300, 7}}, {"b", "BF16", {5}}, {"c", "U8", {0}}}, 0, false);
  CheckpointLoadOptions verify;
  verify.verify = true;
  PageableAllocator pageable;
  EXPECT_THROW(load_to_host(Checkpoint::open(f), pageable, verify), Error);  // no hashes yet
  const HashReport r = hash_checkpoint(Checkpoint::open(f));
  EXPECT_EQ(r.tensors, 3u);
  EXPECT_EQ(r.already_recorded, 0u);
  EXPECT_EQ(r.sidecar, f + ".pinstage.xxh3.json");
  EXPECT_EQ(r.sidecar, hash_sidecar_path(f));
  const Checkpoint c = Checkpoint::open(f);
  for (const CheckpointTensor& t : c.tensors()) {
    ASSERT_TRUE(t.xxh3.has_value()) << t.name;
    const std::string bytes = read_bytes(f).substr(t.offset, t.bytes);
    EXPECT_EQ(*t.xxh3, xxh3_64(bytes.data(), bytes.size())) << t.name;  // the bytes' own hash
  }
  const HostLoad ok = load_to_host(c, pageable, verify);
  EXPECT_TRUE(ok.report.verified);
  std::string damaged = read_bytes(f);  // one byte of "a" flipped, same layout
  damaged[c.get("a").offset + 100] ^= 1;
  const auto when = fs::last_write_time(f);  // damage in place: the file's identity stays
  write_bytes(f, damaged);
  fs::last_write_time(f, when);
  const Error e = test::error_of([&] { load_to_host(Checkpoint::open(f), pageable, verify); });
  EXPECT_NE(std::string(e.what()).find("tensor 'a' fails its integrity check"), std::string::npos)
      << e.what();
}

TEST_F(CheckpointTest, HashingADirectoryWritesOneSidecarTheShardListIgnores) {
  const std::string d = path("shards");
  fs::create_directories(d);
  write_raw(d + "/one.safetensors", {{"x", "F16", {64}}}, 0, false);
  write_raw(d + "/two.safetensors", {{"y", "I64", {9}}}, 1, false);
  const HashReport r = hash_checkpoint(Checkpoint::open(d));
  EXPECT_EQ(r.sidecar, d + "/pinstage.xxh3.json");
  const Checkpoint c = Checkpoint::open(d);  // the sidecar is not taken for a shard
  EXPECT_EQ(c.files().size(), 2u);
  EXPECT_TRUE(c.get("x").xxh3 && c.get("y").xxh3);
}

TEST_F(CheckpointTest, AHashFromTheWriterIsCheckedAndADamagedFileWritesNoSidecar) {
  const std::string f = path("ours.safetensors");
  write_raw(f, {{"a", "F32", {1000}}, {"b", "I32", {10}}});  // hashes recorded
  EXPECT_EQ(hash_checkpoint(Checkpoint::open(f)).already_recorded, 2u);
  const std::string sidecar = read_bytes(hash_sidecar_path(f));
  std::string damaged = read_bytes(f);
  damaged[Checkpoint::open(f).get("b").offset] ^= 0x40;
  const auto when = fs::last_write_time(f);  // damage in place: the file's identity stays
  write_bytes(f, damaged);
  fs::last_write_time(f, when);
  const Error e = test::error_of([&] { hash_checkpoint(Checkpoint::open(f)); });
  EXPECT_EQ(e.code(), ErrorCode::mismatch);
  EXPECT_NE(std::string(e.what()).find("tensor 'b'"), std::string::npos) << e.what();
  EXPECT_EQ(read_bytes(hash_sidecar_path(f)), sidecar);  // the old sidecar stands, untouched
}

// Every way a sidecar can be wrong leaves it unused, its reason (naming the sidecar) kept
// for a load that verifies, which it refuses with Error(io) (issue 47: not at open).
TEST_F(CheckpointTest, ABadOrStaleSidecarIsNotUsedAndRefusesAVerifiedLoadWithItsReason) {
  const std::string f = path("m.safetensors");
  write_raw(f, {{"a", "F32", {16}}, {"b", "U8", {3}}}, 0, false);
  hash_checkpoint(Checkpoint::open(f));
  const std::string side = hash_sidecar_path(f);
  const nlohmann::json good = nlohmann::json::parse(read_bytes(side));
  CheckpointLoadOptions verify;
  verify.verify = true;
  // `writer`: b's hash as its writer recorded it, the only one a refused sidecar leaves.
  auto refused = [&](const std::string& text, const std::string& why,
                     std::optional<uint64_t> writer = std::nullopt) {
    write_bytes(side, text);
    const Checkpoint c = Checkpoint::open(f);
    EXPECT_EQ(c.get("b").xxh3, writer) << why << ": a hash of the sidecar was taken";
    const Error e = test::error_of([&] { check_sidecar(c, verify); });
    EXPECT_EQ(e.code(), ErrorCode::io) << why;
    EXPECT_NE(std::string(e.what()).find("hash sidecar '" + side + "'"), std::string::npos);
    EXPECT_NE(c.sidecar_problem().find(why), std::string::npos) << why << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(c.sidecar_problem()), std::string::npos);
  };
  auto with = [&](const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json j = good;
    change(j);
    return j.dump();
  };
  refused("{", "");
  refused(R"({"format": "pinstage.xxh3/1", "format": "x", "tensors": {}})",
          "repeats the key 'format'");
  refused(with([](auto& j) { j["format"] = "pinstage.xxh3/2"; }), "its format is not");
  refused(with([](auto& j) { j["extra"] = 1; }), "unknown key 'extra'");
  refused(with([](auto& j) { j["tensors"]["zz"] = j["tensors"]["a"]; }),
          "tensor 'zz' is not in the checkpoint");
  refused(with([](auto& j) { j["tensors"]["a"]["offset"] = 1; }), "changed since");
  refused(with([](auto& j) { j["tensors"]["a"]["bytes"] = 63; }), "changed since");
  refused(with([](auto& j) { j["tensors"]["a"]["file"] = "other.safetensors"; }), "changed since");
  refused(with([](auto& j) { j["tensors"]["a"]["bytes"] = -1; }), "not a whole number");
  refused(with([](auto& j) { j["tensors"]["b"]["xxh3"] = "12345"; }), "not 16 hex digits");
  refused(with([](auto& j) { j["tensors"]["b"].erase("xxh3"); }), "has no \"xxh3\"");
  refused(with([](auto& j) { j["tensors"]["b"]["mtime"] = 1; }), "unknown key 'mtime'");
  write_bytes(side, good.dump());
  EXPECT_EQ(Checkpoint::open(f).sidecar_problem(), "");
  EXPECT_TRUE(Checkpoint::open(f).get("b").xxh3) << "the good sidecar's hashes are taken";
  EXPECT_NO_THROW(check_sidecar(Checkpoint::open(f), verify));
  // A sidecar that contradicts the hash the writer recorded.
  write_raw(f, {{"a", "F32", {16}}, {"b", "U8", {3}}}, 0, true);
  fs::remove(side);
  const std::optional<uint64_t> writer = Checkpoint::open(f).get("b").xxh3;
  ASSERT_TRUE(writer);
  hash_checkpoint(Checkpoint::open(f));
  nlohmann::json contradicts = nlohmann::json::parse(read_bytes(side));
  contradicts["tensors"]["b"]["xxh3"] = "0000000000000000";
  refused(contradicts.dump(), "but its writer recorded", writer);
}

}  // namespace
}  // namespace pinstage
