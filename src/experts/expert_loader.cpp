// ExpertLoader implementation (see expert_loader.h).
#include "experts/expert_loader.h"

#include "core/error.h"
#include "core/log.h"
#include "io/pack_source.h"
#include "io/pack_writer.h"

#include <algorithm>
#include <cstring>

namespace moet {
namespace {

StoreFormat store_format_of(ExpertMode mode) {
  return mode == ExpertMode::fp4 ? StoreFormat::fp4 : mode == ExpertMode::w2k ? StoreFormat::w2k : StoreFormat::w2;
}

ExpertFormat expert_format_of(StoreFormat format) {
  return format == StoreFormat::fp4   ? ExpertFormat::fp4
         : format == StoreFormat::w2k ? ExpertFormat::w2k
                                      : ExpertFormat::w2;
}

void check_shape(const SourceView& view, int64_t rows, int64_t cols) {
  MOET_CHECK(view.rows == rows && view.cols == cols, "tensor '{}' has shape [{}, {}] but the config implies [{}, {}]",
             view.name, view.rows, view.cols, rows, cols);
}

}  // namespace

ExpertMode expert_mode_parse(std::string_view name) {
  if (name == "native") return ExpertMode::native;
  if (name == "w2") return ExpertMode::w2;
  if (name == "fp4") return ExpertMode::fp4;
  if (name == "w2k") return ExpertMode::w2k;
  fail("unknown expert format '{}' (expected native, w2, w2k or fp4)", name);
}

const char* expert_mode_name(ExpertMode mode) {
  switch (mode) {
    case ExpertMode::native: return "native";
    case ExpertMode::w2: return "w2";
    case ExpertMode::fp4: return "fp4";
    case ExpertMode::w2k: return "w2k";
  }
  return "?";
}

ExpertLoader::ExpertLoader(const Checkpoint* checkpoint, const ModelConfig& config, const ModelLoadOptions& options)
    : checkpoint_(checkpoint), config_(config), options_(options), pool_(0) {
  if (options_.experts == ExpertMode::native) return;
  const StoreFormat format = store_format_of(options_.experts);
  const int rank = options_.shard.rank, world = options_.shard.size;
  spec_ = checkpoint_ != nullptr
              ? pack_spec_for(*checkpoint_, config_, format, options_.zero_mode, rank, world, pack_quantizer())
              : random_pack_spec(config_, format);
  if (spec_->w2k_quantizer == W2kQuantizer::ldlq) ldlq_ = std::make_unique<LdlqFactors>(options_.ldlq_moments, pool_);
  spec_->rank = rank;
  spec_->world = world;
  slot_.resize(spec_->layout().stride);
  if (options_.pack_dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(options_.pack_dir, ec);
  MOET_CHECK(!ec, "pack directory {} cannot be made: {}", options_.pack_dir.string(), ec.message());
  paths_ = moet::pack_paths(options_.pack_dir, format, rank, world);
  const bool built = checkpoint_ != nullptr
                         ? pack_ensure(*paths_, *spec_, expert_sources(), pool_)
                         : pack_ensure_rows(*paths_, *spec_, [this](int64_t, int64_t, uint8_t* slot) { fill_random(slot); });
  if (!built) MOET_LOG_INFO("reusing {} pack {} (quantization skipped)", store_format_name(format), paths_->pack.string());
  reader_ = PackReader::open(*paths_, *spec_);
}

// Invented experts' packs are identified by the shapes they were invented for (the invention
// is deterministic: the same config gives the same bytes).
PackSpec ExpertLoader::random_pack_spec(const ModelConfig& config, StoreFormat format) {
  PackSpec spec;
  spec.format = format;
  spec.hidden = config.hidden_size;
  spec.intermediate = config.moe_intermediate_size;
  spec.n_layers = config.num_hidden_layers;
  spec.n_experts = config.n_routed_experts;
  for (int64_t l = 0; l < config.num_hidden_layers; ++l)
    if (config.layer_is_moe[size_t(l)]) spec.layers.push_back(l);
  spec.identity = fmt::format("random-v1:{}x{}x{}x{}", config.num_hidden_layers, config.n_routed_experts,
                              config.hidden_size, config.moe_intermediate_size);
  return spec;
}

// Random experts: arbitrary codes, scales near 2^-6 so activations stay finite (UE8M0 121; W2K's
// UE5M3 144). Filled on every core: full-size shapes are tens of GB of codes.
void ExpertLoader::fill_random(uint8_t* slot) {
  const SlotLayout layout = spec_->layout();
  random_.fill(slot, layout.stride, pool_);
  const int scale = spec_->format == StoreFormat::w2k ? 144 : 121;
  std::memset(slot + layout.scales13, scale, layout.codes2 - layout.scales13);
  std::memset(slot + layout.scales2, scale, layout.slot_bytes - layout.scales2);
}

ExpertLoader::~ExpertLoader() = default;

PackQuantizer ExpertLoader::pack_quantizer() const {
  return {options_.w2_quantizer, options_.imatrix.get(), options_.w2k_quantizer, options_.ldlq_moments.get()};
}

// Only the quantizers that read an importance matrix get it (the reference W2K; W2 with the opt
// quantizer); W2K's LDLQ gets its layers' decompositions.
ExpertSourceFn ExpertLoader::expert_sources() const {
  const bool weighed = pack_uses_imatrix(spec_->format, pack_quantizer());
  return checkpoint_expert_sources(*checkpoint_, config_, weighed ? options_.imatrix.get() : nullptr, ldlq_.get());
}

ExpertLayout ExpertLoader::layout() const {
  const ExpertFormat format = spec_ ? expert_format_of(spec_->format) : ExpertFormat::dense;
  return {format, config_.hidden_size, config_.moe_intermediate_size, float(config_.swiglu_limit)};
}

ExpertRowLayout ExpertLoader::row_layout() const {
  MOET_CHECK(spec_.has_value(), "--experts native has no pack rows (tiered residency needs w2, w2k or fp4)");
  const SlotLayout l = spec_->layout();
  return {l.codes13, l.scales13, l.codes2, l.scales2, l.slot_bytes};
}

void ExpertLoader::mark_used(ExpertUploadSink& sink, int64_t layer, int64_t expert) const {
  if (checkpoint_ == nullptr) return;
  const auto names = config_.expert_tensor_names(layer, expert);
  for (const auto* name : {&names.gate, &names.up, &names.down}) sink.mark_used(*name);
}

void ExpertLoader::fill_slot(ExpertUploadSink& sink, int64_t layer, int64_t expert) {
  // A pack holds the decoder's MoE layers; the MTP layer's experts are quantized at every load.
  const bool in_pack = std::find(spec_->layers.begin(), spec_->layers.end(), layer) != spec_->layers.end();
  if (reader_ && in_pack) {
    const PackRead read{layer, expert, slot_.data()};
    reader_->read({&read, 1});
  } else if (checkpoint_ != nullptr) {
    const int64_t hidden = config_.hidden_size, inner = config_.moe_intermediate_size;
    const ExpertSources sources = expert_sources()(layer, expert);
    check_shape(sources.gate, inner, hidden);
    check_shape(sources.up, inner, hidden);
    check_shape(sources.down, hidden, inner);
    pack_quantize_slot(*spec_, sources, pool_, slot_.data());
  } else {
    fill_random(slot_.data());
  }
  mark_used(sink, layer, expert);
}

void ExpertLoader::load_row(ExpertUploadSink& sink, int64_t layer, int64_t expert, uint8_t* row) {
  fill_slot(sink, layer, expert);
  std::memcpy(row, slot_.data(), spec_->layout().slot_bytes);
}

ExpertWeights ExpertLoader::load(ExpertUploadSink& sink, int64_t layer, int64_t expert) {
  const auto names = config_.expert_tensor_names(layer, expert);
  const int64_t hidden = config_.hidden_size, inner = config_.moe_intermediate_size;
  if (!spec_)  // native: dense, quantized sources decoded exactly by the weight loader
    return {sink.dense_stacked(names.gate, names.up, {inner, hidden}), sink.dense(names.down, {hidden, inner})};
  fill_slot(sink, layer, expert);
  return from_slot(sink, slot_.data(), names.gate);
}

ExpertWeights ExpertLoader::from_slot(ExpertUploadSink& sink, const uint8_t* slot, const std::string& name) const {
  const SlotLayout layout = spec_->layout();
  const int64_t hidden = layout.hidden, inner = layout.intermediate;
  const int64_t bits = store_format_bits(spec_->format);
  auto plane = [&](uint64_t offset, uint64_t end, std::vector<int64_t> shape) {
    return sink.upload_plane(HostTensor{name, DType::u8, std::move(shape), slot + offset, size_t(end - offset), "(quantized)"});
  };
  ExpertWeights w;
  w.format = expert_format_of(spec_->format);
  w.gate_up = plane(layout.codes13, layout.scales13, {2 * inner, hidden * bits / 8});
  w.gate_up_scales = plane(layout.scales13, layout.codes2, {2 * inner, hidden / kMxBlock});
  w.down = plane(layout.codes2, layout.scales2, {hidden, inner * bits / 8});
  w.down_scales = plane(layout.scales2, layout.slot_bytes, {hidden, inner / kMxBlock});
  return w;
}

}  // namespace moet
