#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <meshtensor/dtensor/comm_debug.hpp>

namespace meshtensor::dtensor {

namespace {

thread_local CommDebugMode* active_mode = nullptr;

}  // namespace

CommDebugMode::CommDebugMode() : outer_(active_mode) {
  active_mode = this;
}

CommDebugMode::~CommDebugMode() {
  active_mode = outer_;
}

CommDebugMode* CommDebugMode::active() {
  return active_mode;
}

std::int64_t CommDebugMode::count(std::string_view kind) const {
  std::int64_t n = 0;
  for (const OpRecord& op : ops_)
    for (const CollectiveRecord& c : op.collectives)
      if (kind.empty() || c.kind == kind) ++n;
  return n;
}

std::map<std::string, std::int64_t> CommDebugMode::counts() const {
  std::map<std::string, std::int64_t> counts;
  for (const OpRecord& op : ops_)
    for (const CollectiveRecord& c : op.collectives)
      ++counts[c.kind];
  return counts;
}

std::string CommDebugMode::to_text() const {
  std::string text;
  for (const OpRecord& op : ops_) {
    text += fmt::format("{:<13} given {:<24} runs {} (cost {:.3g} us, {} candidates)\n", op.op,
                        fmt::join(op.given, " x "), op.strategy.to_string(),
                        op.strategy.cost_s() * 1e6, op.strategy.candidates);
    for (const CollectiveRecord& c : op.collectives) {
      text += fmt::format("  {:<15} over {} ({} ranks) {} bytes: {}\n", c.kind,
                          fmt::join(c.mesh_dims, ","), c.group_size, c.send_bytes, c.purpose);
    }
  }
  return text;
}

nlohmann::json CommDebugMode::to_json() const {
  nlohmann::json ops = nlohmann::json::array();
  for (const OpRecord& op : ops_) {
    nlohmann::json collectives = nlohmann::json::array();
    for (const CollectiveRecord& c : op.collectives) {
      collectives.push_back({{"kind", c.kind},
                             {"mesh_dims", c.mesh_dims},
                             {"group_size", c.group_size},
                             {"send_bytes", c.send_bytes},
                             {"purpose", c.purpose}});
    }
    ops.push_back({{"op", op.op},
                   {"given", op.given},
                   {"strategy", dtensor::to_json(op.strategy)},
                   {"collectives", collectives},
                   {"materializes_full_tensor", op.materializes_full_tensor}});
  }
  return {{"ops", ops}, {"counts", counts()}};
}

void CommDebugMode::begin_op(OpRecord record) {
  ops_.push_back(std::move(record));
  open_ = true;
}

void CommDebugMode::end_op() {
  open_ = false;
}

OpRecord& CommDebugMode::current(const std::string& fallback_op) {
  if (!open_) ops_.push_back(OpRecord{fallback_op, {}, {}, {}});
  return ops_.back();
}

void CommDebugMode::add_plan(const plan::Plan& plan, std::int64_t rank,
                             const std::string& purpose) {
  const bool standalone = !open_;
  OpRecord& record = current("redistribute");
  if (standalone) {
    record.given = {plan.from.to_string()};
    record.strategy.inputs = {plan.to};
    record.strategy.output = plan.to;
    record.strategy.redistribute_cost_s = plan.cost_s;
    record.strategy.redistribute_collectives = plan.collectives();
    record.strategy.candidates = 1;
  }
  record.materializes_full_tensor =
      record.materializes_full_tensor || plan.materializes_full_tensor;
  for (const plan::Step& step : plan.steps) {
    if (!plan::is_collective(step.kind)) continue;
    CollectiveRecord c;
    c.kind = std::string(plan::step_kind_name(step.kind));
    for (const int dim : step.group)
      c.mesh_dims.push_back(plan.mesh.dim_name(dim));
    c.group_size = step.group_size;
    c.send_bytes = step.traffic.send_bytes.at(static_cast<std::size_t>(rank));
    c.purpose = purpose;
    record.collectives.push_back(std::move(c));
  }
}

bool CommDebugMode::materialized_full_tensor() const {
  return std::any_of(ops_.begin(), ops_.end(),
                     [](const OpRecord& op) { return op.materializes_full_tensor; });
}

void CommDebugMode::add_collective(CollectiveRecord record) {
  current("collective").collectives.push_back(std::move(record));
}

OpScope::OpScope(const std::string& op, const std::vector<std::string>& given,
                 const OpStrategy& strategy)
    : mode_(CommDebugMode::active()) {
  if (mode_ != nullptr) mode_->begin_op(OpRecord{op, given, strategy, {}});
}

OpScope::~OpScope() {
  if (mode_ != nullptr) mode_->end_op();
}

}  // namespace meshtensor::dtensor
