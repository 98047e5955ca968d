// CpuCommGroup implementation (see cpu_communicator.h). Every operation is: publish this rank's
// pointers, barrier, read the others' memory, barrier. The second barrier keeps inputs valid until
// every rank has read them; all_reduce's per-rank partial sums (scratch) are only rewritten after
// the first barrier of the next all_reduce, which no rank passes before all have copied them.
#include "backend/cpu/cpu_communicator.h"

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

#include <fmt/format.h>

#include <condition_variable>
#include <functional>
#include <cstring>
#include <mutex>
#include <vector>

namespace moet {

struct CpuCommGroup::State {
  explicit State(int n) : size(n), in(size_t(n)), scratch(size_t(n)) {}

  // Waits until every rank has arrived (or throws once the group is aborted).
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex);
    MOET_CHECK(!aborted, "collective aborted: {}", why);
    const uint64_t seen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lock, [&] { return generation != seen || aborted; });
    MOET_CHECK(generation != seen, "collective aborted: {}", why);
  }

  const int size;
  std::mutex mutex;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::string why;
  std::vector<const void*> in;               // per rank: the tensor it published
  std::vector<std::vector<float>> scratch;   // per rank: its part of an all_reduce's sum
};

namespace {

class CpuCommunicator final : public Communicator {
 public:
  // backend: where the ranks' tensors live (its per-op profile times the collectives); may be null.
  CpuCommunicator(CpuCommGroup::State& state, int rank, Backend* backend) : s_(state), rank_(rank), backend_(backend) {}
  int rank() const override { return rank_; }
  int size() const override { return s_.size; }
  std::string name() const override { return fmt::format("cpu threads (rank {} of {})", rank_, s_.size); }

  void all_reduce(Tensor& x) override {
    timed("all_reduce", x, [&] { all_reduce_now(x); });
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    timed("all_gather", in, [&] { all_gather_now(in, out); });
  }

  void reduce_scatter(const Tensor& in, Tensor& out) override {
    timed("reduce_scatter", in, [&] { reduce_scatter_now(in, out); });
  }

  void all_to_all(const Tensor& in, Tensor& out) override {
    timed("all_to_all", in, [&] { all_to_all_now(in, out); });
  }

  void broadcast(Tensor& x, int root) override {
    MOET_CHECK(root >= 0 && root < s_.size, "broadcast: root {} outside [0, {})", root, s_.size);
    publish(x.data);
    if (rank_ != root && x.bytes() > 0) std::memcpy(x.data, s_.in[size_t(root)], x.bytes());
    s_.arrive_and_wait();
  }

  void barrier() override { s_.arrive_and_wait(); }

 private:
  // The collectives (see communicator.h), untimed.
  void all_reduce_now(Tensor& x) {
    check_f32("all_reduce", x);
    const int64_t n = x.numel();
    const auto [begin, end] = part(n, rank_);
    publish(x.data);
    std::vector<float>& sum = s_.scratch[size_t(rank_)];
    sum.assign(peer<float>(0) + begin, peer<float>(0) + end);
    for (int r = 1; r < s_.size; ++r) {
      const float* values = peer<float>(r);
      for (int64_t i = begin; i < end; ++i) sum[size_t(i - begin)] += values[i];
    }
    s_.arrive_and_wait();
    for (int r = 0; r < s_.size; ++r) {
      const auto [from, to] = part(n, r);
      if (to > from) std::memcpy(x.as<float>() + from, s_.scratch[size_t(r)].data(), size_t(to - from) * 4);
    }
  }

  void all_gather_now(const Tensor& in, Tensor& out) {
    communicator_check("all_gather", in, out, 1, s_.size);
    publish(in.data);
    for (int r = 0; r < s_.size; ++r)
      if (in.bytes() > 0)
        std::memcpy(static_cast<uint8_t*>(out.data) + size_t(r) * in.bytes(), s_.in[size_t(r)], in.bytes());
    s_.arrive_and_wait();
  }

  void reduce_scatter_now(const Tensor& in, Tensor& out) {
    check_f32("reduce_scatter", in);
    communicator_check("reduce_scatter", in, out, s_.size, 1);
    const int64_t n = out.numel(), offset = int64_t(rank_) * n;
    publish(in.data);
    float* sum = out.as<float>();
    if (n > 0) std::memcpy(sum, peer<float>(0) + offset, size_t(n) * 4);
    for (int r = 1; r < s_.size; ++r) {
      const float* values = peer<float>(r) + offset;
      for (int64_t i = 0; i < n; ++i) sum[i] += values[i];
    }
    s_.arrive_and_wait();
  }

