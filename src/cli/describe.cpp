#include "describe.hpp"

#include <fmt/format.h>

#include <meshtensor/mesh/layout.hpp>

namespace meshtensor::cli {

namespace {
std::string coordinates_text(const DeviceMesh& mesh, std::int64_t rank) {
  return fmt::format("[{}]", fmt::join(mesh.coordinates(rank), ","));
}

nlohmann::json layout_json(const Layout& layout) {
  return {{"local_shape", layout.local_shape.dims()}, {"global_offset", layout.global_offset}};
}
}  // namespace

std::int64_t listed_ranks(const Transition& t, bool all_ranks) {
  return all_ranks ? t.mesh.size() : std::min(t.mesh.size(), kListedRanks);
}

std::string describe_layouts(const Transition& t, bool all_ranks) {
  std::string out;
  out += fmt::format("mesh   {} ({} ranks)\n", t.mesh.to_string(), t.mesh.size());
  out += fmt::format("shape  {} {}\n", t.shape.to_string(), dtype_name(t.dtype));
  out += fmt::format("from   {}\n", t.from.to_string());
  out += fmt::format("to     {}\n\n", t.to.to_string());
  const std::int64_t listed = listed_ranks(t, all_ranks);
  std::vector<std::string> rows;
  std::size_t from_width = 4;
  for (std::int64_t rank = 0; rank < listed; ++rank) {
    rows.push_back(local_layout(t.mesh, t.from, t.shape, rank).to_string());
    from_width = std::max(from_width, rows.back().size());
  }
  const std::size_t coord_width = std::max<std::size_t>(6, coordinates_text(t.mesh, 0).size());
  out += fmt::format("{:<6}{:<{}}  {:<{}}  {}\n", "rank", "coords", coord_width, "from", from_width,
                     "to");
  for (std::int64_t rank = 0; rank < listed; ++rank) {
    out += fmt::format("{:<6}{:<{}}  {:<{}}  {}\n", rank, coordinates_text(t.mesh, rank),
                       coord_width, rows[static_cast<std::size_t>(rank)], from_width,
                       local_layout(t.mesh, t.to, t.shape, rank).to_string());
  }
  if (listed < t.mesh.size()) {
    out += fmt::format("... {} ranks more (--all-ranks lists every one)\n", t.mesh.size() - listed);
  }
  return out;
}

nlohmann::json layouts_json(const Transition& t, bool all_ranks) {
  const std::int64_t listed = listed_ranks(t, all_ranks);
  nlohmann::json ranks = nlohmann::json::array();
  for (std::int64_t rank = 0; rank < listed; ++rank) {
    ranks.push_back({{"rank", rank},
                     {"coordinates", t.mesh.coordinates(rank)},
                     {"from", layout_json(local_layout(t.mesh, t.from, t.shape, rank))},
                     {"to", layout_json(local_layout(t.mesh, t.to, t.shape, rank))}});
  }
  return {{"mesh", {{"sizes", t.mesh.sizes()}, {"names", t.mesh.names()}}},
          {"shape", t.shape.dims()},
          {"dtype", dtype_name(t.dtype)},
          {"from", t.from.to_string()},
          {"to", t.to.to_string()},
          {"ranks_total", t.mesh.size()},
          {"ranks", std::move(ranks)}};
}

}  // namespace meshtensor::cli
