// Pack files: write -> reopen -> same bytes with every reader back end, each stale condition,
// corrupt sidecars and truncated packs, and the LRU arena.
#include "core/error.h"
#include "io/pack_arena.h"
#include "io/pack_reader.h"
#include "pack_test_util.h"

#include <gtest/gtest.h>

#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <fstream>

namespace moet {

using test::small_spec;
using test::SyntheticExperts;

class PackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::temp_dir("pack");
    spec_ = small_spec();
    paths_ = pack_paths(dir_, spec_.format, spec_.rank, spec_.world);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void build() { pack_build(paths_, spec_, experts_.fn(), pool_, false); }

  std::vector<uint8_t> expected_slot(int64_t layer, int64_t expert) {
    std::vector<uint8_t> slot(spec_.layout().stride, 0);
    pack_quantize_slot(spec_, experts_.get(layer, expert), pool_, slot.data());
    return slot;
  }

  void expect_reads_match(PackIo io) {
    std::unique_ptr<PackReader> reader;
    try {
      reader = PackReader::open(paths_, spec_, io, 2);
    } catch (const Error& e) {
      GTEST_SKIP() << pack_io_name(io) << " refused here: " << e.what();
    }
    const uint64_t stride = reader->stride();
    std::vector<PackRead> reads;
    uint8_t* buffer = static_cast<uint8_t*>(std::aligned_alloc(kPackAlign, stride * 8));
    for (int64_t layer : spec_.layers)
      for (int64_t e = spec_.expert_begin(); e < spec_.expert_begin() + spec_.expert_count(); ++e) reads.push_back({layer, e, buffer + reads.size() * stride});
    reader->read(reads);
    for (const PackRead& r : reads)
      EXPECT_EQ(std::vector<uint8_t>(r.dst, r.dst + stride), expected_slot(r.layer, r.expert)) << r.layer << "/" << r.expert;
    std::free(buffer);
  }

  // Rewrites one sidecar field (keeping the checksum valid) to fake an older/other pack.
  void edit_sidecar(const std::string& key, const nlohmann::json& value) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(paths_.sidecar));
    j[key] = value;
    j.erase("checksum");
    const std::string text = j.dump();
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH64(text.data(), text.size(), 0));
    j["checksum"] = hex;
    std::ofstream(paths_.sidecar) << j.dump(2);
  }

  std::filesystem::path dir_;
  PackSpec spec_;
  PackPaths paths_;
  SyntheticExperts experts_{64, 96};
  ThreadPool pool_{2};
};

TEST_F(PackTest, WriteReopenSameBytesWithPread) {
  build();
  EXPECT_EQ(pack_check(paths_, spec_), "");
  EXPECT_EQ(std::filesystem::file_size(paths_.pack), spec_.file_bytes());
  EXPECT_EQ(spec_.layout().stride % 4096, 0u);
  expect_reads_match(PackIo::pread);
}

TEST_F(PackTest, DirectIoReadsSameBytes) {
  build();
  expect_reads_match(PackIo::direct);
}

TEST_F(PackTest, IoUringReadsSameBytes) {
  build();
  expect_reads_match(PackIo::uring);
}

// Rows larger than a read piece (1 MiB) are read in pieces by several threads: every byte of every
// row lands in place, with each thread-pool back end.
TEST_F(PackTest, RowsLargerThanAReadPieceReadWhole) {
  spec_.hidden = 1024;
  spec_.intermediate = 1536;
  const uint64_t stride = spec_.layout().stride;
  ASSERT_GT(stride, uint64_t(1) << 20);
  const auto row_bytes = [&](int64_t layer, int64_t expert, uint8_t* row) {
    for (uint64_t i = 0; i < stride; ++i) row[i] = uint8_t((i * 131 + uint64_t(layer) * 7 + uint64_t(expert) * 29) >> 3);
  };
  pack_ensure_rows(paths_, spec_, row_bytes, false);
  std::vector<uint8_t> expected(stride);
  for (PackIo io : {PackIo::pread, PackIo::direct}) {
    std::unique_ptr<PackReader> reader;
    try {
      reader = PackReader::open(paths_, spec_, io, 3);
    } catch (const Error& e) {
      GTEST_SKIP() << pack_io_name(io) << " refused here: " << e.what();
    }
    const std::vector<PackRead> reads = {{1, 3, nullptr}, {2, 0, nullptr}};
    uint8_t* buffer = static_cast<uint8_t*>(std::aligned_alloc(kPackAlign, stride * reads.size()));
    std::vector<PackRead> placed = reads;
    for (size_t i = 0; i < placed.size(); ++i) placed[i].dst = buffer + i * stride;
    reader->read(placed);
    for (const PackRead& r : placed) {
      row_bytes(r.layer, r.expert, expected.data());
      EXPECT_EQ(std::memcmp(r.dst, expected.data(), stride), 0) << pack_io_name(io) << " " << r.layer << "/" << r.expert;
    }
    std::free(buffer);
  }
}

