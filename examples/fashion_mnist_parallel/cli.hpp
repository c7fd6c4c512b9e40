#pragma once
// The model-parallel examples' command line (settings.hpp says what each option sets).

#include <CLI/CLI.hpp>

#include "settings.hpp"

namespace fashion_mnist {

inline void add_options(CLI::App& app, settings& s) {
  app.add_option("--data", s.data, "directory of the IDX files (.gz or plain)")->capture_default_str();
  app.add_option("--epochs", s.epochs, "passes over the training set")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--pp", s.pp, "pipeline stages")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--tp", s.tp, "tensor-parallel ranks per stage")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--schedule", s.schedule, "pipeline schedule")
      ->check(CLI::IsMember({"gpipe", "gpipe-remat", "1f1b", "interleaved", "pipedream"}))->capture_default_str();
  app.add_option("--micro-batches", s.micro_batches, "micro-batches per step")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--batch", s.global_batch, "global batch (split across replicas)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--lr", s.lr, "learning rate (cosine decay)")->capture_default_str();
  app.add_option("--momentum", s.momentum, "momentum")->capture_default_str();
  app.add_option("--hidden", s.hidden, "hidden layer widths")->delimiter(',')->capture_default_str();
  app.add_option("--log-every", s.log_every, "steps between progress lines (0: none)")->capture_default_str();
  app.add_option("--limit-train", s.limit_train, "use only the first N training samples (0: all)");
  app.add_option("--seed", s.seed, "initialisation and shuffling seed")->capture_default_str();
  app.add_option("--json", s.json, "write a summary as JSON (the reporting rank)");
  app.add_option("--min-accuracy", s.min_accuracy, "exit with status 3 below this test accuracy");
}

}  // namespace fashion_mnist
