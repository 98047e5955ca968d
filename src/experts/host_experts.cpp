// HostExperts implementation (see host_experts.h).
#include "experts/host_experts.h"

#include "core/error.h"
#include "kernels/cpu/expert_ffn.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <immintrin.h>

namespace moet {
namespace {

size_t round_up(size_t bytes) { return (bytes + 63) / 64 * 64; }

}  // namespace

HostExperts::HostExperts(Backend& backend, const ExpertLayout& layout, const ExpertRowLayout& row, int threads,
                         CpuIsa isa)
    : backend_(backend), layout_(layout), row_(row), pool_(threads), isa_(isa) {
  MOET_CHECK(layout.format == ExpertFormat::w2 || layout.format == ExpertFormat::fp4,
             "host experts compute W2 or FP4 experts");
}

HostExperts::~HostExperts() {
  if (!poller_.joinable()) return;
  stop_.store(true, std::memory_order_release);
  poller_.join();
}

void HostExperts::compute(const uint8_t* row, const float* x, int64_t top_k, std::span<const int64_t> items,
                          float* results) {
  const int64_t count = int64_t(items.size()), hidden = layout_.hidden, inner = layout_.inner;
  if (count == 0) return;
  gathered_.resize(size_t(count * hidden));
  out_.resize(size_t(count * hidden));
  scratch_.resize(size_t(block_expert_ffn_scratch(count, inner)));
  for (int64_t j = 0; j < count; ++j)
    std::memcpy(gathered_.data() + j * hidden, x + (items[size_t(j)] / top_k) * hidden, sizeof(float) * size_t(hidden));
  const BlockExpertPlanes planes{row + row_.codes13, row + row_.scales13, row + row_.codes2, row + row_.scales2,
                                 layout_.format == ExpertFormat::w2 ? 2 : 4};
  block_expert_ffn(gathered_.data(), count, hidden, inner, planes, scratch_.data(), out_.data(), pool_, isa_);
  for (int64_t j = 0; j < count; ++j)
    std::memcpy(results + items[size_t(j)] * hidden, out_.data() + j * hidden, sizeof(float) * size_t(hidden));
}

HostExpertCost HostExperts::measure(const uint8_t* row) {
  constexpr int64_t kRows = 4;
  const int64_t hidden = layout_.hidden;
  std::vector<float> x(size_t(kRows * hidden), 0.01f), results(size_t(kRows * hidden));
  const auto best_of = [&](int64_t rows) {
    std::vector<int64_t> items(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) items[size_t(i)] = i;
    double best = 1e30;
    for (int run = 0; run < 3; ++run) {
      const auto start = std::chrono::steady_clock::now();
      compute(row, x.data(), 1, items, results.data());
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return best;
  };
  const double one = best_of(1), four = best_of(kRows);
  HostExpertCost cost;
  cost.row_seconds = std::max(0.0, (four - one) / double(kRows - 1));
  cost.fixed_seconds = std::max(0.0, one - cost.row_seconds);
  return cost;
}

void HostExperts::open_mailboxes(std::span<const int64_t> layers, int64_t max_rows, int64_t top_k,
                                 HostExpertServer& server) {
  MOET_CHECK(mailboxes_.empty(), "host experts: the mailboxes are open already");
  MOET_CHECK(max_rows > 0, "host experts: a mailbox needs rows");
  server_ = &server;
  top_k_ = top_k;
  const int64_t hidden = layout_.hidden, items = max_rows * top_k;
  const size_t x_bytes = round_up(sizeof(float) * size_t(max_rows * hidden));
  const size_t ids_bytes = round_up(sizeof(int32_t) * size_t(items));
  const size_t weights_bytes = round_up(sizeof(float) * size_t(items));
  const size_t results_bytes = round_up(sizeof(float) * size_t(items * hidden)), flag_bytes = 64;
  const size_t total = x_bytes + 2 * ids_bytes + weights_bytes + results_bytes + 3 * flag_bytes;
  for (int64_t layer : layers) {
    std::shared_ptr<uint8_t> memory = backend_.alloc_pinned(total);
    std::memset(memory.get(), 0, total);
    uint8_t* p = memory.get();
    const auto take = [&](size_t bytes) {
      uint8_t* at = p;
      p += bytes;
      return at;
    };
    HostMailbox m;
    m.x = reinterpret_cast<float*>(take(x_bytes));
    m.ids = reinterpret_cast<int32_t*>(take(ids_bytes));
    m.weights = reinterpret_cast<float*>(take(weights_bytes));
    m.results = reinterpret_cast<float*>(take(results_bytes));
    m.valid = reinterpret_cast<int32_t*>(take(ids_bytes));
    m.rows = reinterpret_cast<int32_t*>(take(flag_bytes));
    m.ready = reinterpret_cast<uint32_t*>(take(flag_bytes));
    m.done = reinterpret_cast<uint32_t*>(take(flag_bytes));
    m.max_rows = max_rows;
    mailboxes_.push_back({layer, m});
    memory_.push_back(std::move(memory));
  }
  poller_ = std::thread([this] { poll_loop(); });
}

HostMailbox HostExperts::mailbox(int64_t layer) const {
  for (const Box& b : mailboxes_)
    if (b.layer == layer) return b.mailbox;
  fail("host experts: no mailbox for layer {}", layer);
}

void HostExperts::begin_pass() { hot_.store(true, std::memory_order_release); }

void HostExperts::end_pass() {
  hot_.store(false, std::memory_order_release);
  while (busy_.load(std::memory_order_acquire)) _mm_pause();
  for (Box& b : mailboxes_) {  // the device's wait leaves 2 when it gave up on the host
    std::atomic_ref<uint32_t> done(*b.mailbox.done);
    if (done.load(std::memory_order_acquire) != 2) continue;
    done.store(0, std::memory_order_relaxed);
    fail("host experts: the device gave up waiting for layer {}'s results (the host thread did not answer)", b.layer);
  }
}

// Polls every layer's ready flag until destroyed; each raised flag is answered (cleared, served,
// done raised). While a pass is in flight (begin_pass) it spins; otherwise it naps between sweeps,
// so that a forward nobody announced still completes, only later.
void HostExperts::poll_loop() {
  while (!stop_.load(std::memory_order_acquire)) {
    bool served = false;
    for (Box& b : mailboxes_) {
      std::atomic_ref<uint32_t> ready(*b.mailbox.ready);
      if (ready.load(std::memory_order_acquire) != 1) continue;
      busy_.store(true, std::memory_order_release);
      ready.store(0, std::memory_order_relaxed);
      const HostMailbox& m = b.mailbox;
      server_->serve(b.layer, m.x, m.ids, m.weights, *m.rows, top_k_, m.results, m.valid);
      std::atomic_ref<uint32_t>(*m.done).store(1, std::memory_order_release);
      busy_.store(false, std::memory_order_release);
      served = true;
    }
    if (served) continue;
    if (hot_.load(std::memory_order_acquire)) {
      _mm_pause();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

}  // namespace moet