TEST_F(PackTest, Fp4PackAndRankSplit) {
  spec_.format = StoreFormat::fp4;
  spec_.rank = 1;
  spec_.world = 2;
  paths_ = pack_paths(dir_, spec_.format, 1, 2);
  build();
  EXPECT_EQ(spec_.expert_begin(), 2);
  EXPECT_EQ(pack_check(paths_, spec_), "");
  expect_reads_match(PackIo::pread);
}

TEST_F(PackTest, EachStaleConditionIsDetectedAndRebuilt) {
  build();
  struct Case {
    std::string field;
    std::function<void(PackSpec&)> change;
  };
  const std::vector<Case> cases = {
      {"checkpoint_identity", [](PackSpec& s) { s.identity = "other"; }},
      {"zero_mode", [](PackSpec& s) { s.zero_mode = ZeroMode::alt; }},
      {"layers", [](PackSpec& s) { s.layers = {0, 1, 2}; }},
      {"n_experts", [](PackSpec& s) { s.n_experts = 8; }},
      {"intermediate", [](PackSpec& s) { s.intermediate = 64; }},
  };
  for (const Case& c : cases) {
    PackSpec other = spec_;
    c.change(other);
    const std::string reason = pack_check(paths_, other);
    EXPECT_NE(reason.find(c.field), std::string::npos) << c.field << ": " << reason;
    EXPECT_THROW(PackReader::open(paths_, other), Error);
  }
  edit_sidecar("quantizer_abi", "old-abi-v0");
  EXPECT_NE(pack_check(paths_, spec_).find("quantizer ABI"), std::string::npos);
  build();
  edit_sidecar("format_version", 0);
  EXPECT_NE(pack_check(paths_, spec_).find("format version"), std::string::npos);
  EXPECT_TRUE(pack_ensure(paths_, spec_, experts_.fn(), pool_, false));
  EXPECT_EQ(pack_check(paths_, spec_), "");
  EXPECT_FALSE(pack_ensure(paths_, spec_, experts_.fn(), pool_, false));
  std::filesystem::remove(paths_.sidecar);
  EXPECT_NE(pack_check(paths_, spec_).find("no sidecar"), std::string::npos);
}

TEST_F(PackTest, W2kPackRowsAreTheQuantizersBytes) {
  spec_.format = StoreFormat::w2k;
  paths_ = pack_paths(dir_, spec_.format, 0, 1);
  EXPECT_EQ(spec_.layout().slot_bytes, slot_layout(StoreFormat::w2, spec_.hidden, spec_.intermediate).slot_bytes);
  build();
  EXPECT_EQ(pack_check(paths_, spec_), "");
  expect_reads_match(PackIo::pread);
  const PackSpec read = pack_sidecar_read(paths_.sidecar);
  EXPECT_EQ(read.format, StoreFormat::w2k);
}

// The imatrix hash and the W2 quantizer are part of the identity: a pack quantized with another
// imatrix (or none) or another quantizer is stale; sidecars without them stay valid for specs
// without them.
TEST_F(PackTest, ImatrixAndQuantizerAreIdentity) {
  build();
  const nlohmann::json plain = nlohmann::json::parse(std::ifstream(paths_.sidecar));
  EXPECT_FALSE(plain.contains("imatrix"));
  EXPECT_FALSE(plain.contains("w2_quantizer"));
  PackSpec weighted = spec_;
  weighted.w2_quantizer = W2Quantizer::opt;
  weighted.imatrix = "0123456789abcdef";
  EXPECT_NE(pack_check(paths_, weighted).find("w2_quantizer"), std::string::npos);
  EXPECT_TRUE(pack_ensure(paths_, weighted, experts_.fn(), pool_, false));
  EXPECT_EQ(pack_check(paths_, weighted), "");
  const PackSpec read = pack_sidecar_read(paths_.sidecar);
  EXPECT_EQ(read.imatrix, weighted.imatrix);
  EXPECT_EQ(read.w2_quantizer, W2Quantizer::opt);
  PackSpec other = weighted;
  other.imatrix = "fedcba9876543210";
  EXPECT_NE(pack_check(paths_, other).find("'imatrix'"), std::string::npos) << pack_check(paths_, other);
  EXPECT_NE(pack_check(paths_, spec_).find("w2_quantizer"), std::string::npos);
}

