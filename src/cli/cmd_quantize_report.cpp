// `moet quantize-report`: the format study over every routed expert tensor of a checkpoint. Per
// tensor: the sign-bias study (formats/sign_study.h: W2 symmetric vs W2-asym bias and relative RMS
// error in unit space, the asymmetric levels and the best symmetric {+-a, +-b} set) and the
// relative and importance-weighted RMSE (formats/quant_error.h; --imatrix) of each format of
// --error-formats (w2, w2-opt, w2k, mxfp4); then a summary with the seed's acceptance gates and
// each format's mean errors. --csv / --json write the per-tensor rows for plots.
#include "cli/commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "io/model_config.h"
#include "models/arch/arch.h"
#include "io/pack_source.h"
#include "formats/quant_error.h"
#include "formats/sign_study.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

namespace moet::cli {
namespace {

struct ReportOptions {
  std::string model, zero_mode = "auto", csv, json, imatrix, error_formats = "w2,w2-opt,w2k";
  int threads = 0;
  int64_t max_experts = 0;
  bool quiet = false;
};

struct Row {
  std::string name;
  TensorStudy study;
  std::vector<QuantError> errors;  // one per --error-formats entry
};

// An --error-formats entry: the stored format and its quantizer.
struct ErrorFormat {
  std::string name;
  StoreFormat format;
  W2Quantizer w2;
};

std::vector<ErrorFormat> error_formats_parse(const std::string& list) {
  std::vector<ErrorFormat> formats;
  size_t begin = 0;
  while (begin < list.size()) {
    const size_t end = std::min(list.find(',', begin), list.size());
    const std::string name = list.substr(begin, end - begin);
    if (name == "w2-opt") {
      formats.push_back({name, StoreFormat::w2, W2Quantizer::opt});
    } else {
      MOET_CHECK(name == "w2" || name == "w2k" || name == "mxfp4",
                 "--error-formats: unknown format '{}' (expected w2, w2-opt, w2k, mxfp4)", name);
      formats.push_back({name, store_format_parse(name == "mxfp4" ? "fp4" : name), W2Quantizer::reference});
    }
    begin = end + 1;
  }
  return formats;
}

std::string set_name(int index) {
  const SymmetricSet& s = sign_study_sets()[size_t(index)];
  return fmt::format("{{+-{:g},+-{:g}}}", s.a, s.b);
}

nlohmann::json row_json(const Row& r, const std::vector<ErrorFormat>& formats) {
  const TensorStudy& t = r.study;
  nlohmann::json errors = nlohmann::json::object();
  for (size_t i = 0; i < formats.size(); ++i)
    errors[formats[i].name] = {{"rel_rmse", r.errors[i].rel_rmse},
                               {"weighted_rel_rmse", r.errors[i].weighted_rel_rmse}};
  return {{"tensor", r.name}, {"zero_mode", zero_mode_name(t.zero_mode)},
          {"bias_sym", t.sym.bias}, {"rel_rms_sym", t.sym.rel_rms},
          {"bias_asym", t.asym.bias}, {"rel_rms_asym", t.asym.rel_rms},
          {"asym_levels", t.asym_codebook.levels}, {"best_set", set_name(t.best_set)},
          {"histogram", t.histogram}, {"errors", errors}};
}

void write_csv(const std::string& path, const std::vector<Row>& rows) {
  std::ofstream out(path);
  MOET_CHECK(out.good(), "{}: cannot write", path);
  out << "tensor,zero_mode,bias_sym,rel_rms_sym,bias_asym,rel_rms_asym,l0,l1,l2,l3,best_set\n";
  for (const Row& r : rows) {
    const TensorStudy& t = r.study;
    const auto& l = t.asym_codebook.levels;
    out << fmt::format("{},{},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},\"{}\"\n", r.name,
                       zero_mode_name(t.zero_mode), t.sym.bias, t.sym.rel_rms, t.asym.bias, t.asym.rel_rms,
                       l[0], l[1], l[2], l[3], set_name(t.best_set));
  }
}

nlohmann::json summarize(const std::vector<Row>& rows, const std::vector<ErrorFormat>& formats) {
  double bias_sym = 0, bias_asym = 0, abs_sym = 0, abs_asym = 0, rms_ratio = 0;
  int64_t asym_negative = 0, w2_wins = 0;
  std::map<std::string, int64_t> picks;
  for (const Row& r : rows) {
    const TensorStudy& t = r.study;
    bias_sym += t.sym.bias;
    bias_asym += t.asym.bias;
    abs_sym += std::fabs(t.sym.bias);
    abs_asym += std::fabs(t.asym.bias);
    rms_ratio += t.asym.rel_rms > 0 ? t.sym.rel_rms / t.asym.rel_rms : 1.0;
    asym_negative += t.asym.bias < 0;
    w2_wins += t.best_set == sign_study_w2_set();
    ++picks[set_name(t.best_set)];
  }
  const double n = double(std::max<size_t>(rows.size(), 1));
  nlohmann::json s = {{"tensors", rows.size()}, {"mean_bias_sym", bias_sym / n}, {"mean_bias_asym", bias_asym / n},
                      {"mean_abs_bias_sym", abs_sym / n}, {"mean_abs_bias_asym", abs_asym / n},
                      {"asym_negative_fraction", double(asym_negative) / n},
                      {"mean_rms_ratio_sym_over_asym", rms_ratio / n},
                      {"w2_set_fraction", double(w2_wins) / n}, {"set_picks", picks}};
  s["gate_bias"] = std::fabs(bias_sym / n) < 0.005 && abs_sym < abs_asym / 5;
  s["gate_set"] = double(w2_wins) / n > 0.9;
  s["gate_rms"] = rms_ratio / n < 1.05;
  for (size_t i = 0; i < formats.size(); ++i) {
    double rel = 0, weighted = 0;
    for (const Row& r : rows) rel += r.errors[i].rel_rmse, weighted += r.errors[i].weighted_rel_rmse;
    s["errors"][formats[i].name] = {{"mean_rel_rmse", rel / n}, {"mean_weighted_rel_rmse", weighted / n},
                                    {"bits_per_weight", formats[i].format == StoreFormat::fp4 ? 4.25 : 2.25}};
  }
  return s;
}

void run(const ReportOptions& o) {
  const Checkpoint ckpt = Checkpoint::open(o.model);
  const ModelConfig config = model_config_parse(ckpt.config());
  const ZeroMode mode = zero_mode_parse(o.zero_mode);
  const std::vector<ErrorFormat> formats = error_formats_parse(o.error_formats);
  const std::shared_ptr<const Imatrix> imatrix =
      o.imatrix.empty() ? nullptr : std::make_shared<const Imatrix>(imatrix_read(o.imatrix));
  if (imatrix) imatrix_check(*imatrix, config, o.imatrix);
  ThreadPool pool(o.threads);
  std::vector<Row> rows;
  const int64_t experts = o.max_experts > 0 ? std::min(o.max_experts, config.n_routed_experts) : config.n_routed_experts;
  if (!o.quiet) std::printf("%-60s %4s %10s %9s %10s %9s  %-28s %s\n", "tensor", "zero", "bias_sym", "rms_sym",
                            "bias_asym", "rms_asym", "asym levels", "best set");
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    if (!config.layer_is_moe[size_t(layer)]) continue;
    for (int64_t e = 0; e < experts; ++e) {
      const auto names = config.expert_tensor_names(layer, e);
      for (const std::string* tensor : {&names.gate, &names.up, &names.down}) {
        const std::string& name = *tensor;
        const SourceView source = checkpoint_source_view(ckpt, name);
        rows.push_back({name, sign_study(source, mode, pool), {}});
        const float* importance = imatrix ? imatrix->input(layer, e, tensor == &names.down) : nullptr;
        for (const ErrorFormat& f : formats) {
          const QuantizeOptions options{mode, f.w2, importance};
          const BlockTensor q = quantize(f.format, source, options, pool);
          rows.back().errors.push_back(quant_error(source, q, f.format, importance));
        }
        const TensorStudy& t = rows.back().study;
        const auto& l = t.asym_codebook.levels;
        if (!o.quiet)
          std::printf("%-60s %4s %+10.5f %9.5f %+10.5f %9.5f  {%+.2f,%+.2f,%+.2f,%+.2f} %s\n", name.c_str(),
                      zero_mode_name(t.zero_mode), t.sym.bias, t.sym.rel_rms, t.asym.bias, t.asym.rel_rms,
                      l[0], l[1], l[2], l[3], set_name(t.best_set).c_str());
      }
    }
  }
  const nlohmann::json summary = summarize(rows, formats);
  std::printf("summary: %s\n", summary.dump(2).c_str());
  if (!o.csv.empty()) write_csv(o.csv, rows);
  if (!o.json.empty()) {
    nlohmann::json j = {{"model", o.model}, {"zero_mode", o.zero_mode}, {"summary", summary}, {"tensors", nlohmann::json::array()}};
    for (const Row& r : rows) j["tensors"].push_back(row_json(r, formats));
    std::ofstream out(o.json);
    MOET_CHECK(out.good(), "{}: cannot write", o.json);
    out << j.dump(1) << "\n";
  }
}

}  // namespace

