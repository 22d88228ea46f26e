// safetensors: round trips keep names, order, dtypes, shapes, directions and bytes;
// every malformed header is refused with Error(io) and nothing stays allocated.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "pinstage/safetensors.h"
#include "pinstage/worker.h"
#include "temp_dir_test_util.h"
#include "tensor_test_util.h"

namespace pinstage {
namespace {

using test::CountingAllocator;
using test::error_of;
namespace fs = std::filesystem;

class Safetensors : public test::TempDirTest {
 protected:
  Safetensors() : TempDirTest("st") {}
};

// Tensors of every dtype with recognisable bytes, an empty one and a scalar.
TaskArgs sample_args(HostAllocator& alloc) {
  TaskArgs args;
  args.add(Tensor::empty("w", DType::bf16, {3, 5}, Direction::in, alloc));
  args.add(Tensor::empty("half", DType::f16, {7}, Direction::in, alloc));
  args.add(Tensor::empty("cache", DType::f32, {2, 2, 2}, Direction::inout, alloc));
  args.add(Tensor::empty("idx", DType::i32, {4}, Direction::in, alloc));
  args.add(Tensor::empty("big", DType::i64, {3}, Direction::in, alloc));
  args.add(Tensor::empty("none", DType::f32, {0, 4}, Direction::in, alloc));
  args.add(Tensor::empty("scalar", DType::f32, {}, Direction::in, alloc));
  args.add(Tensor::empty("out", DType::bf16, {2, 3}, Direction::out, alloc));
  unsigned seed = 1;
  for (const Tensor& t : args) {
    auto* p = static_cast<unsigned char*>(t.data());
    for (uint64_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<unsigned char>((seed++ * 37) >> 2);
  }
  return args;
}

void expect_equal(const TaskArgs& a, const TaskArgs& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const Tensor& x = a.at(i);
    const Tensor& y = b.at(i);
    EXPECT_EQ(x.name(), y.name());
    EXPECT_EQ(x.dtype(), y.dtype()) << x.name();
    EXPECT_EQ(x.shape(), y.shape()) << x.name();
    EXPECT_EQ(x.direction(), y.direction()) << x.name();
    ASSERT_EQ(x.nbytes(), y.nbytes()) << x.name();
    if (x.nbytes() > 0) {
      EXPECT_EQ(std::memcmp(x.data(), y.data(), x.nbytes()), 0) << x.name();
    }
  }
}

std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// An 8-byte length, the header text, the data.
std::string file_of(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i, n >>= 8) out[i] = static_cast<char>(n & 0xff);
  return out + header + data;
}

TEST_F(Safetensors, RoundTripKeepsEverything) {
  PageableAllocator pageable;
  const TaskArgs args = sample_args(pageable);
  const uint64_t size = save_safetensors(args, path("a.safetensors"));
  EXPECT_EQ(size, fs::file_size(path("a.safetensors")));
  expect_equal(args, load_safetensors(path("a.safetensors"), pageable));

  Worker worker;
  worker.init("sim");
  PinnedAllocator pinned(worker);
  const TaskArgs back = load_safetensors(path("a.safetensors"), pinned);
  expect_equal(args, back);
  for (const Tensor& t : back) {
    if (t.nbytes() > 0) {
      EXPECT_TRUE(t.pinned()) << t.name();
    }
  }
  // Saving what was loaded gives the same file.
  save_safetensors(back, path("b.safetensors"));
  EXPECT_EQ(read_file(path("a.safetensors")), read_file(path("b.safetensors")));
}

TEST_F(Safetensors, FileLayoutIsTheStandardOne) {
  PageableAllocator alloc;
  const TaskArgs args = sample_args(alloc);
  save_safetensors(args, path("a.safetensors"));
  const std::string bytes = read_file(path("a.safetensors"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u) << "data starts 8-byte aligned";
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["pinstage.direction.cache"], "INOUT");
  EXPECT_EQ(header["__metadata__"]["pinstage.direction.out"], "OUT");
  EXPECT_EQ(header["w"]["dtype"], "BF16");
  EXPECT_EQ(header["w"]["shape"], nlohmann::json({3, 5}));
  EXPECT_EQ(header["w"]["data_offsets"], nlohmann::json({0, 30}));
  EXPECT_EQ(header["half"]["data_offsets"], nlohmann::json({30, 44}));
  EXPECT_EQ(header["scalar"]["shape"], nlohmann::json::array());
  EXPECT_EQ(bytes.size(), 8 + n + args.total_bytes());
  EXPECT_EQ(bytes.substr(8 + n, 30), std::string(static_cast<const char*>(args.at(0).data()), 30));
}

TEST_F(Safetensors, FilesFromElsewhereGetTheDefaultDirection) {
  // Written by another tool: keys in any order, no pinstage metadata.
  const std::string header =
      R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
      R"("a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},"__metadata__":{"format":"pt"}})";
  write_file(path("x.safetensors"), file_of(header, std::string(12, '\x01')));
  PageableAllocator alloc;
  const TaskArgs args = load_safetensors(path("x.safetensors"), alloc);
  ASSERT_EQ(args.size(), 2u);
  EXPECT_EQ(args.at(0).name(), "a");  // data order
  EXPECT_EQ(args.at(1).name(), "b");
  EXPECT_EQ(args.at(0).direction(), Direction::in);
  SafetensorsLoadOptions opts;
  opts.default_direction = Direction::inout;
  EXPECT_EQ(load_safetensors(path("x.safetensors"), alloc, opts).at(1).direction(),
            Direction::inout);
  const auto entries = read_safetensors_header(path("x.safetensors"));
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[1].begin, 4u);
  EXPECT_EQ(entries[1].end, 12u);
}

