// The in-process CPU communicator (backend/cpu/cpu_communicator.h): every collective against the
// same result computed serially, for 1 to 4 ranks; sums are the ranks' values added in rank order,
// bit for bit (memcmp) on every rank, whatever the order the threads arrive in (random delays);
// abort() releases ranks waiting in a collective with an error, and reset() makes the group usable
// again. The RankThreads that run the ranks report the first failure.
#include "../random_values.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_communicator.h"
#include "core/error.h"
#include "core/rank_threads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace moet {
namespace {

// Per rank: a backend and a communicator of one group; run(body) runs body(rank) on every rank.
struct Ranks {
  explicit Ranks(int n) : group(n), threads(n) {
    for (int r = 0; r < n; ++r) {
      backends.push_back(cpu_backend_create({1, cpu_isa_best()}));
      comms.push_back(group.connect(r, *backends.back()));
    }
  }
  void run(const std::function<void(int)>& body) {
    threads.run(body, [this](const std::string& why) { group.abort(why); });
  }
  Tensor tensor(int r, const std::vector<float>& values) {
    Tensor t = backends[size_t(r)]->alloc({int64_t(values.size())});
    backends[size_t(r)]->from_host(values.data(), t);
    return t;
  }
  std::vector<float> host(const Tensor& t) {
    std::vector<float> out(size_t(t.numel()));
    std::memcpy(out.data(), t.data, t.bytes());
    return out;
  }

  CpuCommGroup group;
  RankThreads threads;
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<Communicator>> comms;
};

// Sleeps 0 to 2 ms so that the ranks reach each collective in varying orders.
void jitter(std::mt19937_64& rng) { std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000)); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(CpuCommunicator, AllReduceAddsInRankOrderOnEveryRank) {
  for (int n : {1, 2, 3, 4}) {
    Ranks ranks(n);
    const int64_t count = 1001;  // not a multiple of the ranks: uneven parts
    std::vector<std::vector<float>> inputs;
    for (int r = 0; r < n; ++r) inputs.push_back(random_floats(size_t(count), 100 + uint64_t(r), 1e3f));
    std::vector<float> expected(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      float sum = inputs[0][size_t(i)];
      for (int r = 1; r < n; ++r) sum += inputs[size_t(r)][size_t(i)];
      expected[size_t(i)] = sum;
    }
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<std::vector<float>> results(static_cast<size_t>(n));
      ranks.run([&](int r) {
        std::mt19937_64 rng(static_cast<uint64_t>(trial * 10 + r));
        Tensor x = ranks.tensor(r, inputs[size_t(r)]);
        jitter(rng);
        ranks.comms[size_t(r)]->all_reduce(x);
        results[size_t(r)] = ranks.host(x);
      });
      for (int r = 0; r < n; ++r) EXPECT_TRUE(same_bits(results[size_t(r)], expected)) << n << " ranks, rank " << r;
    }
  }
}

