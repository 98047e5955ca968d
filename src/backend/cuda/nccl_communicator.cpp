// NCCL communicators over CUDA backends (see nccl_communicator.h). NCCL's functions come from the
// library loaded at first use; their types from nccl.h. Sums are F32 (ncclFloat32, ncclSum); other
// collectives move bytes (ncclUint8), any dtype. all_to_all is one ncclSend and one ncclRecv per peer
// inside a group (NCCL's own all-to-all pattern), barrier an all-reduce of one float and a wait.
#include "backend/cuda/nccl_communicator.h"

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "core/error.h"

#include <dlfcn.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <vector>

namespace moet {
namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(NcclId), "NcclId must hold an ncclUniqueId");

// NCCL's entry points, from the library loaded at run time.
struct NcclApi {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) init_rank = nullptr;
  decltype(&ncclCommDestroy) destroy = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclAllReduce) all_reduce = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&ncclBroadcast) broadcast = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
};

const NcclApi& nccl() {
  static const NcclApi api = [] {
    const char* env = std::getenv("MOET_NCCL_LIBRARY");
    const std::string path = env != nullptr && *env != '\0' ? env : "libnccl.so.2";
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    MOET_CHECK(handle != nullptr, "NCCL: cannot load {} ({}); a split model on --device cuda needs NCCL (name the "
               "library with MOET_NCCL_LIBRARY)", path, dlerror());
    NcclApi a;
    const auto load = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
      MOET_CHECK(fn != nullptr, "NCCL: {} has no {}", path, name);
    };
    load(a.get_version, "ncclGetVersion");
    load(a.get_unique_id, "ncclGetUniqueId");
    load(a.init_rank, "ncclCommInitRank");
    load(a.destroy, "ncclCommDestroy");
    load(a.abort, "ncclCommAbort");
    load(a.error_string, "ncclGetErrorString");
    load(a.all_reduce, "ncclAllReduce");
    load(a.all_gather, "ncclAllGather");
    load(a.reduce_scatter, "ncclReduceScatter");
    load(a.broadcast, "ncclBroadcast");
    load(a.send, "ncclSend");
    load(a.recv, "ncclRecv");
    load(a.group_start, "ncclGroupStart");
    load(a.group_end, "ncclGroupEnd");
    return a;
  }();
  return api;
}

void nccl_check(ncclResult_t result, const char* op) {
  if (result != ncclSuccess) fail("NCCL {}: {}", op, nccl().error_string(result));
}

// The element type and count NCCL moves for `t`: F32 as floats, anything else as bytes.
std::pair<ncclDataType_t, size_t> nccl_elements(const Tensor& t) {
  if (t.dtype == DType::f32) return {ncclFloat32, size_t(t.numel())};
  return {ncclUint8, t.bytes()};
}

struct GroupState {
  std::mutex mutex;
  std::vector<ncclComm_t> comms;  // every live communicator of the group
  bool aborted = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(GroupState& group, ncclComm_t comm, int rank, int size, CudaBackend& backend)
      : group_(group), backend_(backend), comm_(comm), rank_(rank), size_(size), stream_(backend.stream()),
        token_(backend.alloc({1})) {}

  ~NcclCommunicator() override {
    std::lock_guard<std::mutex> lock(group_.mutex);
    if (group_.aborted) return;  // ncclCommAbort freed it
    std::erase(group_.comms, comm_);
    nccl().destroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return fmt::format("NCCL {} (rank {} of {})", nccl_version(), rank_, size_); }

  void all_reduce(Tensor& x) override {
    MOET_CHECK(x.dtype == DType::f32, "all_reduce: sums are F32 (got {})", dtype_name(x.dtype));
    nccl_check(nccl().all_reduce(x.data, x.data, size_t(x.numel()), ncclFloat32, ncclSum, comm_, stream_),
               "all_reduce");
    done("all_reduce", x);
  }

  void all_gather(const Tensor& in, Tensor& out) override {
    communicator_check("all_gather", in, out, 1, size_);
    const auto [type, count] = nccl_elements(in);
    nccl_check(nccl().all_gather(in.data, out.data, count, type, comm_, stream_), "all_gather");
    done("all_gather", in);
  }

  void reduce_scatter(const Tensor& in, Tensor& out) override {
    MOET_CHECK(in.dtype == DType::f32, "reduce_scatter: sums are F32 (got {})", dtype_name(in.dtype));
    communicator_check("reduce_scatter", in, out, size_, 1);
    nccl_check(nccl().reduce_scatter(in.data, out.data, size_t(out.numel()), ncclFloat32, ncclSum, comm_, stream_),
               "reduce_scatter");
    done("reduce_scatter", in);
  }