struct Malformed {
  const char* what;
  std::string file;
  const char* message;  // a word the error must contain
};

std::vector<Malformed> malformed_files() {
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  auto one = [](const std::string& entries) { return "{" + entries + "}"; };
  const std::string data8(8, '\0');
  std::vector<Malformed> cases = {
      {"shorter than the length field", std::string(5, '\0'), "8-byte header length"},
      {"header longer than the file", file_of(one(ok_entry), data8).substr(0, 20), "truncated"},
      {"not JSON", file_of("{\"a\": [1, 2", data8), "not valid JSON"},
      {"not an object", file_of("[1, 2, 3]", data8), "JSON object"},
      {"unknown dtype",
       file_of(one(R"("a":{"dtype":"F128","shape":[1],"data_offsets":[0,8]})"), data8), "F128"},
      {"a lower-case dtype (the format spells them upper-case)",
       file_of(one(R"("a":{"dtype":"f64","shape":[1],"data_offsets":[0,8]})"), data8), "f64"},
      {"shape and bytes differ",
       file_of(one(R"("a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]})"), data8), "span 8"},
      {"offsets past the data",
       file_of(one(R"("a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]})"), data8),
       "past the end"},
      {"truncated data", file_of(one(ok_entry), data8).substr(0, 8 + one(ok_entry).size() + 5),
       "past the end"},
      {"overlapping tensors",
       file_of(one(ok_entry + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]})"), data8),
       "overlap"},
      {"a gap between tensors",
       file_of(one(R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                   R"("b":{"dtype":"I32","shape":[1],"data_offsets":[8,12]})"),
               std::string(12, '\0')),
       "belong to no tensor"},
      {"bytes after the last tensor", file_of(one(ok_entry), data8 + "xxxx"), "cover 8"},
      {"begin past end",
       file_of(one(R"("a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]})"), data8),
       "begin is past end"},
      {"negative dimension",
       file_of(one(R"("a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"), data8),
       "non-negative"},
      {"fractional offset",
       file_of(one(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8.5]})"), data8), "integer"},
      {"overflowing shape",
       file_of(one(R"("a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]})"),
               data8),
       "overflow"},
      {"missing data_offsets", file_of(one(R"("a":{"dtype":"F32","shape":[2]})"), data8),
       "data_offsets"},
      {"unknown field",
       file_of(one(R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1})"), data8),
       "unknown field"},
      {"duplicate names", file_of(one(ok_entry + "," + ok_entry), data8), "repeats the key 'a'"},
      {"bad direction",
       file_of(one(ok_entry + R"(,"__metadata__":{"pinstage.direction.a":"SIDEWAYS"})"), data8),
       "SIDEWAYS"},
      {"direction of a missing tensor",
       file_of(one(ok_entry + R"(,"__metadata__":{"pinstage.direction.zz":"IN"})"), data8), "'zz'"},
      {"metadata not strings", file_of(one(ok_entry + R"(,"__metadata__":{"n":3})"), data8),
       "string"},
  };
  return cases;
}

