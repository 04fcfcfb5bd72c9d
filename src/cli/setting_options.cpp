#include "setting_options.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "options.hpp"

namespace meshtensor::cli {

void SettingOptions::add_to(CLI::App& command, std::span<const SettingField> fields,
                            const std::vector<std::string_view>& names,
                            const std::map<std::string_view, std::string>& help) {
  for (const std::string_view name : names) {
    const auto field = std::ranges::find(fields, name, &SettingField::name);
    if (field == fields.end()) throw std::logic_error("no setting field " + std::string(name));
    const std::string flag = with_flag_names(fmt::format("`{}`", name));
    const auto own = help.find(name);
    const std::string text = with_flag_names(own != help.end() ? own->second : field->help);
    const std::string key(name);
    options_[key] = field->is_switch ? add_flag(command, flag, switches_[key], text)
                                     : command.add_option(flag, values_[key], text);
  }
}

void SettingOptions::add_all(CLI::App& command, std::span<const SettingField> fields) {
  std::vector<std::string_view> names;
  for (const SettingField& field : fields)
    names.push_back(field.name);
  add_to(command, fields, names);
}

bool SettingOptions::given(std::string_view name) const {
  const auto found = options_.find(name);
  return found != options_.end() && found->second->count() > 0;
}

std::string SettingOptions::value(std::string_view name) const {
  if (!given(name)) return {};
  const auto found = values_.find(name);
  return found != values_.end() ? found->second : std::string("true");
}

void SettingOptions::apply_to(Settings& settings) const {
  for (const auto& [name, option] : options_) {
    if (option->count() == 0) continue;
    const auto value = values_.find(name);
    settings.set(name, value != values_.end() ? value->second : std::string("true"));
  }
}

}  // namespace meshtensor::cli
