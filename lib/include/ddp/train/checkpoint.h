#pragma once
// Training checkpoints: model, optimizer, position in the data (epoch and batch), global step,
// every rank's RNG state, and what the model is (so that evaluation can rebuild it).
//
// A checkpoint is written atomically (temporary file in the same directory, fsync, rename, fsync
// of the directory), so a kill at any moment leaves either the previous set of checkpoints or
// the new one, never a torn file under a checkpoint's name. Its CRC-32 is part of its file name
// (checkpoint-<step>-<crc>.pt): a checkpoint damaged later (disk, copy) is detected on load and
// resume falls back to the previous one.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "ddp/models/model_spec.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace ddp::train {

struct CheckpointMeta {
  models::ModelSpec model;
  std::vector<std::string> class_names;
  int64_t epoch = 0;           // the epoch in progress
  int64_t batch_in_epoch = 0;  // batches of `epoch` trained since epoch_offset, at world_size
  int64_t global_step = 0;     // optimizer steps taken
  int world_size = 1;
  // Positions of the epoch's sample order trained before world_size's share of it began: not 0
  // only when the world size changed within the epoch (an elastic job). The epoch has consumed
  // epoch_offset + batch_in_epoch x batch size x world_size positions.
  int64_t epoch_offset = 0;
  // The world size the training began with, against which the learning rate is scaled.
  int reference_world_size = 1;
  uint64_t seed = 0;
};

struct Checkpoint {
  CheckpointMeta meta;
  at::Tensor rng_states;  // uint8 [world_size, state bytes]: each rank's CPU generator
};

// Serialises a checkpoint (model state, optimizer state if given) to bytes.
std::string serialize_checkpoint(const Checkpoint& checkpoint, const torch::nn::Module& model,
                                 const torch::optim::Optimizer* optimizer);

// Reads a checkpoint file. Loads the model's parameters and buffers (shapes must match) and the
// optimizer's state when given. Verifies the CRC when the name carries one. Throws DataError
// naming the file when it is missing, damaged, or does not fit the model.
Checkpoint load_checkpoint(const std::string& path, torch::nn::Module* model,
                           torch::optim::Optimizer* optimizer);
// The same in two halves, for a checkpoint one rank reads and sends to ranks that cannot read
// its file (a volume per pod): the file's verified bytes, and a checkpoint from such bytes
// (`origin` names them in errors).
std::string read_checkpoint_bytes(const std::string& path);
Checkpoint load_checkpoint_bytes(const std::string& bytes, const std::string& origin,
                                 torch::nn::Module* model, torch::optim::Optimizer* optimizer);

// A directory of checkpoints named by step, oldest pruned beyond `keep`.
class CheckpointDirectory {
 public:
  CheckpointDirectory(std::string dir, int keep);

  // Writes atomically; returns the path. Removes checkpoints beyond the newest `keep` and
  // temporary files left by writers that were killed (unlocked, and older than 2 s: a writer
  // holds a lock on its temporary file while it writes, so another writer in the same folder is
  // left alone). Throws DataError if the directory cannot be created or written.
  std::string save(int64_t step, const std::string& bytes);

  // Checkpoint files, newest (highest step) first.
  std::vector<std::string> list() const;

  // The newest checkpoint that reads and verifies (its meta), or nullopt; logs why it skips any.
  std::optional<std::string> latest_valid() const;
  // The step a checkpoint file's name gives (save's names), without reading it; nullopt for
  // another name.
  static std::optional<int64_t> step_of(const std::string& path);

  const std::string& dir() const { return dir_; }

 private:
  void remove_dead_writers_files() const;

  std::string dir_;
  int keep_;
};

// Meta of a checkpoint file without loading model state (verifies the CRC as load does).
CheckpointMeta read_checkpoint_meta(const std::string& path);

// Rebuilds the model a checkpoint names and loads its weights: for evaluation and inference.
std::shared_ptr<models::Classifier> load_model(const std::string& path,
                                               CheckpointMeta* meta = nullptr);

// Writes `bytes` to `path` atomically (see above).
void write_file_atomically(const std::string& path, const std::string& bytes);

}  // namespace ddp::train