TEST_F(Safetensors, MalformedFilesAreRefusedWithNothingAllocated) {
  for (const Malformed& m : malformed_files()) {
    SCOPED_TRACE(m.what);
    write_file(path("bad.safetensors"), m.file);
    CountingAllocator alloc;
    const Error e = error_of([&] { load_safetensors(path("bad.safetensors"), alloc); });
    EXPECT_EQ(e.code(), ErrorCode::io);
    EXPECT_NE(std::string(e.what()).find(m.message), std::string::npos) << e.what();
    if (::testing::Test::HasFailure() || std::getenv("PINSTAGE_TEST_VERBOSE"))
      std::printf("%s\n", e.what());
    EXPECT_NE(std::string(e.what()).find("bad.safetensors"), std::string::npos) << e.what();
    EXPECT_EQ(alloc.calls(), 0);
    EXPECT_EQ(error_of([&] { read_safetensors_header(path("bad.safetensors")); }).code(),
              ErrorCode::io);
  }
}

TEST_F(Safetensors, HeaderOverTheFormatLimit) {
  // A sparse file large enough to hold a 101 MiB header.
  ASSERT_TRUE(test::write_claimed_header(path("huge.safetensors"), uint64_t{101} << 20));
  CountingAllocator alloc;
  const Error e = error_of([&] { load_safetensors(path("huge.safetensors"), alloc); });
  EXPECT_EQ(e.code(), ErrorCode::io);
  EXPECT_NE(std::string(e.what()).find("100 MiB"), std::string::npos) << e.what();
}

TEST_F(Safetensors, IoErrorsNameThePath) {
  CountingAllocator alloc;
  const Error missing = error_of([&] { load_safetensors(path("nope.safetensors"), alloc); });
  EXPECT_EQ(missing.code(), ErrorCode::io);
  EXPECT_NE(std::string(missing.what()).find("nope.safetensors"), std::string::npos);
  PageableAllocator pageable;
  const TaskArgs args = sample_args(pageable);
  const Error unwritable =
      error_of([&] { save_safetensors(args, path("no/such/dir.safetensors")); });
  EXPECT_EQ(unwritable.code(), ErrorCode::io);
  EXPECT_NE(std::string(unwritable.what()).find("no/such/dir"), std::string::npos);
  TaskArgs reserved;
  reserved.add(Tensor::empty("__metadata__", DType::f32, {1}, Direction::in, pageable));
  EXPECT_EQ(error_of([&] { save_safetensors(reserved, path("r.safetensors")); }).code(),
            ErrorCode::invalid_argument);
  EXPECT_FALSE(fs::exists(path("r.safetensors")));
}

TEST_F(Safetensors, FailedAllocationDuringLoadLeavesNothing) {
  PageableAllocator pageable;
  save_safetensors(sample_args(pageable), path("a.safetensors"));
  CountingAllocator alloc;
  alloc.fail_at(4);
  EXPECT_EQ(error_of([&] { load_safetensors(path("a.safetensors"), alloc); }).code(),
            ErrorCode::out_of_memory);
  EXPECT_EQ(alloc.live(), 0);
}

TEST_F(Safetensors, NegativeReaderThreadsAreRefusedBeforeAllocating) {
  PageableAllocator pageable;
  save_safetensors(sample_args(pageable), path("t.safetensors"));
  CountingAllocator alloc;
  SafetensorsLoadOptions options;
  options.threads = -1;
  const Error e = error_of([&] { load_safetensors(path("t.safetensors"), alloc, options); });
  EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
  EXPECT_NE(std::string(e.what()).find("threads must be >= 0"), std::string::npos);
  EXPECT_EQ(alloc.live(), 0);
}

// ---- issue 14: defects 4 (deep nesting), 5 (writes destroy data), 7 (silent acceptance) ----

// 100,000 levels of nesting: refused by the depth cap with a short message, no stack
// overflow (before the fix the message path recursed over the value and crashed).
TEST_F(Safetensors, DeepNestingInAShapeIsRefusedNotACrash) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  write_file(path("deep.safetensors"),
             file_of(R"({"a":{"dtype":"F32","shape":)" + deep + R"(,"data_offsets":[0,0]}})", ""));
  CountingAllocator alloc;
  const Error e = error_of([&] { load_safetensors(path("deep.safetensors"), alloc); });
  EXPECT_EQ(e.code(), ErrorCode::io);
  EXPECT_NE(std::string(e.what()).find("nests deeper than 32 levels"), std::string::npos)
      << e.what();
  EXPECT_LT(std::string(e.what()).size(), 300u) << "no value dumped into the message";
}

