#include <algorithm>

#include <meshtensor/rl/settings.hpp>

namespace meshtensor::rl {

bool is_trainer_setting(std::string_view name) {
  return std::ranges::find(kTrainerSettingFields, name) != std::end(kTrainerSettingFields);
}

train::TrainSettings trainer_settings() {
  train::TrainSettings settings;
  settings.set_default("lr", "3e-4");
  settings.set_default("schedule", "constant");
  settings.set_default("mode", "exact");
  settings.set_default("clip_grad_norm", "1");
  return settings;
}

}  // namespace meshtensor::rl
