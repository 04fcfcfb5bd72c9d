#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <meshtensor/core/dtype.hpp>
#include <meshtensor/core/shape.hpp>
#include <meshtensor/mesh/device_mesh.hpp>
#include <meshtensor/mesh/spec.hpp>
#include <meshtensor/plan/planner.hpp>

namespace meshtensor::dtensor {

/// One way an op can run along a single mesh dim: the placement each input needs there and the
/// placement the output gets. An op's strategies on a whole mesh are every combination of its
/// per-dim strategies, one per mesh dim.
struct DimStrategy {
  std::vector<Placement> inputs;  ///< one per input
  Placement output = Placement::replicate();
  /// Collectives the op itself runs over the mesh dims that take this strategy (e.g. the max and
  /// the sums of a vocabulary-parallel loss), and the bytes each sends per rank.
  int internal_collectives = 0;
  std::int64_t internal_bytes = 0;
};

/// An op call as sharding propagation sees it: the inputs' global shapes, their placements and
/// dtypes, and the op's per-dim strategies.
struct OpSchema {
  std::string op;                       ///< "matmul", "add", ...
  std::vector<Shape> shapes;            ///< inputs' global shapes
  std::vector<PlacementSpec> specs;     ///< inputs' placements now
  std::vector<DType> dtypes;            ///< inputs' dtypes
  std::vector<DimStrategy> strategies;  ///< what the op can run on, along one mesh dim
};

/// The strategy propagation chose for an op on the whole mesh.
struct OpStrategy {
  std::vector<PlacementSpec> inputs;  ///< the placement each input is moved to first
  PlacementSpec output = PlacementSpec(std::vector<Placement>{});  ///< the output's placement
  double redistribute_cost_s = 0;    ///< cost-model price of moving the inputs there
  double internal_cost_s = 0;        ///< price of the op's own collectives
  int redistribute_collectives = 0;  ///< collectives the input moves run
  int internal_collectives = 0;      ///< collectives the op runs itself
  std::int64_t candidates = 0;       ///< strategies considered (valid on the mesh and shapes)

  /// Total price.
  double cost_s() const { return redistribute_cost_s + internal_cost_s; }
  /// "S0,R x R,S1 -> S0,S1".
  std::string to_string() const;
};

/// The cheapest strategy for `schema` on `mesh`: every combination of per-dim strategies whose
/// placements fit the shapes is priced with the planner's cost model (the plans that move each
/// input from its placement to the strategy's, plus the op's own collectives); ties go to the
/// combination listed first. Pure: communicates nothing, every rank gets the same answer.
/// InvalidArgument naming the op and the placements when no strategy fits.
OpStrategy select_strategy(const DeviceMesh& mesh, const OpSchema& schema,
                           const plan::PlanOptions& options = {});

/// The three matmul forms training needs, with a of rank ≥ 2 and b of rank 2: `nn` a[..., k] ·
/// b[k, n] -> [..., n] (forward x·W), `nt` a[..., k] · b[n, k]ᵀ -> [..., n] (input gradient
/// dy·Wᵀ), `tn` a[..., m]ᵀ · b[..., n] -> [m, n] summed over every leading dim (weight gradient
/// xᵀ·dy, a and b with the same leading dims).
enum class MatmulForm : std::uint8_t { nn, nt, tn };

/// "nn", "nt", "tn".
std::string matmul_form_name(MatmulForm form);
/// The output shape of a matmul of `form`; InvalidArgument naming both shapes when they do not fit.
Shape matmul_shape(const Shape& a, const Shape& b, MatmulForm form);

/// Matmul strategies per mesh dim: replicated; a batch dim of a sharded (rows of the output);
/// b's output columns sharded; the contraction dim sharded in both (output Partial(sum)); one
/// input Partial(sum) with the other replicated (output Partial(sum)).
std::vector<DimStrategy> matmul_strategies(const Shape& a, const Shape& b, MatmulForm form);
/// Elementwise a + b with b's shape a suffix of a's (broadcast): replicated; any dim sharded in
/// both (b replicated where it has no such dim); both Partial(sum).
std::vector<DimStrategy> add_strategies(const Shape& a, const Shape& b);
/// Elementwise ops of one input: replicated; any dim sharded; Partial(sum) when `linear` (a
/// scale), not for a nonlinear op (GELU).
std::vector<DimStrategy> pointwise_strategies(const Shape& x, bool linear);
/// Ops over the last dim with `params` replicated parameters of that dim (layer norm: 2, softmax:
/// 0): replicated, or any other dim sharded.
std::vector<DimStrategy> row_strategies(const Shape& x, int params);
/// Causal attention of q, k, v [batch, heads, sequence, head_dim]: replicated, or the batch or
/// the heads sharded in all three.
std::vector<DimStrategy> attention_strategies(const Shape& q);
/// Embedding lookup of ids [...] in a table [rows, dim]: replicated; ids sharded (output sharded
/// alike); the table's columns sharded (output's last dim sharded); the table's rows sharded
/// (each rank looks up the rows it holds, zeros for the others: output Partial(sum)).
std::vector<DimStrategy> embedding_strategies(const Shape& table, const Shape& ids);
/// Mean cross-entropy of logits [rows, classes] against labels [rows]: replicated; rows sharded
/// (each rank's sum over its rows divided by the whole row count: output Partial(sum)); classes
/// sharded (the vocabulary-parallel loss: three all-reduces of one value per row inside the op,
/// output replicated).
std::vector<DimStrategy> cross_entropy_strategies(const Shape& logits);

/// The strategy as data: {"op", "inputs", "output", "cost_s", "candidates", ...}.
nlohmann::json to_json(const OpStrategy& strategy);

}  // namespace meshtensor::dtensor
