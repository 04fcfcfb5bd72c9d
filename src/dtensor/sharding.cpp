#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/dtensor/sharding.hpp>

namespace meshtensor::dtensor {

namespace {

Placement R() {
  return Placement::replicate();
}
Placement S(int dim) {
  return Placement::shard(dim);
}
Placement P() {
  return Placement::partial(ReduceOp::sum);
}

std::string join_specs(const std::vector<PlacementSpec>& specs) {
  std::string text;
  for (const PlacementSpec& spec : specs)
    text += (text.empty() ? "" : " x ") + spec.to_string();
  return text;
}

/// The specs of one combination: input i (or the output, i = inputs) takes, on mesh dim m,
/// strategies[choice[m]]'s placement.
PlacementSpec combine(const std::vector<DimStrategy>& strategies, const std::vector<int>& choice,
                      std::size_t input) {
  std::vector<Placement> placements;
  for (const int c : choice) {
    const DimStrategy& s = strategies[static_cast<std::size_t>(c)];
    placements.push_back(input < s.inputs.size() ? s.inputs[input] : s.output);
  }
  return PlacementSpec(std::move(placements));
}

bool fits(const DeviceMesh& mesh, const PlacementSpec& spec, int rank) {
  if (spec.max_shard_dim() >= rank) return false;
  spec.validate(mesh, rank);
  return true;
}

/// The price of the op's own collectives over the mesh dims that take an internal strategy.
double internal_cost(const DeviceMesh& mesh, const std::vector<DimStrategy>& strategies,
                     const std::vector<int>& choice, const plan::CostModel& cost, int& count) {
  std::int64_t ranks = 1;
  count = 0;
  std::int64_t bytes = 0;
  for (std::size_t m = 0; m < choice.size(); ++m) {
    const DimStrategy& s = strategies[static_cast<std::size_t>(choice[m])];
    if (s.internal_collectives == 0) continue;
    ranks *= mesh.size(static_cast<int>(m));
    count = s.internal_collectives;
    bytes = s.internal_bytes;
  }
  if (count == 0 || ranks == 1) {
    count = 0;
    return 0;
  }
  const double rounds = std::ceil(std::log2(static_cast<double>(ranks)));
  return count * (cost.collective_s + cost.round_s * rounds +
                  static_cast<double>(bytes) / cost.bandwidth_bytes_s);
}

/// The candidate of `choice` priced, or false when its placements do not fit the shapes.
bool price(const DeviceMesh& mesh, const OpSchema& schema, const std::vector<int>& choice,
           const plan::PlanOptions& options, OpStrategy& out) {
  out = OpStrategy{};
  for (std::size_t i = 0; i < schema.shapes.size(); ++i) {
    PlacementSpec target = combine(schema.strategies, choice, i);
    if (!fits(mesh, target, schema.shapes[i].rank())) return false;
    if (!(target == schema.specs[i])) {
      std::shared_ptr<const plan::Plan> moved;
      try {
        moved = plan::default_plan_cache().get(mesh, schema.specs[i], target, schema.shapes[i],
                                               schema.dtypes[i], options);
      } catch (const InvalidArgument&) {
        return false;  // no plan reaches this candidate (e.g. Partial(max) to Partial(sum))
      }
      out.redistribute_cost_s += moved->cost_s;
      out.redistribute_collectives += moved->collectives();
    }
    out.inputs.push_back(std::move(target));
  }
  out.output = combine(schema.strategies, choice, schema.shapes.size());
  out.internal_cost_s =
      internal_cost(mesh, schema.strategies, choice, options.cost, out.internal_collectives);
  return true;
}

/// Advances `choice` like an odometer over `options` values per digit; false after the last.
bool next_choice(std::vector<int>& choice, int options) {
  for (std::size_t m = choice.size(); m-- > 0;) {
    if (++choice[m] < options) return true;
    choice[m] = 0;
  }
  return false;
}

void check_schema(const DeviceMesh& mesh, const OpSchema& schema) {
  if (schema.specs.size() != schema.shapes.size() || schema.dtypes.size() != schema.shapes.size())
    throw InvalidArgument(fmt::format("{}: {} shapes, {} placements and {} dtypes", schema.op,
                                      schema.shapes.size(), schema.specs.size(),
                                      schema.dtypes.size()));
  for (std::size_t i = 0; i < schema.shapes.size(); ++i)
    schema.specs[i].validate(mesh, schema.shapes[i].rank());
}

}  // namespace

std::string OpStrategy::to_string() const {
  return join_specs(inputs) + " -> " + output.to_string();
}

OpStrategy select_strategy(const DeviceMesh& mesh, const OpSchema& schema,
                           const plan::PlanOptions& options) {
  check_schema(mesh, schema);
  const int options_per_dim = static_cast<int>(schema.strategies.size());
  std::vector<int> choice(static_cast<std::size_t>(mesh.ndim()), 0);
  OpStrategy best;
  std::int64_t candidates = 0;
  bool more = options_per_dim > 0;
  while (more) {
    OpStrategy candidate;
    if (price(mesh, schema, choice, options, candidate)) {
      ++candidates;
      if (candidates == 1 || candidate.cost_s() < best.cost_s()) best = std::move(candidate);
    }
    more = next_choice(choice, options_per_dim);
  }
  if (candidates == 0) {
    throw InvalidArgument(
        fmt::format("{}: no sharding strategy fits inputs {} of shapes on mesh {}", schema.op,
                    join_specs(schema.specs), mesh.to_string()));
  }
  best.candidates = candidates;
  return best;
}

std::string matmul_form_name(MatmulForm form) {
  switch (form) {
    case MatmulForm::nn:
      return "nn";
    case MatmulForm::nt:
      return "nt";
    case MatmulForm::tn:
      return "tn";
  }
  return "?";
}

Shape matmul_shape(const Shape& a, const Shape& b, MatmulForm form) {
  const auto bad = [&](const std::string& why) {
    return InvalidArgument(fmt::format("matmul ({}): a {} and b {} {}", matmul_form_name(form),
                                       a.to_string(), b.to_string(), why));
  };
  if (a.rank() < 2) throw bad("(a needs at least 2 dims)");
  std::vector<std::int64_t> dims = a.dims();
  if (form == MatmulForm::tn) {
    if (!(std::vector<std::int64_t>(a.dims().begin(), a.dims().end() - 1) ==
          std::vector<std::int64_t>(b.dims().begin(), b.dims().end() - 1)) ||
        b.rank() != a.rank())
      throw bad("do not share their leading dims");
    return Shape{a[a.rank() - 1], b[b.rank() - 1]};
  }
  if (b.rank() != 2) throw bad("(b needs 2 dims)");
  const std::int64_t k = a[a.rank() - 1];
  const bool fits = form == MatmulForm::nn ? b[0] == k : b[1] == k;
  if (!fits) throw bad("do not share the contraction dim");
  dims.back() = form == MatmulForm::nn ? b[1] : b[0];
  return Shape(dims);
}

std::vector<DimStrategy> matmul_strategies(const Shape& a, const Shape& b, MatmulForm form) {
  const int last = a.rank() - 1;
  std::vector<DimStrategy> s{{{R(), R()}, R()}};
  if (form == MatmulForm::tn) {
    s.push_back({{S(last), R()}, S(0)});
    s.push_back({{R(), S(b.rank() - 1)}, S(1)});
    for (int d = 0; d < last; ++d)
      s.push_back({{S(d), S(d)}, P()});
  } else {
    for (int d = 0; d < last; ++d)
      s.push_back({{S(d), R()}, S(d)});
    const int n_dim = form == MatmulForm::nn ? 1 : 0;
    s.push_back({{R(), S(n_dim)}, S(last)});
    s.push_back({{S(last), S(1 - n_dim)}, P()});
  }
  s.push_back({{P(), R()}, P()});
  s.push_back({{R(), P()}, P()});
  return s;
}

std::vector<DimStrategy> add_strategies(const Shape& a, const Shape& b) {
  const int offset = a.rank() - b.rank();
  std::vector<DimStrategy> s{{{R(), R()}, R()}};
  for (int d = 0; d < a.rank(); ++d)
    s.push_back({{S(d), d >= offset ? S(d - offset) : R()}, S(d)});
  s.push_back({{P(), P()}, P()});
  return s;
}

std::vector<DimStrategy> pointwise_strategies(const Shape& x, bool linear) {
  std::vector<DimStrategy> s{{{R()}, R()}};
  for (int d = 0; d < x.rank(); ++d)
    s.push_back({{S(d)}, S(d)});
  if (linear) s.push_back({{P()}, P()});
  return s;
}

std::vector<DimStrategy> row_strategies(const Shape& x, int params) {
  const auto inputs = [&](const Placement& first) {
    std::vector<Placement> p{first};
    p.resize(static_cast<std::size_t>(params) + 1, R());
    return p;
  };
  std::vector<DimStrategy> s{{inputs(R()), R()}};
  for (int d = 0; d + 1 < x.rank(); ++d)
    s.push_back({inputs(S(d)), S(d)});
  return s;
}

std::vector<DimStrategy> attention_strategies(const Shape& /*q*/) {
  return {{{R(), R(), R()}, R()}, {{S(0), S(0), S(0)}, S(0)}, {{S(1), S(1), S(1)}, S(1)}};
}

std::vector<DimStrategy> embedding_strategies(const Shape& /*table*/, const Shape& ids) {
  std::vector<DimStrategy> s{{{R(), R()}, R()}};
  for (int d = 0; d < ids.rank(); ++d)
    s.push_back({{R(), S(d)}, S(d)});
  s.push_back({{S(1), R()}, S(ids.rank())});
  s.push_back({{S(0), R()}, P()});
  return s;
}

std::vector<DimStrategy> cross_entropy_strategies(const Shape& logits) {
  std::vector<DimStrategy> s{{{R(), R()}, R()}, {{S(0), S(0)}, P()}};
  DimStrategy vocabulary{{S(1), R()}, R()};
  vocabulary.internal_collectives = 3;  // row maxima, exponential sums, target logits
  vocabulary.internal_bytes = logits[0] * static_cast<std::int64_t>(sizeof(double));
  s.push_back(vocabulary);
  return s;
}

nlohmann::json to_json(const OpStrategy& strategy) {
  nlohmann::json inputs = nlohmann::json::array();
  for (const PlacementSpec& spec : strategy.inputs)
    inputs.push_back(spec.to_string());
  return {{"inputs", inputs},
          {"output", strategy.output.to_string()},
          {"cost_s", strategy.cost_s()},
          {"redistribute_collectives", strategy.redistribute_collectives},
          {"internal_collectives", strategy.internal_collectives},
          {"candidates", strategy.candidates}};
}

}  // namespace meshtensor::dtensor
