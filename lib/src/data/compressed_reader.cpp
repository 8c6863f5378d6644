#include "data/compressed_reader.h"

#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include <zlib.h>

#include "ddp/error.h"

namespace ddp::data::detail {
namespace {

gzFile as_gz(void* file) { return static_cast<gzFile>(file); }

}  // namespace

CompressedReader::CompressedReader(std::string path) : path_(std::move(path)) {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) {
    throw DataError(path_, std::string("cannot open: ") + std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) throw DataError(path_, "cannot open: is a directory, expected a file");
  gzFile file = gzopen(path_.c_str(), "rb");
  if (file == nullptr) {
    throw DataError(path_, std::string("cannot open: ") +
                               (errno != 0 ? std::strerror(errno) : "out of memory"));
  }
  // Large buffers: zlib's default 8 KiB makes inflate call read() 6,000 times for MNIST.
  gzbuffer(file, 1 << 20);
  file_ = file;
  // gzdirect() is only meaningful after the first read; peek one byte to decide.
  int c = gzgetc(file);
  if (c != -1) gzungetc(c, file);
  compressed_ = gzdirect(file) == 0;
}

CompressedReader::~CompressedReader() {
  if (file_ != nullptr) gzclose(as_gz(file_));
}

std::size_t CompressedReader::read(void* dst, std::size_t n) {
  auto* out = static_cast<unsigned char*>(dst);
  std::size_t done = 0;
  while (done < n) {
    const auto chunk = static_cast<unsigned>(std::min<std::size_t>(n - done, INT_MAX / 2));
    const int got = gzread(as_gz(file_), out + done, chunk);
    if (got < 0) {
      int code = 0;
      const char* message = gzerror(as_gz(file_), &code);
      throw DataError(path_, "corrupt gzip data after " + std::to_string(position_ + done) +
                                 " decompressed bytes: " + (message ? message : "unknown error"));
    }
    if (got == 0) {
      int code = 0;
      const char* message = gzerror(as_gz(file_), &code);
      if (code != Z_OK) {
        throw DataError(path_, "gzip stream ends early after " + std::to_string(position_ + done) +
                                   " decompressed bytes: " + (message ? message : "truncated"));
      }
      break;
    }
    done += static_cast<std::size_t>(got);
  }
  position_ += done;
  return done;
}

}  // namespace ddp::data::detail
