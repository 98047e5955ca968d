// safetensors validation and checkpoint folders: each malformed file is refused with a message
// naming the file (and tensor); sharded folders are checked against their index.
#include "../temp_dir.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <unistd.h>

namespace moet {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> bytes_of(size_t n, uint8_t seed) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = uint8_t(seed + i);
  return out;
}

// A raw file: 8-byte header length, the header text, then `data_bytes` bytes.
void write_raw(const fs::path& path, const std::string& header, size_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  out << std::string(data_bytes, '\0');
}

std::string open_error(const fs::path& path) {
  try {
    SafetensorsFile::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, WriteThenReadRoundTrips) {
  TempDir dir;
  const auto a = bytes_of(2 * 3 * 2, 1), b = bytes_of(4 * 4, 7);
  safetensors_write(dir.path() / "x.safetensors",
                    {{"a", DType::bf16, {2, 3}, a}, {"b", DType::f32, {4}, b}});
  auto file = SafetensorsFile::open(dir.path() / "x.safetensors");
  ASSERT_EQ(file->tensors().size(), 2u);
  for (const auto& t : file->tensors()) {
    const auto& expected = t.name == "a" ? a : b;
    ASSERT_EQ(t.bytes, expected.size());
    EXPECT_EQ(std::memcmp(t.data, expected.data(), t.bytes), 0);
  }
}

TEST(Safetensors, RejectsOffsetsPastTheEnd) {
  TempDir dir;
  const auto path = dir.path() / "bad.safetensors";
  write_raw(path, R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  const std::string e = open_error(path);
  EXPECT_NE(e.find("bad.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("'w'"), std::string::npos) << e;
  EXPECT_NE(e.find("past the end"), std::string::npos) << e;
}

TEST(Safetensors, RejectsHeaderLongerThanFile) {
  TempDir dir;
  const auto path = dir.path() / "short.safetensors";
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = 1000;
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << "{}";
  out.close();
  EXPECT_NE(open_error(path).find("exceeds the file"), std::string::npos);
}

TEST(Safetensors, RejectsShapeByteMismatchOverlapAndBadDtype) {
  TempDir dir;
  write_raw(dir.path() / "a.safetensors", R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,4]}})", 4);
  EXPECT_NE(open_error(dir.path() / "a.safetensors").find("needs 6 bytes"), std::string::npos);
  write_raw(dir.path() / "b.safetensors",
            R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12);
  EXPECT_NE(open_error(dir.path() / "b.safetensors").find("overlap"), std::string::npos);
  write_raw(dir.path() / "c.safetensors", R"({"w":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,2]}})", 2);
  EXPECT_NE(open_error(dir.path() / "c.safetensors").find("unsupported dtype 'Q4_K'"), std::string::npos);
  write_raw(dir.path() / "d.safetensors", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4);
  EXPECT_NE(open_error(dir.path() / "d.safetensors").find("non-negative"), std::string::npos);
  write_raw(dir.path() / "e.safetensors", R"({"w": nope})", 0);
  EXPECT_NE(open_error(dir.path() / "e.safetensors").find("not valid JSON"), std::string::npos);
}

TEST(Safetensors, RecognisesEveryCheckpointDtype) {
  TempDir dir;
  safetensors_write(dir.path() / "d.safetensors",
                    {{"bf16", DType::bf16, {2}, bytes_of(4, 0)}, {"f16", DType::f16, {2}, bytes_of(4, 0)},
                     {"f32", DType::f32, {1}, bytes_of(4, 0)}, {"fp8", DType::f8_e4m3, {4}, bytes_of(4, 0)},
                     {"u8", DType::u8, {3}, bytes_of(3, 0)}, {"i8", DType::i8, {3}, bytes_of(3, 0)}});
  EXPECT_EQ(SafetensorsFile::open(dir.path() / "d.safetensors")->tensors().size(), 6u);
}

TEST(Checkpoint, ShardedFixtureAgreesWithItsIndex) {
  const auto dir = fs::path(MOET_SOURCE_DIR) / "tests" / "fixtures" / "qwen3_moe";
  const Checkpoint ckpt = Checkpoint::open(dir);
  EXPECT_NE(ckpt.find("model.layers.0.mlp.experts.3.down_proj.weight"), nullptr);
  EXPECT_EQ(ckpt.get("model.embed_tokens.weight").shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(ckpt.identity().size(), 32u);
  EXPECT_EQ(ckpt.identity(), Checkpoint::open(dir).identity());
  try {
    ckpt.get("model.layers.9.nope.weight");
    FAIL() << "missing tensor not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'model.layers.9.nope.weight' is missing"), std::string::npos);
  }
}

TEST(Checkpoint, IdentityChangesWithConfigAndIndexMismatchIsAnError) {
  TempDir dir;
  const auto src = fs::path(MOET_SOURCE_DIR) / "tests" / "fixtures" / "qwen3_moe";
  for (const auto& entry : fs::directory_iterator(src)) fs::copy(entry.path(), dir.path() / entry.path().filename());
  const std::string before = Checkpoint::open(dir.path()).identity();
  std::ofstream(dir.path() / "config.json", std::ios::app) << "\n";
  EXPECT_NE(Checkpoint::open(dir.path()).identity(), before);
  fs::remove(dir.path() / "model-00002-of-00003.safetensors");
  try {
    Checkpoint::open(dir.path());
    FAIL() << "missing shard not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model-00002-of-00003.safetensors"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moet