  void all_to_all_now(const Tensor& in, Tensor& out) {
    communicator_check("all_to_all", in, out, s_.size, s_.size);
    const size_t chunk = in.bytes() / size_t(s_.size);
    publish(in.data);
    for (int r = 0; r < s_.size; ++r)
      if (chunk > 0)
        std::memcpy(static_cast<uint8_t*>(out.data) + size_t(r) * chunk, peer<uint8_t>(r) + size_t(rank_) * chunk,
                    chunk);
    s_.arrive_and_wait();
  }

  // body() as op "<op>[bytes=N]" of the backend's per-op profile (the time includes waiting for
  // the other ranks: the collective's share of this rank's step).
  void timed(const char* op, const Tensor& t, const std::function<void()>& body) {
    if (backend_ == nullptr) return body();
    cpu_backend_profiled(*backend_, [&] { return fmt::format("{}[bytes={}]", op, t.bytes()); }, body);
  }
  void publish(const void* data) {
    s_.in[size_t(rank_)] = data;
    s_.arrive_and_wait();
  }
  template <typename T>
  const T* peer(int r) const {
    return static_cast<const T*>(s_.in[size_t(r)]);
  }
  // Elements [begin, end) of n that rank r sums.
  std::pair<int64_t, int64_t> part(int64_t n, int r) const { return {n * r / s_.size, n * (r + 1) / s_.size}; }
  static void check_f32(const char* op, const Tensor& t) {
    MOET_CHECK(t.dtype == DType::f32, "{}: sums are F32 (got {})", op, dtype_name(t.dtype));
  }

  CpuCommGroup::State& s_;
  const int rank_;
  Backend* backend_;
};

}  // namespace

namespace {

// Ranks [first, first + count) of a CpuCommGroup as a group (see CpuCommGroup::node).
class CpuNodeGroup final : public CommGroup {
 public:
  CpuNodeGroup(CpuCommGroup& all, int first, int count) : all_(all), first_(first), count_(count) {}
  int size() const override { return all_.size(); }
  int local_size() const override { return count_; }
  int first_rank() const override { return first_; }
  std::unique_ptr<Communicator> connect(int local, Backend& backend) override {
    MOET_CHECK(local >= 0 && local < count_, "local rank {} outside [0, {})", local, count_);
    return all_.connect(first_ + local, backend);
  }
  void abort(const std::string& why) override { all_.abort(why); }
  bool reset() override { return all_.reset(); }

 private:
  CpuCommGroup& all_;
  const int first_, count_;
};

}  // namespace

std::unique_ptr<CommGroup> CpuCommGroup::node(int first, int count) {
  MOET_CHECK(first >= 0 && count >= 1 && first + count <= size(), "ranks [{}, {}) outside the group's {}", first,
             first + count, size());
  return std::make_unique<CpuNodeGroup>(*this, first, count);
}

CpuCommGroup::CpuCommGroup(int size) {
  MOET_CHECK(size >= 1, "a communicator group needs at least one rank (got {})", size);
  state_ = std::make_unique<State>(size);
}

CpuCommGroup::~CpuCommGroup() = default;

int CpuCommGroup::size() const { return state_->size; }

std::unique_ptr<Communicator> CpuCommGroup::communicator(int rank) {
  MOET_CHECK(rank >= 0 && rank < state_->size, "rank {} outside [0, {})", rank, state_->size);
  return std::make_unique<CpuCommunicator>(*state_, rank, nullptr);
}

std::unique_ptr<Communicator> CpuCommGroup::connect(int local, Backend& backend) {
  MOET_CHECK(backend.name().rfind("cpu", 0) == 0, "the in-process communicator needs CPU backends, not {}",
             backend.name());
  MOET_CHECK(local >= 0 && local < state_->size, "rank {} outside [0, {})", local, state_->size);
  return std::make_unique<CpuCommunicator>(*state_, local, &backend);
}

void CpuCommGroup::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->aborted) return;  // the first failure names the cause
  state_->aborted = true;
  state_->why = why;
  state_->cv.notify_all();
}

bool CpuCommGroup::reset() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->aborted = false;
  state_->why.clear();
  state_->arrived = 0;
  return true;
}

}  // namespace moet