  void all_to_all(const Tensor& in, Tensor& out) override {
    communicator_check("all_to_all", in, out, size_, size_);
    const size_t chunk = in.bytes() / size_t(size_);
    nccl_check(nccl().group_start(), "group_start");
    for (int peer = 0; peer < size_; ++peer) {
      nccl_check(nccl().send(static_cast<const uint8_t*>(in.data) + size_t(peer) * chunk, chunk, ncclUint8, peer, comm_,
                             stream_), "send");
      nccl_check(nccl().recv(static_cast<uint8_t*>(out.data) + size_t(peer) * chunk, chunk, ncclUint8, peer, comm_,
                             stream_), "recv");
    }
    nccl_check(nccl().group_end(), "group_end");
    done("all_to_all", in);
  }

  void broadcast(Tensor& x, int root) override {
    MOET_CHECK(root >= 0 && root < size_, "broadcast: root {} outside [0, {})", root, size_);
    const auto [type, count] = nccl_elements(x);
    nccl_check(nccl().broadcast(x.data, x.data, count, type, root, comm_, stream_), "broadcast");
    done("broadcast", x);
  }

  void barrier() override {
    all_reduce(token_);
    cuda_check(cudaStreamSynchronize(stream_), "barrier");
  }

 private:
  // The backend's check and per-op profile entry of collective `op` over `t` ("all_reduce[bytes=N]").
  void done(const char* op, const Tensor& t) { backend_.collective_done(fmt::format("{}[bytes={}]", op, t.bytes())); }

  GroupState& group_;
  CudaBackend& backend_;
  ncclComm_t comm_;
  const int rank_, size_;
  cudaStream_t stream_;
  Tensor token_;  // one float the barrier sums
};

class NcclCommGroup final : public CommGroup {
 public:
  NcclCommGroup(const NcclId& id, int size, int first_rank, int local_size)
      : size_(size), first_rank_(first_rank), local_size_(local_size) {
    MOET_CHECK(size >= 1 && local_size >= 1 && first_rank >= 0 && first_rank + local_size <= size,
               "NCCL: local ranks [{}, {}) do not fit {} ranks", first_rank, first_rank + local_size, size);
    std::memcpy(&id_, id.data(), sizeof id_);
  }

  int size() const override { return size_; }
  int local_size() const override { return local_size_; }
  int first_rank() const override { return first_rank_; }

  std::unique_ptr<Communicator> connect(int local, Backend& backend) override {
    auto* cuda = dynamic_cast<CudaBackend*>(&backend);
    MOET_CHECK(cuda != nullptr, "NCCL communicators need CUDA backends, not {}", backend.name());
    MOET_CHECK(local >= 0 && local < local_size_, "NCCL: local rank {} outside [0, {})", local, local_size_);
    ncclComm_t comm = nullptr;
    nccl_check(nccl().init_rank(&comm, size_, id_, first_rank_ + local), "ncclCommInitRank");
    std::lock_guard<std::mutex> lock(state_.mutex);
    state_.comms.push_back(comm);
    return std::make_unique<NcclCommunicator>(state_, comm, first_rank_ + local, size_, *cuda);
  }

  void abort(const std::string& why) override {
    std::lock_guard<std::mutex> lock(state_.mutex);
    if (state_.aborted) return;
    state_.aborted = true;
    for (ncclComm_t comm : state_.comms) nccl().abort(comm);
    state_.comms.clear();
    (void)why;  // the caller reports it
  }

  bool reset() override { return !state_.aborted; }

 private:
  ncclUniqueId id_{};
  const int size_, first_rank_, local_size_;
  GroupState state_;
};

}  // namespace

std::string nccl_version() {
  int version = 0;
  nccl_check(nccl().get_version(&version), "ncclGetVersion");
  // NCCL_VERSION(X, Y, Z) = X * 10000 + Y * 100 + Z from 2.9 on.
  return fmt::format("{}.{}.{}", version / 10000, version / 100 % 100, version % 100);
}

NcclId nccl_unique_id() {
  ncclUniqueId id;
  nccl_check(nccl().get_unique_id(&id), "ncclGetUniqueId");
  NcclId out;
  std::memcpy(out.data(), &id, sizeof id);
  return out;
}

std::unique_ptr<CommGroup> nccl_comm_group_create(const NcclId& id, int size, int first_rank, int local_size) {
  return std::make_unique<NcclCommGroup>(id, size, first_rank, local_size);
}

}  // namespace moet
