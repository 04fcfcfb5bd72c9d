#pragma once

#include <meshtensor/core/settings.hpp>
#include <meshtensor/serve/server.hpp>

namespace meshtensor::serve {

/// A server's settings by field name (core/settings.hpp): `meshtensor serve`'s flags. The
/// launch (ranks, backend), the API key (which may come from the environment) and the
/// batch-variant comparison path stay with the front end.
class ServeSettings : public Settings {
 public:
  ServeSettings() : Settings(table()) {}
  /// Every field, in the order help lists them.
  static std::span<const SettingField> table();
  /// The ServeConfig; ParseError naming the field.
  ServeConfig config() const;
};

}  // namespace meshtensor::serve
