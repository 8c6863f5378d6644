// Checkpoints: round trip of model and optimizer state, CRC detection of damage with fallback to
// the previous checkpoint, pruning, and atomicity under SIGKILL at arbitrary moments.
#include <torch/torch.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "ddp/error.h"
#include "ddp/models/classifier.h"
#include "ddp/models/model_spec.h"
#include "ddp/train/checkpoint.h"
#include "test_files.h"

namespace ddp::train {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

Checkpoint make_checkpoint(int64_t step) {
  Checkpoint c;
  c.meta.model = {"mnist_cnn", 1, 12, 12, 10};
  c.meta.class_names = {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"};
  c.meta.epoch = 2;
  c.meta.batch_in_epoch = 7;
  c.meta.global_step = step;
  c.meta.world_size = 3;
  c.meta.seed = 42;
  c.rng_states = torch::randint(0, 255, {3, 16}).to(torch::kByte);
  return c;
}

void sgd_steps(models::Classifier& model, torch::optim::Optimizer& opt, int steps) {
  torch::manual_seed(9);
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    torch::nn::functional::cross_entropy(model.forward(torch::randn({4, 1, 12, 12})),
                                         torch::randint(0, 10, {4}))
        .backward();
    opt.step();
  }
}

TEST(Checkpoint, RoundTripRestoresModelOptimizerAndMeta) {
  TempDir dir;
  auto model = models::create_model({"mnist_cnn", 1, 12, 12, 10}, 1);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  sgd_steps(*model, opt, 3);
  const Checkpoint saved = make_checkpoint(3);
  CheckpointDirectory checkpoints(dir.path(), 3);
  const std::string path = checkpoints.save(3, serialize_checkpoint(saved, *model, &opt));

  auto restored = models::create_model({"mnist_cnn", 1, 12, 12, 10}, 2);  // different weights
  torch::optim::SGD restored_opt(restored->parameters(),
                                 torch::optim::SGDOptions(0.1).momentum(0.9));
  const Checkpoint loaded = load_checkpoint(path, restored.get(), &restored_opt);
  EXPECT_EQ(loaded.meta.model.name, "mnist_cnn");
  EXPECT_EQ(loaded.meta.model.height, 12);
  EXPECT_EQ(loaded.meta.class_names, saved.meta.class_names);
  EXPECT_EQ(loaded.meta.epoch, 2);
  EXPECT_EQ(loaded.meta.batch_in_epoch, 7);
  EXPECT_EQ(loaded.meta.global_step, 3);
  EXPECT_EQ(loaded.meta.world_size, 3);
  EXPECT_EQ(loaded.meta.seed, 42u);
  EXPECT_TRUE(torch::equal(loaded.rng_states, saved.rng_states));

  // Momentum came back too: both continue identically.
  sgd_steps(*model, opt, 2);
  sgd_steps(*restored, restored_opt, 2);
  auto a = model->parameters();
  auto b = restored->parameters();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
}

TEST(Checkpoint, DamagedNewestFallsBackToThePrevious) {
  TempDir dir;
  auto model = models::create_model({"mnist_cnn", 1, 12, 12, 10});
  CheckpointDirectory checkpoints(dir.path(), 3);
  const std::string older =
      checkpoints.save(10, serialize_checkpoint(make_checkpoint(10), *model, nullptr));
  const std::string newer =
      checkpoints.save(20, serialize_checkpoint(make_checkpoint(20), *model, nullptr));
  ASSERT_EQ(checkpoints.latest_valid(), newer);

  auto bytes = testing::read_bytes(newer);
  bytes[bytes.size() / 2] ^= 0x01;  // one bit, in the middle of the weights
  testing::write_bytes(newer, bytes);
  EXPECT_EQ(checkpoints.latest_valid(), older);
  try {
    load_checkpoint(newer, model.get(), nullptr);
    FAIL() << "damaged checkpoint loaded";
  } catch (const DataError& e) {
    EXPECT_EQ(e.file(), newer);
    EXPECT_NE(std::string(e.what()).find("CRC-32"), std::string::npos) << e.what();
  }
}

TEST(Checkpoint, KeepsOnlyTheNewest) {
  TempDir dir;
  auto model = models::create_model({"mnist_cnn", 1, 12, 12, 10});
  CheckpointDirectory checkpoints(dir.path(), 2);
  for (int64_t step : {5, 10, 15, 20}) {
    checkpoints.save(step, serialize_checkpoint(make_checkpoint(step), *model, nullptr));
  }
  const auto files = checkpoints.list();
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(read_checkpoint_meta(files[0]).global_step, 20);
  EXPECT_EQ(read_checkpoint_meta(files[1]).global_step, 15);
}

TEST(Checkpoint, WrongModelIsADataErrorNamingTheFile) {
  TempDir dir;
  auto model = models::create_model({"mnist_cnn", 1, 12, 12, 10});
  const std::string path = CheckpointDirectory(dir.path(), 1)
                               .save(1, serialize_checkpoint(make_checkpoint(1), *model, nullptr));
  auto other = models::create_model({"cifar_cnn", 3, 32, 32, 10});
  try {
    load_checkpoint(path, other.get(), nullptr);
    FAIL() << "loaded into the wrong model";
  } catch (const DataError& e) {
    EXPECT_EQ(e.file(), path);
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
  EXPECT_THROW(load_checkpoint(dir.file("missing.pt"), nullptr, nullptr), DataError);
}

// A writer saving checkpoints in a loop is SIGKILLed at random moments; after every kill the
// directory must still hold a newest checkpoint that verifies and loads, and nothing else under
// a checkpoint's name. Leftover temporary files prove the kills hit writes in progress.
TEST(Checkpoint, SigkillMidWriteNeverLeavesATornCheckpoint) {
  TempDir dir;
  auto model = models::create_model({"mnist_cnn", 1, 28, 28, 10});  // a 4.8 MB checkpoint
  const std::string bytes = serialize_checkpoint(make_checkpoint(0), *model, nullptr);
  std::mt19937 rng(5);
  int kills_mid_write = 0;
  int64_t next_step = 1;
  for (int round = 0; round < 12; ++round) {
    std::fflush(nullptr);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      CheckpointDirectory checkpoints(dir.path(), 2);
      for (int64_t step = next_step;; ++step) checkpoints.save(step, bytes);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 60));
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status));

    CheckpointDirectory checkpoints(dir.path(), 2);
    for (const auto& entry : fs::directory_iterator(dir.path())) {
      if (entry.path().filename().string().find(".tmp-") != std::string::npos) ++kills_mid_write;
    }
    const auto files = checkpoints.list();
    for (const auto& file : files) EXPECT_NO_THROW(read_checkpoint_meta(file)) << file;
    if (!files.empty()) {
      const auto latest = checkpoints.latest_valid();
      ASSERT_TRUE(latest.has_value());
      auto restored = models::create_model({"mnist_cnn", 1, 28, 28, 10}, 3);
      EXPECT_NO_THROW(load_checkpoint(*latest, restored.get(), nullptr));
      EXPECT_TRUE(torch::equal(restored->parameters()[0], model->parameters()[0]));
      next_step = read_checkpoint_meta(files.front()).global_step + 1;
    }
  }
  EXPECT_GT(kills_mid_write, 0) << "no kill landed during a write; the test proved nothing";
  // The next successful save removes the leftovers, once they are older than a live writer's
  // file could be unlocked (here: their times set a minute back).
  CheckpointDirectory checkpoints(dir.path(), 2);
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    fs::last_write_time(entry.path(), fs::file_time_type::clock::now() - std::chrono::minutes(1));
  }
  checkpoints.save(next_step, bytes);
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos);
  }
}

// Two writers in one folder (a world cut off from the one that goes on, saying its last words on
// the shared volume): one's clean-up must not remove the file the other is writing, which it
// holds locked, however old; it removes it once the lock is gone (its writer died).
TEST(Checkpoint, ACleanUpLeavesAnotherLiveWritersFileAlone) {
  TempDir dir;
  auto model = models::create_model({"mnist_cnn", 1, 12, 12, 10});
  const std::string bytes = serialize_checkpoint(make_checkpoint(1), *model, nullptr);
  const std::string other = dir.file(".checkpoint-0000000007-00000000.pt.tmp-999999");
  const int fd = ::open(other.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);  // the other writer, mid-write
  fs::last_write_time(other, fs::file_time_type::clock::now() - std::chrono::minutes(10));
  CheckpointDirectory checkpoints(dir.path(), 2);
  checkpoints.save(1, bytes);
  EXPECT_TRUE(fs::exists(other)) << "removed a live writer's file";
  ::close(fd);  // the other writer died: its lock is gone
  checkpoints.save(2, bytes);
  EXPECT_FALSE(fs::exists(other)) << "left a dead writer's file";
}

}  // namespace
}  // namespace ddp::train