TEST(CpuCommunicator, GatherScatterAllToAllAndBroadcast) {
  for (int n : {1, 2, 3, 4}) {
    Ranks ranks(n);
    const int64_t part = 37;
    std::vector<std::vector<float>> inputs;
    for (int r = 0; r < n; ++r) inputs.push_back(random_floats(size_t(n * part), 200 + uint64_t(r)));
    const size_t ranks_n = static_cast<size_t>(n);
    std::vector<std::vector<float>> gathered(ranks_n), scattered(ranks_n), exchanged(ranks_n), sent(ranks_n);
    ranks.run([&](int r) {
      std::mt19937_64 rng(static_cast<uint64_t>(r));
      Backend& b = *ranks.backends[size_t(r)];
      Communicator& comm = *ranks.comms[size_t(r)];
      const Tensor mine =
          ranks.tensor(r, std::vector<float>(inputs[size_t(r)].begin(), inputs[size_t(r)].begin() + part));
      Tensor all = b.alloc({n * part});
      jitter(rng);
      comm.all_gather(mine, all);
      gathered[size_t(r)] = ranks.host(all);
      const Tensor whole = ranks.tensor(r, inputs[size_t(r)]);
      Tensor sum = b.alloc({part});
      jitter(rng);
      comm.reduce_scatter(whole, sum);
      scattered[size_t(r)] = ranks.host(sum);
      Tensor received = b.alloc({n * part});
      comm.all_to_all(whole, received);
      exchanged[size_t(r)] = ranks.host(received);
      Tensor x = ranks.tensor(r, inputs[size_t(r)]);
      comm.broadcast(x, n - 1);
      comm.barrier();
      sent[size_t(r)] = ranks.host(x);
    });
    for (int r = 0; r < n; ++r) {
      for (int s = 0; s < n; ++s) {
        for (int64_t i = 0; i < part; ++i) {
          // all_gather: rank s's part at s; all_to_all: part r of rank s's input at s.
          EXPECT_EQ(gathered[size_t(r)][size_t(s * part + i)], inputs[size_t(s)][size_t(i)]);
          EXPECT_EQ(exchanged[size_t(r)][size_t(s * part + i)], inputs[size_t(s)][size_t(r * part + i)]);
        }
      }
      for (int64_t i = 0; i < part; ++i) {
        float sum = inputs[0][size_t(r * part + i)];
        for (int s = 1; s < n; ++s) sum += inputs[size_t(s)][size_t(r * part + i)];
        EXPECT_EQ(std::memcmp(&scattered[size_t(r)][size_t(i)], &sum, sizeof sum), 0) << "reduce_scatter " << r;
      }
      EXPECT_TRUE(same_bits(sent[size_t(r)], inputs[size_t(n - 1)])) << "broadcast to rank " << r;
    }
  }
}

TEST(CpuCommunicator, AllToAllMovesIntegersBitForBit) {
  Ranks ranks(2);
  std::vector<std::vector<int32_t>> received(2);
  ranks.run([&](int r) {
    Backend& b = *ranks.backends[size_t(r)];
    const std::vector<int32_t> ids = {-1, 10 * r, 10 * r + 1, -7};
    Tensor in = b.alloc({4}, DType::i32), out = b.alloc({4}, DType::i32);
    b.from_host(ids.data(), in);
    ranks.comms[size_t(r)]->all_to_all(in, out);
    received[size_t(r)].resize(4);
    b.to_host(out, received[size_t(r)].data());
  });
  EXPECT_EQ(received[0], (std::vector<int32_t>{-1, 0, -1, 10}));
  EXPECT_EQ(received[1], (std::vector<int32_t>{1, -7, 11, -7}));
}

TEST(CpuCommunicator, MismatchedShapesAreErrors) {
  CpuCommGroup group(2);
  auto backend = cpu_backend_create({1, cpu_isa_best()});
  auto comm = group.connect(0, *backend);
  Tensor in = backend->alloc({6}), out = backend->alloc({6}), ints = backend->alloc({6}, DType::i32);
  EXPECT_THROW(comm->all_gather(in, out), Error);      // needs 12 outputs
  EXPECT_THROW(comm->reduce_scatter(in, out), Error);  // needs 3 outputs
  EXPECT_THROW(comm->all_reduce(ints), Error);         // sums are F32
  EXPECT_THROW(comm->broadcast(in, 2), Error);
  EXPECT_THROW(group.connect(2, *backend), Error);
}

TEST(CpuCommunicator, AbortReleasesWaitingRanksAndResetRecovers) {
  Ranks ranks(3);
  std::atomic<int> released{0};
  try {
    ranks.run([&](int r) {
      if (r == 1) fail("rank 1 cannot go on");
      Tensor x = ranks.tensor(r, {1.0f, 2.0f});
      try {
        ranks.comms[size_t(r)]->all_reduce(x);  // waits for rank 1, which never comes
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("rank 1 cannot go on"), std::string::npos) << e.what();
        ++released;
        throw;
      }
    });
    FAIL() << "the failure was not reported";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "rank 1 cannot go on");  // the first failure, not the aborts it caused
  }
  EXPECT_EQ(released.load(), 2);
  EXPECT_TRUE(ranks.group.reset());
  std::vector<std::vector<float>> results(3);
  ranks.run([&](int r) {
    Tensor x = ranks.tensor(r, {float(r), 1.0f});
    ranks.comms[size_t(r)]->all_reduce(x);
    results[size_t(r)] = ranks.host(x);
  });
  for (const auto& result : results) EXPECT_EQ(result, (std::vector<float>{3.0f, 3.0f}));
}

}  // namespace
}  // namespace moet