void register_quantize_report(CLI::App& app, Actions& actions) {
  auto o = std::make_shared<ReportOptions>();
  CLI::App* sub = app.add_subcommand("quantize-report", "format study per expert tensor: sign bias (W2 symmetric vs "
                                     "asymmetric) and each format's relative / importance-weighted RMSE");
  sub->add_option("--model", o->model, "model folder: config.json + *.safetensors")->required();
  sub->add_option("--zero-mode", o->zero_mode, "sign of exact zeros: auto|sign|alt");
  sub->add_option("--max-experts", o->max_experts, "study only the first N experts of each layer (0 = all)");
  sub->add_option("--csv", o->csv, "write per-tensor rows as CSV");
  sub->add_option("--json", o->json, "write per-tensor rows and the summary as JSON");
  sub->add_option("--imatrix", o->imatrix,
                  "importance matrix (`moet imatrix`): w2-opt and w2k weigh their error by it, and the weighted RMSE "
                  "uses it (else every column weighs 1)");
  sub->add_option("--error-formats", o->error_formats,
                  "comma-separated formats whose relative and weighted RMSE to report: w2, w2-opt, w2k, mxfp4 "
                  "(empty: none)");
  sub->add_option("--threads", o->threads, "worker threads (0 = one per core)");
  sub->add_flag("--quiet", o->quiet, "print only the summary");
  actions[sub] = [o] { run(*o); };
}

}  // namespace moet::cli
