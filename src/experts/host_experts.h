// Routed experts computed on the host (--cpu-experts): a pool of worker threads runs an expert's
// SwiGLU FFN from its host row (the store's bytes, read in place: kernels/cpu/expert_ffn.h) for
// the rows routed to it and writes each of its items' results for the MoE op's combine, which
// adds them where the expert's own would have gone (backend/expert_types.h, host entries).
// On the CPU backend the MoE op calls the server directly (nothing is copied). On a backend whose
// op runs away from the host (Backend::host_experts_by_mailbox(): CUDA) this also owns one
// HostMailbox per MoE layer in page-locked memory and a thread that, while a pass is in flight
// (begin_pass() .. end_pass()), polls their ready flags, calls the server with the mailbox's rows
// and routing and raises the done flag the device waits for (docs/experts.md, "The CPU path").
#pragma once

#include "backend/backend.h"
#include "core/cpu_isa.h"
#include "core/thread_pool.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <thread>
#include <vector>

namespace moet {

// Startup costs of one expert on the host (the policy's input, miss_policy.h).
struct HostExpertCost {
  double fixed_seconds = 0.0, row_seconds = 0.0;
};

class HostExperts {
 public:
  // threads <= 0: one per hardware thread.
  HostExperts(Backend& backend, const ExpertLayout& layout, const ExpertRowLayout& row, int threads, CpuIsa isa);
  ~HostExperts();
  HostExperts(const HostExperts&) = delete;
  HostExperts& operator=(const HostExperts&) = delete;

  // For each item (row * top_k + slot) of `items`: results[item] = the expert whose host row is
  // `row` applied to x[item / top_k] (x [rows, hidden], results [rows * top_k, hidden]).
  void compute(const uint8_t* row, const float* x, int64_t top_k, std::span<const int64_t> items, float* results);
  // Times compute() on `row` for 1 and 4 rows (best of a few runs).
  HostExpertCost measure(const uint8_t* row);
  int threads() const { return pool_.size(); }

  // Mailbox backends: one mailbox per layer of `layers` for steps of up to max_rows rows, the
  // poller answering through `server`.
  void open_mailboxes(std::span<const int64_t> layers, int64_t max_rows, int64_t top_k, HostExpertServer& server);
  bool has_mailboxes() const { return !mailboxes_.empty(); }
  HostMailbox mailbox(int64_t layer) const;
  // The poller spins between these (a pass in flight) and naps otherwise; end_pass() returns once
  // it is not serving, so that what the server did is visible to the caller.
  void begin_pass();
  void end_pass();

 private:
  void poll_loop();

  Backend& backend_;
  ExpertLayout layout_;
  ExpertRowLayout row_;
  ThreadPool pool_;
  CpuIsa isa_;
  std::vector<float> gathered_, scratch_, out_;
  // Mailboxes (mailbox backends only).
  struct Box {
    int64_t layer;
    HostMailbox mailbox;
  };
  std::vector<Box> mailboxes_;
  std::vector<std::shared_ptr<uint8_t>> memory_;
  HostExpertServer* server_ = nullptr;
  int64_t top_k_ = 0;
  std::thread poller_;
  std::atomic<bool> hot_{false}, busy_{false}, stop_{false};
};

}  // namespace moet