TEST_F(Safetensors, DeepNestingInMetadataIsRefusedNotACrash) {
  const std::string deep = std::string(100000, '{');
  std::string nested;
  for (int i = 0; i < 100000; ++i) nested += "{\"k\":";
  nested += "1" + std::string(100000, '}');
  write_file(path("deep.safetensors"), file_of(R"({"__metadata__":{"x":)" + nested + "}}", ""));
  const Error e = error_of([&] { read_safetensors_layout(path("deep.safetensors")); });
  EXPECT_NE(std::string(e.what()).find("nests deeper"), std::string::npos) << e.what();
}

// A huge untrusted value is never printed whole.
TEST_F(Safetensors, MessagesQuoteUntrustedTextBounded) {
  const std::string big(1 << 20, 'x');
  write_file(
      path("m.safetensors"),
      file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"n":[")" +
                  big + R"("]}})",
              std::string(8, '\0')));
  const Error e = error_of([&] { read_safetensors_layout(path("m.safetensors")); });
  EXPECT_NE(std::string(e.what()).find("an array of 1 items"), std::string::npos) << e.what();
  EXPECT_LT(std::string(e.what()).size(), 400u);
  write_file(path("n.safetensors"),
             file_of(R"({")" + big + R"(":{"dtype":"F64x","shape":[1],"data_offsets":[0,8]}})",
                     std::string(8, '\0')));
  const Error n = error_of([&] { read_safetensors_layout(path("n.safetensors")); });
  EXPECT_NE(std::string(n.what()).find("(1048576 bytes)"), std::string::npos) << n.what();
  EXPECT_LT(std::string(n.what()).size(), 600u);
}

TEST_F(Safetensors, RepeatedKeyInsideATensorEntryIsRefused) {
  write_file(path("m.safetensors"),
             file_of(R"({"a":{"dtype":"F32","shape":[2],"dtype":"I32","data_offsets":[0,8]}})",
                     std::string(8, '\0')));
  const Error e = error_of([&] { read_safetensors_layout(path("m.safetensors")); });
  EXPECT_NE(std::string(e.what()).find("repeats the key 'dtype' inside one object"),
            std::string::npos)
      << e.what();
}

TEST_F(Safetensors, RepeatedKeyInMetadataIsRefused) {
  write_file(path("m.safetensors"),
             file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("__metadata__":{"format":"pt","format":"np"}})",
                     std::string(8, '\0')));
  const Error e = error_of([&] { read_safetensors_layout(path("m.safetensors")); });
  EXPECT_NE(std::string(e.what()).find("repeats the key 'format'"), std::string::npos) << e.what();
}

TEST_F(Safetensors, NulInANameIsRefused) {
  write_file(path("m.safetensors"),
             file_of(R"({"a\u0000b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                     std::string(8, '\0')));
  const Error e = error_of([&] { read_safetensors_layout(path("m.safetensors")); });
  EXPECT_NE(std::string(e.what()).find("'a?b' holds a NUL byte"), std::string::npos) << e.what();
  write_file(
      path("k.safetensors"),
      file_of(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"x\u0000":"1"}})",
          std::string(8, '\0')));
  EXPECT_NE(std::string(error_of([&] { read_safetensors_layout(path("k.safetensors")); }).what())
                .find("NUL"),
            std::string::npos);
}

TEST_F(Safetensors, LeadingByteOrderMarkIsRefused) {
  write_file(path("m.safetensors"),
             file_of("\xEF\xBB\xBF"
                     R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                     std::string(8, '\0')));
  const Error e = error_of([&] { read_safetensors_layout(path("m.safetensors")); });
  EXPECT_NE(std::string(e.what()).find("byte-order mark"), std::string::npos) << e.what();
}

