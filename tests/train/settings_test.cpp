#include <string>

#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/train/settings.hpp>

namespace meshtensor::train {
namespace {

TrainSettings given(std::initializer_list<std::pair<const char*, const char*>> fields) {
  TrainSettings settings;
  for (const auto& [name, text] : fields)
    settings.set(name, text);
  return settings;
}

TEST(TrainSettings, DefaultsFollowTheTask) {
  const TrainConfig images = TrainSettings().config(/*language=*/false);
  EXPECT_EQ(images.epochs, 8);
  EXPECT_EQ(images.steps, 0);
  EXPECT_EQ(images.batch, 256);
  EXPECT_EQ(images.schedule.warmup_steps, 0);
  EXPECT_EQ(images.eval_every, 0);
  const TrainConfig text = TrainSettings().config(/*language=*/true);
  EXPECT_EQ(text.steps, LanguageDefaults::steps);
  EXPECT_EQ(text.batch, LanguageDefaults::batch);
  EXPECT_EQ(text.schedule.warmup_steps, LanguageDefaults::warmup);
  EXPECT_EQ(text.eval_every, LanguageDefaults::eval_every);
  // Epochs given: a language model counts epochs, and --stop-after counts them too.
  const TrainConfig epochs = given({{"epochs", "2"}, {"stop_after", "1"}}).config(true);
  EXPECT_EQ(epochs.steps, 0);
  EXPECT_EQ(epochs.epochs, 2);
  EXPECT_EQ(epochs.stop_after_epochs, 1);
  EXPECT_EQ(epochs.stop_after, 0);
}

TEST(TrainSettings, APipelineTakesTwoMicroBatchesPerStageRankByDefault) {
  const TrainConfig piped = given({{"mesh", "3x2"}, {"names", "pp,fsdp"}}).config(true);
  EXPECT_EQ(piped.micro_batches, 6);
  EXPECT_EQ(mesh_dim(piped, "pp"), 3);
  EXPECT_EQ(mesh_dim(piped, "tp"), 1);
  EXPECT_EQ(mesh_text(piped), "3x1x2x1 (pp x dp x fsdp x tp)");
  // Never more than the batch has samples; a given count wins.
  EXPECT_EQ(given({{"mesh", "4"}, {"names", "pp"}, {"batch", "5"}}).config(true).micro_batches, 5);
  EXPECT_EQ(
      given({{"mesh", "2"}, {"names", "pp"}, {"micro_batches", "3"}}).config(true).micro_batches,
      3);
  EXPECT_EQ(TrainSettings().config(true).micro_batches, 1);
}

TEST(TrainSettings, AMeshWithoutNamesIsHsdp) {
  const TrainSettings settings = given({{"mesh", "2x4"}});
  const TrainConfig config = settings.config(false);
  EXPECT_EQ(config.strategy, Strategy::hsdp);
  EXPECT_EQ(config.replicas, 2);
  EXPECT_FALSE(config.mesh.has_value());
  EXPECT_EQ(settings.mesh_ranks(), 8);
  EXPECT_EQ(TrainSettings().mesh_ranks(), 0);
}

TEST(TrainSettings, ErrorsNameTheFieldInBackquotes) {
  const auto message = [](TrainSettings settings, bool language = false) {
    try {
      settings.config(language);
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(given({{"steps", "3"}, {"epochs", "2"}})),
            "`epochs` and `steps` exclude each other: give one");
  EXPECT_EQ(message(given({{"momentum", "2"}})), "`momentum` 2 is outside [0, 1]");
  EXPECT_EQ(message(given({{"names", "tp"}})), "`names` names the dims of `mesh`; give `mesh` too");
  EXPECT_EQ(message(given({{"sequence_parallel", "true"}})),
            "`sequence_parallel` needs a tp mesh dim: `mesh` ... `names` ...,tp");
  EXPECT_EQ(message(given({{"save_every", "2"}})),
            "`save_every` and `keep_checkpoints` need `save` DIR");
  EXPECT_EQ(message(given({{"mode", "exact"}, {"reduce_dtype", "bf16"}})),
            "`reduce_dtype` bf16 with `mode` exact: exact mode reduces gradients exactly (use "
            "ordered or native)");
  EXPECT_EQ(message(given({{"mesh", "2x2"}, {"names", "dp,sp"}})),
            "`names`: unknown mesh dim name 'sp' (expected pp, dp, fsdp, cp and tp, each at most "
            "once)");
  EXPECT_EQ(message(given({{"trace", "maybe"}})), "`trace` 'maybe' is not true or false");
  EXPECT_THROW(TrainSettings().set("learning_rate", "1"), InvalidArgument);
}

TEST(TrainSettings, ACallersDefaultGivesWayToWhatTheUserGave) {
  TrainSettings settings;
  settings.set_default("steps", "40");
  settings.set_default("lr", "3e-4");
  EXPECT_EQ(settings.config(false).steps, 40);
  EXPECT_EQ(settings.config(false).schedule.base, 3e-4);
  settings.set("epochs", "2");  // a steps default gives way to epochs
  EXPECT_EQ(settings.config(false).steps, 0);
  settings.set("lr", "0.5");
  EXPECT_EQ(settings.config(false).schedule.base, 0.5);
  EXPECT_FALSE(settings.given("steps"));
  EXPECT_TRUE(settings.given("lr"));
}

TEST(TrainSettings, EveryFieldHasHelpAndTheJsonNamesEverySetting) {
  for (const SettingField& field : TrainSettings::table()) {
    EXPECT_FALSE(field.help.empty()) << field.name;
    EXPECT_TRUE(TrainSettings().has_field(field.name));
  }
  const nlohmann::json json =
      settings_json(given({{"lr", "0.25"}, {"mode", "exact"}}).config(false));
  EXPECT_EQ(json["lr"], 0.25);
  EXPECT_EQ(json["mode"], "exact");
  EXPECT_EQ(json["micro_batch_mode"], "no-sync");
  // Two configs that differ in any one setting differ in their JSON (the run's fingerprint).
  const auto text = [](std::initializer_list<std::pair<const char*, const char*>> fields) {
    return settings_json(given(fields).config(false)).dump();
  };
  EXPECT_NE(text({}), text({{"prefetch", "2"}}));
  EXPECT_NE(text({}), text({{"activation_checkpointing", "full"}}));
  EXPECT_NE(text({}), text({{"seed", "1"}}));
  EXPECT_EQ(text({}), text({{"seed", "0"}}));
}

}  // namespace
}  // namespace meshtensor::train
