// Pack writers under failure and contention, in child processes: a writer SIGKILLed mid-write
// leaves nothing a reader accepts (and an older valid pack intact), the next build succeeds and
// clears the dead writer's temp files; two concurrent writers yield one build and one reuse.
#include "core/error.h"
#include "io/pack_reader.h"
#include "pack_test_util.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace moet {
namespace {

// Runs body() in a child process and returns its wait status.
template <typename Body>
int run_child(Body body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 0;
    try {
      code = body();
    } catch (...) {
      code = 99;
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

// A source that SIGKILLs its own process when asked for the n-th expert.
ExpertSourceFn killing_source(test::SyntheticExperts& experts, int kill_at) {
  auto count = std::make_shared<int>(0);
  return [&experts, count, kill_at](int64_t layer, int64_t expert) {
    if (++*count == kill_at) ::raise(SIGKILL);
    return experts.get(layer, expert);
  };
}

size_t temp_files(const std::filesystem::path& dir) {
  size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    n += entry.path().filename().string().find(".tmp.") != std::string::npos;
  return n;
}

}  // namespace

TEST(PackCrash, SigkillMidWriteLeavesNoAcceptedPack) {
  const auto dir = test::temp_dir("pack-kill");
  const PackSpec spec = test::small_spec();
  const PackPaths paths = pack_paths(dir, spec.format, 0, 1);
  test::SyntheticExperts experts(spec.hidden, spec.intermediate);
  const int status = run_child([&] {
    ThreadPool pool(2);
    pack_ensure(paths, spec, killing_source(experts, 4), pool, false);
    return 0;
  });
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  EXPECT_NE(pack_check(paths, spec), "");
  EXPECT_THROW(PackReader::open(paths, spec), Error);
  EXPECT_EQ(temp_files(dir), 1u);
  ThreadPool pool(2);
  EXPECT_TRUE(pack_ensure(paths, spec, experts.fn(), pool, false));
  EXPECT_EQ(pack_check(paths, spec), "");
  EXPECT_EQ(temp_files(dir), 0u);
  std::filesystem::remove_all(dir);
}

TEST(PackCrash, SigkillDuringRebuildKeepsTheOldPackValid) {
  const auto dir = test::temp_dir("pack-kill2");
  PackSpec spec = test::small_spec();
  spec.zero_mode = ZeroMode::sign;
  const PackPaths paths = pack_paths(dir, spec.format, 0, 1);
  test::SyntheticExperts experts(spec.hidden, spec.intermediate);
  ThreadPool pool(2);
  pack_build(paths, spec, experts.fn(), pool, false);
  PackSpec rebuilt = spec;
  rebuilt.zero_mode = ZeroMode::alt;
  const int status = run_child([&] {
    ThreadPool child_pool(1);
    pack_ensure(paths, rebuilt, killing_source(experts, 3), child_pool, false);
    return 0;
  });
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  EXPECT_EQ(pack_check(paths, spec), "");
  EXPECT_NE(pack_check(paths, rebuilt).find("zero_mode"), std::string::npos);
  EXPECT_TRUE(pack_ensure(paths, rebuilt, experts.fn(), pool, false));
  EXPECT_EQ(pack_check(paths, rebuilt), "");
  std::filesystem::remove_all(dir);
}

TEST(PackCrash, TwoConcurrentWritersProduceOneValidPack) {
  const auto dir = test::temp_dir("pack-race");
  const PackSpec spec = test::small_spec();
  const PackPaths paths = pack_paths(dir, spec.format, 0, 1);
  // Slow sources so the two writers overlap; exit code 10 = built, 11 = reused.
  auto writer = [&] {
    test::SyntheticExperts experts(spec.hidden, spec.intermediate);
    ThreadPool pool(1);
    auto slow = [&](int64_t layer, int64_t expert) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      return experts.get(layer, expert);
    };
    return pack_ensure(paths, spec, slow, pool, false) ? 10 : 11;
  };
  pid_t pids[2];
  for (pid_t& pid : pids) {
    pid = ::fork();
    if (pid == 0) {
      int code = 99;
      try {
        code = writer();
      } catch (...) {
      }
      ::_exit(code);
    }
  }
  int codes[2];
  for (int i = 0; i < 2; ++i) {
    int status = 0;
    ::waitpid(pids[i], &status, 0);
    ASSERT_TRUE(WIFEXITED(status));
    codes[i] = WEXITSTATUS(status);
  }
  EXPECT_EQ(codes[0] + codes[1], 21) << codes[0] << " " << codes[1];
  EXPECT_EQ(pack_check(paths, spec), "");
  EXPECT_EQ(temp_files(dir), 0u);
  std::filesystem::remove_all(dir);
}

}  // namespace moet