// W2K's LDLQ quantizer, its layer- and expert-moments files and the prior of their blend are part
// of the identity alike.
TEST_F(PackTest, SecondMomentsAndW2kQuantizerAreIdentity) {
  spec_.format = StoreFormat::w2k;
  paths_ = pack_paths(dir_, spec_.format, 0, 1);
  build();
  const nlohmann::json plain = nlohmann::json::parse(std::ifstream(paths_.sidecar));
  EXPECT_FALSE(plain.contains("w2k_quantizer"));
  EXPECT_FALSE(plain.contains("layer_moments"));
  PackSpec ldlq = spec_;
  ldlq.w2k_quantizer = W2kQuantizer::ldlq;
  ldlq.layer_moments = "0123456789abcdef";
  EXPECT_NE(pack_check(paths_, ldlq).find("'w2k_quantizer'"), std::string::npos) << pack_check(paths_, ldlq);
  EXPECT_TRUE(pack_ensure(paths_, ldlq, experts_.fn(), pool_, false));
  EXPECT_EQ(pack_check(paths_, ldlq), "");
  const PackSpec read = pack_sidecar_read(paths_.sidecar);
  EXPECT_EQ(read.w2k_quantizer, W2kQuantizer::ldlq);
  EXPECT_EQ(read.layer_moments, ldlq.layer_moments);
  PackSpec other = ldlq;
  other.layer_moments = "fedcba9876543210";
  EXPECT_NE(pack_check(paths_, other).find("'layer_moments'"), std::string::npos) << pack_check(paths_, other);
  EXPECT_NE(pack_check(paths_, spec_).find("w2k_quantizer"), std::string::npos);
  PackSpec experts = ldlq;
  experts.expert_moments = "00112233445566ff";
  experts.expert_moments_prior = 64;
  EXPECT_NE(pack_check(paths_, experts).find("'expert_moments'"), std::string::npos) << pack_check(paths_, experts);
  EXPECT_TRUE(pack_ensure(paths_, experts, experts_.fn(), pool_, false));
  const PackSpec both = pack_sidecar_read(paths_.sidecar);
  EXPECT_EQ(both.expert_moments, experts.expert_moments);
  EXPECT_EQ(both.expert_moments_prior, 64);
  other = experts;
  other.expert_moments = "ff00112233445566";
  EXPECT_NE(pack_check(paths_, other).find("'expert_moments'"), std::string::npos) << pack_check(paths_, other);
  other = experts;
  other.expert_moments_prior = 0;
  EXPECT_NE(pack_check(paths_, other).find("'expert_moments_prior'"), std::string::npos) << pack_check(paths_, other);
  other = experts;
  other.layer_moments = "";  // expert moments alone: no prior recorded (nothing to blend with)
  EXPECT_TRUE(pack_ensure(paths_, other, experts_.fn(), pool_, false));
  const nlohmann::json alone = nlohmann::json::parse(std::ifstream(paths_.sidecar));
  EXPECT_FALSE(alone.contains("layer_moments") || alone.contains("expert_moments_prior")) << alone.dump();
}

TEST_F(PackTest, TruncatedPackGivesClearError) {
  build();
  std::filesystem::resize_file(paths_.pack, spec_.file_bytes() - 4096);
  try {
    PackReader::open(paths_, spec_);
    FAIL() << "opened a truncated pack";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(pack_ensure(paths_, spec_, experts_.fn(), pool_, false));
  expect_reads_match(PackIo::pread);
}

TEST_F(PackTest, CorruptSidecarGivesClearError) {
  build();
  const std::string good = [&] {
    std::ifstream in(paths_.sidecar);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  std::ofstream(paths_.sidecar) << good.substr(0, good.size() / 2);
  EXPECT_THROW(pack_sidecar_read(paths_.sidecar), Error);
  EXPECT_NE(pack_check(paths_, spec_).find("not JSON"), std::string::npos);
  std::string flipped = good;
  flipped.replace(flipped.find("\"n_layers\": 3"), 13, "\"n_layers\": 4");
  std::ofstream(paths_.sidecar) << flipped;
  try {
    PackReader::open(paths_, spec_);
    FAIL() << "opened a pack with a corrupt sidecar";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
  }
}

TEST_F(PackTest, ArenaIsLruWithZeroCopyHits) {
  build();
  auto reader = PackReader::open(paths_, spec_);
  PackArena arena(*reader, 2);
  const ExpertKey a{1, 0}, b{1, 1}, c{2, 3};
  const auto pa = arena.fetch(std::vector<ExpertKey>{a});
  arena.fetch(std::vector<ExpertKey>{b});
  EXPECT_EQ(arena.fetch(std::vector<ExpertKey>{a})[0], pa[0]);  // hit: same memory, no read
  EXPECT_EQ(arena.hits(), 1u);
  const auto pc = arena.fetch(std::vector<ExpertKey>{c});  // evicts b, the least recent
  EXPECT_EQ(arena.lookup(b), nullptr);
  EXPECT_EQ(arena.lookup(a), pa[0]);
  EXPECT_EQ(std::vector<uint8_t>(pc[0], pc[0] + reader->stride()), expected_slot(2, 3));
  EXPECT_EQ(std::vector<uint8_t>(pa[0], pa[0] + reader->stride()), expected_slot(1, 0));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pa[0]) % kPackAlign, 0u);
  EXPECT_THROW(arena.fetch(std::vector<ExpertKey>{a, b, c}), Error);
  const auto both = arena.fetch(std::vector<ExpertKey>{b, c});
  EXPECT_EQ(std::vector<uint8_t>(both[0], both[0] + reader->stride()), expected_slot(1, 1));
  EXPECT_EQ(arena.misses(), 4u);
}

}  // namespace moet
