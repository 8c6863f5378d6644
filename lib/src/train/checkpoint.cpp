#include "ddp/train/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <zlib.h>

#include "ddp/error.h"
#include "ddp/log.h"
#include "ddp/models/classifier.h"

namespace ddp::train {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kFormatVersion = 1;
const std::regex kCheckpointName(R"(checkpoint-(\d+)-([0-9a-f]{8})\.pt)");

uint32_t crc32_of(const std::string& bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* data = reinterpret_cast<const Bytef*>(bytes.data());
  std::size_t left = bytes.size();
  while (left > 0) {
    const auto chunk = static_cast<uInt>(std::min<std::size_t>(left, 1u << 30));
    crc = crc32(crc, data, chunk);
    data += chunk;
    left -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

std::string errno_text() { return std::strerror(errno); }

void write_all(int fd, const std::string& path, const std::string& bytes) {
  const char* p = bytes.data();
  std::size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw DataError(path, "cannot write checkpoint: " + errno_text());
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path, "cannot open checkpoint: " + errno_text());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Reads and verifies the bytes of a checkpoint file.
std::string read_verified(const std::string& path) {
  std::string bytes = read_whole_file(path);
  std::smatch match;
  const std::string name = fs::path(path).filename().string();
  if (std::regex_match(name, match, kCheckpointName)) {
    char expected[9];
    std::snprintf(expected, sizeof expected, "%08x", crc32_of(bytes));
    if (match[2].str() != expected) {
      throw DataError(path, "checkpoint is damaged: CRC-32 of its " + std::to_string(bytes.size()) +
                                " bytes is " + expected + ", its name says " + match[2].str());
    }
  }
  return bytes;
}

int64_t read_int(torch::serialize::InputArchive& archive, const std::string& key) {
  c10::IValue value;
  archive.read(key, value);
  return value.toInt();
}

// A field that older checkpoints lack.
int64_t read_int_or(torch::serialize::InputArchive& archive, const std::string& key,
                    int64_t fallback) {
  c10::IValue value;
  return archive.try_read(key, value) ? value.toInt() : fallback;
}

std::string read_string(torch::serialize::InputArchive& archive, const std::string& key) {
  c10::IValue value;
  archive.read(key, value);
  return value.toStringRef();
}

CheckpointMeta read_meta(torch::serialize::InputArchive& archive) {
  CheckpointMeta meta;
  const int64_t version = read_int(archive, "format");
  if (version != kFormatVersion) {
    throw Error("checkpoint format " + std::to_string(version) + ", this build reads " +
                std::to_string(kFormatVersion));
  }
  meta.model.name = read_string(archive, "model_name");
  meta.model.in_channels = read_int(archive, "model_in_channels");
  meta.model.height = read_int(archive, "model_height");
  meta.model.width = read_int(archive, "model_width");
  meta.model.num_classes = read_int(archive, "model_num_classes");
  const std::string names = read_string(archive, "class_names");
  std::size_t start = 0;
  while (start < names.size()) {
    const auto end = names.find('\n', start);
    meta.class_names.push_back(names.substr(start, end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  meta.epoch = read_int(archive, "epoch");
  meta.batch_in_epoch = read_int(archive, "batch_in_epoch");
  meta.global_step = read_int(archive, "global_step");
  meta.world_size = static_cast<int>(read_int(archive, "world_size"));
  meta.seed = static_cast<uint64_t>(read_int(archive, "seed"));
  meta.epoch_offset = read_int_or(archive, "epoch_offset", 0);
  meta.reference_world_size =
      static_cast<int>(read_int_or(archive, "reference_world_size", meta.world_size));
  return meta;
}

}  // namespace

std::string serialize_checkpoint(const Checkpoint& checkpoint, const torch::nn::Module& model,
                                 const torch::optim::Optimizer* optimizer) {
  const CheckpointMeta& m = checkpoint.meta;
  torch::serialize::OutputArchive archive;
  archive.write("format", c10::IValue(kFormatVersion));
  archive.write("model_name", c10::IValue(m.model.name));
  archive.write("model_in_channels", c10::IValue(m.model.in_channels));
  archive.write("model_height", c10::IValue(m.model.height));
  archive.write("model_width", c10::IValue(m.model.width));
  archive.write("model_num_classes", c10::IValue(m.model.num_classes));
  std::string names;
  for (std::size_t i = 0; i < m.class_names.size(); ++i) {
    names += (i ? "\n" : "") + m.class_names[i];
  }
  archive.write("class_names", c10::IValue(names));
  archive.write("epoch", c10::IValue(m.epoch));
  archive.write("batch_in_epoch", c10::IValue(m.batch_in_epoch));
  archive.write("global_step", c10::IValue(m.global_step));
  archive.write("world_size", c10::IValue(static_cast<int64_t>(m.world_size)));
  archive.write("seed", c10::IValue(static_cast<int64_t>(m.seed)));
  archive.write("epoch_offset", c10::IValue(m.epoch_offset));
  archive.write("reference_world_size", c10::IValue(static_cast<int64_t>(m.reference_world_size)));
  if (checkpoint.rng_states.defined()) archive.write("rng_states", checkpoint.rng_states);

  torch::serialize::OutputArchive model_archive;
  model.save(model_archive);
  archive.write("model", model_archive);
  if (optimizer) {
    torch::serialize::OutputArchive optimizer_archive;
    optimizer->save(optimizer_archive);
    archive.write("optimizer", optimizer_archive);
  }
  std::string bytes;
  archive.save_to([&bytes](const void* data, size_t size) -> size_t {
    bytes.append(static_cast<const char*>(data), size);
    return size;
  });
  return bytes;
}

Checkpoint load_checkpoint(const std::string& path, torch::nn::Module* model,
                           torch::optim::Optimizer* optimizer) {
  return load_checkpoint_bytes(read_verified(path), path, model, optimizer);
}

std::string read_checkpoint_bytes(const std::string& path) { return read_verified(path); }

Checkpoint load_checkpoint_bytes(const std::string& bytes, const std::string& origin,
                                 torch::nn::Module* model, torch::optim::Optimizer* optimizer) {
  Checkpoint checkpoint;
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(bytes.data(), bytes.size());
    checkpoint.meta = read_meta(archive);
    archive.try_read("rng_states", checkpoint.rng_states);
    if (model) {
      torch::serialize::InputArchive model_archive;
      archive.read("model", model_archive);
      model->load(model_archive);
    }
    if (optimizer) {
      torch::serialize::InputArchive optimizer_archive;
      if (!archive.try_read("optimizer", optimizer_archive)) {
        throw Error("it holds no optimizer state");
      }
      optimizer->load(optimizer_archive);
    }
  } catch (const DataError&) {
    throw;
  } catch (const std::exception& e) {
    std::string cause = e.what();
    cause = cause.substr(0, cause.find('\n'));
    throw DataError(origin, "cannot load checkpoint: " + cause +
                                " (written for another model or by another version?)");
  }
  return checkpoint;
}

CheckpointMeta read_checkpoint_meta(const std::string& path) {
  return load_checkpoint(path, nullptr, nullptr).meta;
}

std::shared_ptr<models::Classifier> load_model(const std::string& path, CheckpointMeta* meta) {
  CheckpointMeta found = read_checkpoint_meta(path);
  auto model = models::create_model(found.model);
  load_checkpoint(path, model.get(), nullptr);
  if (meta) *meta = std::move(found);
  return model;
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  const fs::path target(path);
  const std::string dir = target.parent_path().empty() ? "." : target.parent_path().string();
  const std::string temp =
      dir + "/." + target.filename().string() + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw DataError(temp, "cannot create checkpoint: " + errno_text());
  // Held until the file is renamed or this process ends: another writer's clean-up of dead
  // writers' leftovers (CheckpointDirectory::save) leaves the file alone meanwhile.
  ::flock(fd, LOCK_EX);
  try {
    write_all(fd, temp, bytes);
    if (::fsync(fd) != 0) throw DataError(temp, "cannot fsync checkpoint: " + errno_text());
  } catch (...) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string cause = errno_text();
    ::unlink(temp.c_str());
    throw DataError(path, "cannot rename checkpoint into place: " + cause);
  }
  fsync_directory(dir);
}

CheckpointDirectory::CheckpointDirectory(std::string dir, int keep)
    : dir_(std::move(dir)), keep_(std::max(keep, 1)) {}

std::string CheckpointDirectory::save(int64_t step, const std::string& bytes) {
  std::error_code error;
  fs::create_directories(dir_, error);
  if (error) throw DataError(dir_, "cannot create checkpoint directory: " + error.message());
  char name[64];
  std::snprintf(name, sizeof name, "checkpoint-%010lld-%08x.pt", static_cast<long long>(step),
                crc32_of(bytes));
  const std::string path = dir_ + "/" + name;
  write_file_atomically(path, bytes);

  const auto all = list();
  for (std::size_t i = static_cast<std::size_t>(keep_); i < all.size(); ++i) {
    fs::remove(all[i], error);
  }
  remove_dead_writers_files();
  return path;
}

void CheckpointDirectory::remove_dead_writers_files() const {
  // Temporary files of writers killed mid-write (never under a checkpoint's name). Another
  // writer may be writing into this folder right now (the last words of a world cut off from
  // this one, on a shared volume): its file is locked, or too new to have been locked yet.
  std::error_code error;
  const auto settled = fs::file_time_type::clock::now() - std::chrono::seconds(2);
  for (const auto& entry : fs::directory_iterator(dir_, error)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind(".checkpoint-", 0) != 0 || file.find(".tmp-") == std::string::npos) continue;
    if (fs::last_write_time(entry.path(), error) > settled || error) continue;
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) fs::remove(entry.path(), error);
    ::close(fd);
  }
}

std::vector<std::string> CheckpointDirectory::list() const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir_, error)) {
    const std::string file = entry.path().filename().string();
    std::smatch match;
    if (std::regex_match(file, match, kCheckpointName)) {
      found.emplace_back(std::stoll(match[1].str()), entry.path().string());
    }
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a > b; });
  std::vector<std::string> paths;
  for (auto& f : found) paths.push_back(std::move(f.second));
  return paths;
}

std::optional<int64_t> CheckpointDirectory::step_of(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  std::smatch match;
  if (!std::regex_match(name, match, kCheckpointName)) return std::nullopt;
  return std::stoll(match[1].str());
}

std::optional<std::string> CheckpointDirectory::latest_valid() const {
  for (const auto& path : list()) {
    try {
      read_checkpoint_meta(path);
      return path;
    } catch (const DataError& e) {
      log::warn("skipping checkpoint: {}", e.what());
    }
  }
  return std::nullopt;
}

}  // namespace ddp::train
