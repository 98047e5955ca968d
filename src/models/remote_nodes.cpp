// RemoteNodes and the followers' loop (see remote_nodes.h). A message is one byte of kind, then its
// fields in order; vectors are a count (i64) then their elements.
#include "models/remote_nodes.h"

#include "core/error.h"
#include "core/log.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace moet {
namespace {

enum class Message : uint8_t { create_cache = 1, destroy_cache = 2, forward = 3, stop = 4 };

static_assert(std::is_trivially_copyable_v<KvLayerSpec>, "KV specs travel byte for byte");

class Writer {
 public:
  explicit Writer(Message kind) { bytes_.push_back(uint8_t(kind)); }
  template <typename T>
  void put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  template <typename T>
  void put(std::span<const T> values) {
    put(int64_t(values.size()));
    const auto* p = reinterpret_cast<const uint8_t*>(values.data());
    bytes_.insert(bytes_.end(), p, p + values.size_bytes());
  }
  template <typename T>
  void put(const std::vector<T>& values) {
    put(std::span<const T>(values));
  }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& bytes) : bytes_(bytes) {}
  Message kind() {
    need(1);
    return Message(bytes_[at_++]);
  }
  template <typename T>
  T get() {
    need(sizeof(T));
    T value;
    std::memcpy(&value, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  template <typename T>
  std::vector<T> get_vector() {
    const int64_t count = get<int64_t>();
    MOET_CHECK(count >= 0 && uint64_t(count) <= (bytes_.size() - at_) / sizeof(T), "node link: a malformed message");
    std::vector<T> values(static_cast<size_t>(count));
    if (count > 0) std::memcpy(values.data(), bytes_.data() + at_, values.size() * sizeof(T));
    at_ += values.size() * sizeof(T);
    return values;
  }

 private:
  void need(size_t n) const { MOET_CHECK(at_ + n <= bytes_.size(), "node link: a message ends too early"); }

  const std::vector<uint8_t>& bytes_;
  size_t at_ = 0;
};

// The entries of sequence s's block table the batch reads: up to its rows' last position's block.
std::vector<int64_t> table_lengths(const ForwardBatch& batch, int64_t block_size) {
  std::vector<int64_t> lengths(batch.block_tables.size(), 0);
  for (size_t t = 0; t < batch.tokens.size(); ++t) {
    int64_t& length = lengths.at(size_t(batch.row_seq[t]));
    length = std::max(length, int64_t(batch.positions[t]) / block_size + 1);
  }
  return lengths;
}

}  // namespace

RemoteNodes::RemoteNodes(std::vector<NodeLink> links) : links_(std::move(links)) {}

RemoteNodes::~RemoteNodes() {
  try {
    send(Writer(Message::stop).bytes());
  } catch (const std::exception& e) {
    MOET_LOG_WARN("telling the other nodes to stop: {}", e.what());
  }
}

void RemoteNodes::send(const std::vector<uint8_t>& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  // No deadline: a node still loading its ranks delays node 0's step in any case (its collectives
  // wait for it); a node that is gone closes its link and the send fails.
  for (NodeLink& link : links_) link.send(message, 0.0);
}

int64_t RemoteNodes::create_cache(std::span<const KvLayerSpec> specs, int64_t blocks, int64_t block_size) {
  int64_t id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    id = next_id_++;
    block_size_[id] = block_size;
  }
  Writer w(Message::create_cache);
  w.put(id);
  w.put(blocks);
  w.put(block_size);
  w.put(specs);
  send(w.bytes());
  return id;
}

void RemoteNodes::destroy_cache(int64_t id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    block_size_.erase(id);
  }
  Writer w(Message::destroy_cache);
  w.put(id);
  send(w.bytes());
}

void RemoteNodes::forward(int64_t cache, const ForwardBatch& batch) {
  MOET_CHECK(batch.mtp_hidden == nullptr, "a model split over nodes runs no MTP draft steps");
  int64_t block_size;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    block_size = block_size_.at(cache);
  }
  Writer w(Message::forward);
  w.put(cache);
  w.put(batch.tokens);
  w.put(batch.positions);
  w.put(batch.row_seq);
  w.put(batch.slots);
  const std::vector<int64_t> lengths = table_lengths(batch, block_size);
  w.put(lengths);
  for (size_t s = 0; s < lengths.size(); ++s)
    w.put(std::span<const int32_t>(batch.block_tables[s], size_t(lengths[s])));
  w.put(batch.logit_rows);
  w.put(batch.top_k);
  w.put(batch.hidden_rows);
  w.put(batch.confidence_rows);
  w.put(uint8_t(batch.row_invariant));
  w.put(uint8_t(batch.graph != nullptr));
  if (batch.graph) w.put(batch.graph->values);
  send(w.bytes());
}

void follow_node0(Model& model, NodeLink& node0) {
  std::map<int64_t, KvCache> caches;
  MOET_LOG_INFO("following node 0's steps");
  for (;;) {
    std::vector<uint8_t> message;
    try {
      message = node0.receive();
    } catch (const Error& e) {
      MOET_LOG_WARN("node 0's link closed ({}); stopping", e.what());
      return;
    }
    Reader r(message);
    switch (r.kind()) {
      case Message::stop:
        MOET_LOG_INFO("node 0 stopped; done");
        return;
      case Message::create_cache: {
        const int64_t id = r.get<int64_t>(), blocks = r.get<int64_t>(), block_size = r.get<int64_t>();
        const std::vector<KvLayerSpec> specs = r.get_vector<KvLayerSpec>();
        caches[id] = model.kv_cache_create(specs, blocks, block_size);
        break;
      }
      case Message::destroy_cache:
        caches.erase(r.get<int64_t>());
        break;
      case Message::forward: {
        KvCache& cache = caches.at(r.get<int64_t>());
        ForwardBatch batch;
        batch.tokens = r.get_vector<int32_t>();
        batch.positions = r.get_vector<int32_t>();
        batch.row_seq = r.get_vector<int32_t>();
        batch.slots = r.get_vector<int64_t>();
        const std::vector<int64_t> lengths = r.get_vector<int64_t>();
        std::vector<std::vector<int32_t>> tables;
        for (size_t s = 0; s < lengths.size(); ++s) tables.push_back(r.get_vector<int32_t>());
        for (const auto& table : tables) batch.block_tables.push_back(table.data());
        batch.logit_rows = r.get_vector<int32_t>();
        batch.top_k = r.get<int64_t>();
        batch.hidden_rows = r.get_vector<int32_t>();
        batch.confidence_rows = r.get_vector<int32_t>();
        batch.row_invariant = r.get<uint8_t>() != 0;
        GraphKey key;
        if (r.get<uint8_t>() != 0) {
          key.values = r.get_vector<int64_t>();
          batch.graph = &key;
        }
        try {
          model.forward(batch, cache);
        } catch (const Error& e) {  // node 0's ranks meet the same failure in their collectives
          MOET_LOG_WARN("a step from node 0 failed here: {}", e.what());
        }
        break;
      }
      default:
        fail("node link: an unknown message from node 0");
    }
  }
}

}  // namespace moet