TEST_F(Safetensors, WriterRecordsEachTensorsXxh3) {
  PageableAllocator pageable;
  const TaskArgs args = sample_args(pageable);
  save_safetensors(args, path("a.safetensors"));
  const SafetensorsHeader h = read_safetensors_layout(path("a.safetensors"));
  size_t found = 0;
  for (const auto& [k, v] : h.metadata)
    if (k.rfind(kSafetensorsXxh3Key, 0) == 0) {
      const Tensor& t = args.get(k.substr(std::strlen(kSafetensorsXxh3Key)));
      EXPECT_EQ(v, xxh3_hex(xxh3_64(t.data(), t.nbytes()))) << k;
      ++found;
    }
  EXPECT_EQ(found, args.size());
  // The standard XXH3_64bits, seed 0: known values of the reference implementation.
  EXPECT_EQ(xxh3_64(nullptr, 0), 0x2d06800538d394c2ull);
  EXPECT_EQ(xxh3_64("a", 1), 0xe6c632b61e964e1full);
  Xxh3Stream s;
  s.update("a", 1);
  EXPECT_EQ(s.digest(), 0xe6c632b61e964e1full);
}

// A failed write leaves the previous file as it was (it used to be truncated, then
// unlinked). The write fails for real: RLIMIT_FSIZE makes it EFBIG part way.
TEST_F(Safetensors, FailedSaveLeavesThePreviousFileIntact) {
  PageableAllocator pageable;
  TaskArgs big;
  big.add(Tensor::empty("x", DType::f32, {1 << 20}, Direction::in, pageable));
  write_file(path("keep.safetensors"), "previous contents");
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 64 << 10;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const Error e = error_of([&] { save_safetensors(big, path("keep.safetensors")); });
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous_handler);
  EXPECT_EQ(e.code(), ErrorCode::io);
  EXPECT_EQ(read_file(path("keep.safetensors")), "previous contents");
  size_t files = 0;
  for (const auto& f : fs::directory_iterator(dir_)) files += f.is_regular_file();
  EXPECT_EQ(files, 1u) << "no temporary file left behind";
}

TEST_F(Safetensors, NonRegularTargetIsRefusedBeforeAnyWork) {
  PageableAllocator pageable;
  const TaskArgs args = sample_args(pageable);
  // Not /dev/full: the old code unlinked the target after a failed write.
  for (const char* target : {"/dev/null"}) {
    SCOPED_TRACE(target);
    struct stat before {};
    ASSERT_EQ(::stat(target, &before), 0);
    const Error e = error_of([&] { save_safetensors(args, target); });
    EXPECT_EQ(e.code(), ErrorCode::io);
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    struct stat after {};
    ASSERT_EQ(::stat(target, &after), 0) << "the device is still there";
    EXPECT_TRUE(S_ISCHR(after.st_mode));
  }
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  EXPECT_EQ(error_of([&] { save_safetensors(args, path("fifo")); }).code(), ErrorCode::io);
  EXPECT_EQ(error_of([&] { save_safetensors(args, dir_.string()); }).code(), ErrorCode::io);
}

TEST_F(Safetensors, HeaderParserFromMemoryMatchesTheFileReader) {
  const std::string header = R"({"b":{"dtype":"F8_E5M2","shape":[3],"data_offsets":[2,5]},)"
                             R"("a":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})";
  const SafetensorsHeader h = parse_safetensors_header(header, 5, "memory");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "a");
  EXPECT_EQ(h.tensors[1].dtype, "F8_E5M2");
  EXPECT_EQ(h.data_start, 8 + header.size());
  EXPECT_EQ(error_of([&] { parse_safetensors_header(header, 6, "memory"); }).code(), ErrorCode::io);
}

// The reference writes and reads an empty __metadata__ key; a NUL in one stays an error.
TEST_F(Safetensors, AnEmptyMetadataKeyIsReadAndANulOneRefused) {
  const std::string tensor = R"("a":{"dtype":"U16","shape":[2],"data_offsets":[0,4]})";
  const SafetensorsHeader h =
      parse_safetensors_header(R"({"__metadata__":{"":"v","k":""},)" + tensor + "}", 4, "memory");
  ASSERT_EQ(h.metadata.size(), 2u);
  EXPECT_EQ(h.metadata[0], (std::pair<std::string, std::string>{"", "v"}));
  const Error e = error_of([&] {
    parse_safetensors_header(R"({"__metadata__":{"a\u0000b":"v"},)" + tensor + "}", 4, "memory");
  });
  EXPECT_EQ(e.code(), ErrorCode::io);
  EXPECT_NE(std::string(e.what()).find("NUL"), std::string::npos) << e.what();
}

}  // namespace
}  // namespace pinstage
